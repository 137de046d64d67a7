"""xPos (Sun et al., 2022, "A Length-Extrapolatable Transformer", arXiv:2212.10554): RoPE whose rotated
pairs are also scaled, so that attention decays with distance in the fast-rotating pairs.

With R = rotary_dim, pair c = 0 .. R/2 - 1 (channels c and c + R/2, RoPE's layout here) and

    zeta_c = (2c + gamma R) / ((1 + gamma) R),   gamma = 0.4   (the paper's Sec. 3.2; zeta in [2/7, 1)),

the query at position n is RoPE's rotation scaled by zeta_c^((n - centre) / scale_base), the key at m by
zeta_c^(-(m - centre) / scale_base), so that q_n . k_m carries zeta_c^((n - m) / scale_base): a function
of n - m alone, whatever the centre (it cancels). scale_base = 512, gamma = 0.4 and the frequencies
base^(-2c/R) are the reference code's (github.com/microsoft/torchscale,
torchscale/component/xpos_relative_position.py: `XPOS(head_dim, scale_base=512)`, `scale = (arange(0,
head_dim, 2) + 0.4 * head_dim) / (1.4 * head_dim)`, `fixed_pos_embedding`'s 10000^(-c / (head_dim/2))),
which rotates interleaved pairs (2c, 2c + 1): the same map up to a fixed permutation of the q and k
channels, which the learned projections absorb (tests/test_xpos.py checks it exactly).

The centre. The reference centres the exponents on the middle of the current sequence
(`min_pos = -(length + offset) // 2`), which moves with the length. That is harmless there because its
cache keeps keys unrotated and rescales every key at every step; posab's cache keeps rotated keys, so a
moving centre would scale the cached keys by one centre and the new queries by another, and the product
would no longer depend on n - m alone. The centre here is fixed at ceil(train_len / 2): the reference's
centre for a window of the training length starting at 0, so the training-time scales are the
reference's exactly, and q_n . k_m depends on n - m alone in a full pass and in every decoding step.

Range. zeta_0 = 2/7 (ln = -1.25) is the smallest factor: d positions from the centre the scales reach
zeta_0^(+-d/512) = e^(-+1.25 d/512). At 8x the training length (a window 0 .. 4095, centre 256, d <= 3839):
8.3e-5 and 1.2e4; at the shift evaluator's largest position, 4,607 (d = 4351): 2.4e-5 and 4.2e4. That is
far inside float32's and bfloat16's exponent range (~e^+-88, reached ~36,000 positions from the centre),
and every factor is rounded relative to itself (float64 tables cast once), so the logits keep float32's
or bfloat16's relative precision. float16 (max 65,504) would overflow a key's scale alone ~4,500 positions
from the centre; the reference's moving centre keeps d <= L/2 (6.7e-3 .. 150 at L = 4,096) and would
protect float16, but only a length-dependent centre does that, and cached decoding cannot have one.

The paper's blockwise causal attention at inference (its Sec. 3.3) is not part of the encoding (the
nearest here is `model.window`); RoPE's context extensions (`variants`) are not offered: they rescale the
rotation alone, which xPos's scales were not trained with.
"""

import torch
from torch import Tensor

from posab.encodings.base import Dims, Encoding, Kind, Positions
from posab.encodings.rope import RoPE
from posab.errors import ConfigError


def xpos_zeta(rotary_dim: int, gamma: float) -> Tensor:
    """zeta_c = (2c + gamma R) / ((1 + gamma) R), c = 0 .. R/2 - 1: (R/2,) float64."""
    pairs = torch.arange(0, rotary_dim, 2, dtype=torch.float64)
    return (pairs + gamma * rotary_dim) / ((1 + gamma) * rotary_dim)


class XPos(Encoding):
    kind = Kind.ROTARY
    relative_only = True  # up to float rounding of the angles and the scales (the centre cancels)

    def __init__(
        self,
        dims: Dims,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        scale_base: float = 512.0,
        gamma: float = 0.4,
    ) -> None:
        super().__init__(dims)
        if scale_base <= 0 or gamma <= 0:
            raise ConfigError(
                f"xpos scale_base={scale_base}, gamma={gamma}: both must be > 0 (reference: 512 and 0.4)"
            )
        self.rope = RoPE(dims, base, rotary_dim)  # the rotation, RoPE's numbers unchanged
        self.scale_base = scale_base
        self.centre = (dims.train_len + 1) // 2  # ceil(L / 2): the reference's centre at the training length
        zeta = xpos_zeta(self.rope.rotary_dim, gamma)
        self.register_buffer("log_zeta", zeta.log(), persistent=False)  # (R/2,) float64
        self.register_buffer("up_cached", torch.empty(0, self.rope.rotary_dim), persistent=False)
        self.register_buffer("down_cached", torch.empty(0, self.rope.rotary_dim), persistent=False)

    def _grow(self, max_position: int) -> None:
        """Extend the scale tables to positions 0 .. max_position (doubling, to amortise growth)."""
        size = max(max_position + 1, 2 * self.up_cached.shape[0])
        positions = torch.arange(size, dtype=torch.float64, device=self.log_zeta.device)
        exponents = (positions - self.centre)[:, None] / self.scale_base  # (P, 1)
        log_scale = exponents * self.log_zeta[None, :]  # (P, R/2): ln zeta_c^((p - centre) / scale_base)
        up, down = log_scale.exp(), (-log_scale).exp()  # (P, R/2) each, float64
        self.up_cached = torch.cat([up, up], dim=-1).float()  # (P, R): pair c in channels c and c + R/2
        self.down_cached = torch.cat([down, down], dim=-1).float()  # (P, R)

    def scales(self, positions: Tensor, max_position: int) -> tuple[Tensor, Tensor]:
        """positions: (T,), the largest `max_position` -> the query and key scales: 2 x (T, R)."""
        if max_position >= self.up_cached.shape[0]:
            self._grow(max_position)
        return self.up_cached[positions], self.down_cached[positions]

    def rotate(self, q: Tensor, k: Tensor, pos: Positions, layer: int = 0) -> tuple[Tensor, Tensor]:
        q, k = self.rope.rotate(q, k, pos, layer)
        up, down = self.scales(pos.token, pos.last)
        return _scaled(q, up), _scaled(k, down)


def _scaled(x: Tensor, scale: Tensor) -> Tensor:
    """x: (B, H, T, D) with its first R channels times scale: (T, R)."""
    r = scale.shape[-1]
    if r == x.shape[-1]:
        return x * scale.to(x.dtype)
    return torch.cat([x[..., :r] * scale.to(x.dtype), x[..., r:]], dim=-1)
