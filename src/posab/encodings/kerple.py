"""KERPLE, logarithmic variant (Chi et al., 2022).

b_h(i, j) = -p_h * ln(1 + a_h * (i - j)) for j <= i, with learned p_h, a_h > 0 per head. Init as in the
paper's reference code (chijames/KERPLE, megatron/mpu/layers.py, `ParallelKerpleLog`): p_h ~ U(0, 2),
a_h ~ U(0, 1), floored at 0.01. `param` is how the free parameters give p and a:

- `clamp` (default), the reference's: p and a are the parameters themselves, so an Adam step moves them by
  up to ~lr. The reference clamps their values to >= 0.01 in place before every use; here `constrain`
  clamps them after every optimizer step (the same projection), and the forward pass reads
  max(raw, 0.01), which equals raw whenever the projection has run.
- `softplus`: p = softplus(raw_p), a = softplus(raw_a), the form every run used before `param` existed.
  A step on raw moves p by sigmoid(raw) times as much: a slope starting at 0.025 reaches ~0.035 in a
  200-step run.

Computed on the 2L-1 distinct distances (future ones clamped to 0, masked anyway), then gathered into the
(H, L, L) Toeplitz matrix.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posab.encodings.base import Dims, Encoding, Kind, Positions
from posab.errors import ConfigError
from posab.forms import Form

FLOOR = 0.01  # the reference code clamps p and a to at least this
PARAMS = ("clamp", "softplus")


def inverse_softplus(y: Tensor) -> Tensor:
    """x with softplus(x) = y, for y > 0."""
    return y + torch.log(-torch.expm1(-y))


class Kerple(Encoding):
    kind = Kind.DISTANCE_BIAS
    relative_only = True
    static_form = True

    def __init__(self, dims: Dims, param: str = "clamp") -> None:
        super().__init__(dims)
        if param not in PARAMS:
            raise ConfigError(f"kerple param={param!r}: use one of {list(PARAMS)}")
        self.param = param
        h = dims.n_heads
        p, a = (2 * torch.rand(h)).clamp(min=FLOOR), torch.rand(h).clamp(min=FLOOR)  # (H,), (H,)
        self.raw_p = nn.Parameter(self.to_raw(p))  # (H,)
        self.raw_a = nn.Parameter(self.to_raw(a))  # (H,)

    def to_raw(self, value: Tensor) -> Tensor:
        """The free parameter that gives `value` (>= FLOOR) in this parametrisation."""
        return value.clone() if self.param == "clamp" else inverse_softplus(value)

    def from_raw(self, raw: Tensor) -> Tensor:
        return raw.clamp(min=FLOOR) if self.param == "clamp" else F.softplus(raw)

    @property
    def p(self) -> Tensor:
        return self.from_raw(self.raw_p)  # (H,)

    @property
    def a(self) -> Tensor:
        return self.from_raw(self.raw_a)  # (H,)

    @torch.no_grad()
    def constrain(self) -> None:
        """The reference's projection: p, a >= FLOOR (the clamp form; softplus needs none)."""
        if self.param == "clamp":
            self.raw_p.clamp_(min=FLOOR)
            self.raw_a.clamp_(min=FLOOR)

    def attention_form(self, pos: Positions, queries: int, dtype: torch.dtype) -> Form:
        return self.distance_form(pos, queries, dtype)

    def distance_bias(self, distance: Tensor) -> Tensor:
        """(D,) query-minus-key distances -> (H, D) the bias -p_h ln(1 + a_h d), future distances clamped to
        0 (read by the extrapolation audit)."""
        d = distance.clamp(min=0)  # (D,), future -> 0
        return -self.p[:, None] * torch.log1p(self.a[:, None] * d[None, :])  # (H, D)
