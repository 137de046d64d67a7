"""ALiBi (Press et al., 2022): bias -m_h * (i - j), no position embedding.

Slopes m_h = 2^(-8h/n) for n a power of two; otherwise the slopes of the largest power of two p < n,
followed by every other slope of the 2p set, as in the reference implementation.
"""

import math

import torch
from torch import Tensor

from posab.encodings.base import Dims, Encoding, Kind, Positions
from posab.forms import Form


def alibi_slopes(n_heads: int) -> Tensor:
    """(H,) head slopes, steepest first."""

    def power_of_two_slopes(n: int) -> list[float]:
        return [2 ** (-8 * (h + 1) / n) for h in range(n)]

    p = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two_slopes(p)
    if p < n_heads:
        slopes += power_of_two_slopes(2 * p)[0::2][: n_heads - p]
    return torch.tensor(slopes, dtype=torch.float32)


class ALiBi(Encoding):
    kind = Kind.DISTANCE_BIAS
    relative_only = True
    static_form = True

    def __init__(self, dims: Dims) -> None:
        super().__init__(dims)
        self.register_buffer("slopes", alibi_slopes(dims.n_heads), persistent=False)  # (H,)

    def attention_form(self, pos: Positions, queries: int, dtype: torch.dtype) -> Form:
        return self.distance_form(pos, queries, dtype)

    def distance_bias(self, distance: Tensor) -> Tensor:
        """(D,) query-minus-key distances -> (H, D) the bias -m_h * d (the extrapolation audit reads it)."""
        return -self.slopes[:, None] * distance[None, :]
