"""RoPE (Su et al., 2021): rotate each (q, k) channel pair by angle p * base^(-2i/D).

Applied over the first `rotary_dim` channels of each head (the full head dimension by default). The
cos/sin table is cached and grown to the largest position seen; it is indexed by position value, so
offset positions are honoured.
"""

import torch
from torch import Tensor

from posab.encodings.base import Dims, Encoding, Positions
from posab.errors import ConfigError


def rotate_half(x: Tensor) -> Tensor:
    """(.., D) -> (.., D): (x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class RoPE(Encoding):
    relative_only = True  # up to floating-point rounding of the angles

    def __init__(self, dims: Dims, base: float = 10000.0, rotary_dim: int | None = None) -> None:
        super().__init__(dims)
        self.rotary_dim = dims.head_dim if rotary_dim is None else rotary_dim
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= dims.head_dim:
            raise ConfigError(
                f"rope needs an even rotary dimension in (0, head_dim={dims.head_dim}], got {self.rotary_dim}"
                " (head_dim = model.d_model / model.n_heads)"
            )
        exponents = torch.arange(0, self.rotary_dim, 2, dtype=torch.float64) / self.rotary_dim
        self.register_buffer("inv_freq", base**-exponents, persistent=False)  # (R/2,)
        self.register_buffer("cos_cached", torch.empty(0, self.rotary_dim), persistent=False)
        self.register_buffer("sin_cached", torch.empty(0, self.rotary_dim), persistent=False)

    def _grow(self, max_position: int) -> None:
        """Extend the tables to cover positions 0 .. max_position (doubling, to amortise growth)."""
        size = max(max_position + 1, 2 * self.cos_cached.shape[0])
        positions = torch.arange(size, dtype=torch.float64, device=self.inv_freq.device)
        angles = positions[:, None] * self.inv_freq[None, :]  # (P, R/2)
        angles = torch.cat([angles, angles], dim=-1)  # (P, R)
        self.cos_cached = angles.cos().float()
        self.sin_cached = angles.sin().float()

    def tables(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """positions: (T,) non-negative -> cos, sin: (T, R)."""
        max_position = int(positions.max())
        if max_position >= self.cos_cached.shape[0]:
            self._grow(max_position)
        return self.cos_cached[positions], self.sin_cached[positions]

    def rotate(self, q: Tensor, k: Tensor, pos: Positions) -> tuple[Tensor, Tensor]:
        cos, sin = self.tables(pos.token)
        return self._rotated(q, cos, sin), self._rotated(k, cos, sin)

    def _rotated(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """x: (B, H, T, D); cos, sin: (T, R)."""
        r = self.rotary_dim
        rot, rest = x[..., :r], x[..., r:]
        rotated = rot * cos.to(x.dtype) + rotate_half(rot) * sin.to(x.dtype)
        return torch.cat([rotated, rest], dim=-1) if rest.shape[-1] else rotated
