"""KERPLE, logarithmic variant (Chi et al., 2022).

b_h(i, j) = -p_h * ln(1 + a_h * (i - j)) for j <= i, with learned p_h, a_h > 0 per head, each the softplus
of a free parameter. Init as in the paper's reference code: p_h ~ U(0, 2), a_h ~ U(0, 1), floored at
0.01 (the code's clamp). Computed on the 2L-1 distinct distances (future ones clamped to 0, masked
anyway), then gathered into the (H, L, L) Toeplitz matrix.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posab.encodings.base import Dims, Encoding, Positions, distances, toeplitz

FLOOR = 0.01  # the reference code clamps p and a to at least this


def inverse_softplus(y: Tensor) -> Tensor:
    """x with softplus(x) = y, for y > 0."""
    return y + torch.log(-torch.expm1(-y))


class Kerple(Encoding):
    relative_only = True
    static_bias = True

    def __init__(self, dims: Dims) -> None:
        super().__init__(dims)
        h = dims.n_heads
        self.raw_p = nn.Parameter(inverse_softplus((2 * torch.rand(h)).clamp(min=FLOOR)))  # (H,)
        self.raw_a = nn.Parameter(inverse_softplus(torch.rand(h).clamp(min=FLOOR)))  # (H,)

    @property
    def p(self) -> Tensor:
        return F.softplus(self.raw_p)  # (H,)

    @property
    def a(self) -> Tensor:
        return F.softplus(self.raw_a)  # (H,)

    def bias(self, pos: Positions) -> Tensor:
        d = distances(pos.length, self.raw_p.device).clamp(min=0)  # (2L-1,), future -> 0
        table = -self.p[:, None] * torch.log1p(self.a[:, None] * d[None, :])  # (H, 2L-1)
        return toeplitz(table, pos.length)[None]  # (1, H, L, L)
