"""RoPE (Su et al., 2021): rotate each (q, k) channel pair by angle p * base^(-2i/D).

Applied over the first `rotary_dim` channels of each head (the full head dimension by default). The
cos/sin table is cached and grown to the largest position seen; it is indexed by position value, so
offset positions are honoured.
"""

import torch
from torch import Tensor

from posab.encodings.base import Dims, Encoding, Positions
from posab.errors import ConfigError


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
        self.cos_cached = torch.cat([angles.cos(), angles.cos()], dim=-1).float()  # (P, R)
        # the sign of rotate_half is folded into the table: rotate_half(x) * sin == roll(x) * signed_sin
        self.sin_cached = torch.cat([-angles.sin(), angles.sin()], dim=-1).float()  # (P, R)

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
        # x * cos + rotate_half(x) * sin, with rotate_half(x) = (-x2, x1) = roll(x) * (-1, +1)
        rotated = torch.addcmul(rot * cos.to(x.dtype), rot.roll(r // 2, dims=-1), sin.to(x.dtype))
        return torch.cat([rotated, rest], dim=-1) if rest.shape[-1] else rotated
