"""Comparisons that hold on every CPU: errors measured against the scale of the reference tensor.

An elementwise `rtol`/`atol` pair tuned on one machine fails on another whose kernels (AVX-512, AVX2,
the scalar fallback, BLAS blocking, thread count) sum in another order: the rounding error of a sum
is proportional to the size of its terms, not to the size of the one entry that happens to cancel to
almost 0. So the tests compare a float32 result with a reference (computed in float64 where the code
can run in float64) and bound the largest error by `rel` times the largest magnitude of the reference.

Budgets, in units of the float32 unit roundoff EPS32 = 2^-23 ~ 1.2e-7: an elementwise formula is off by
a few EPS32; a sum of n float32 terms by at most ~n EPS32 of the sum of their magnitudes (typically
~sqrt(n) EPS32). Each test states the budget its `rel` allows; a real bug (a wrong index, a missing
term, a wrong sign) is off by a large fraction of the scale, far above any of them.
"""

from __future__ import annotations

import torch
from torch import Tensor

EPS32 = torch.finfo(torch.float32).eps  # 2^-23 ~ 1.19e-7
EPS_BF16 = torch.finfo(torch.bfloat16).eps  # 2^-7 ~ 7.8e-3
TINY = 1e-30  # the scale of an all-zero reference: any nonzero error fails


def scale_of(t: Tensor) -> float:
    """max |t| over the finite entries (0 when there is none): the scale a tolerance is relative to."""
    finite = t.detach()[torch.isfinite(t.detach())]
    return float(finite.abs().max()) if finite.numel() else 0.0


def scale_error(actual: Tensor, expected: Tensor) -> tuple[float, float]:
    """(max |actual - expected|, max |expected|) over the finite entries, computed in float64."""
    a, e = actual.detach().to(torch.float64), expected.detach().to(torch.float64)
    finite = torch.isfinite(e)
    if not finite.any():
        return 0.0, 0.0
    return float((a - e)[finite].abs().max()), float(e[finite].abs().max())


def assert_close_to_scale(actual: Tensor, expected: Tensor, rel: float, msg: str = "") -> None:
    """Assert max|actual - expected| <= rel * max(max|expected|, TINY), over the whole tensor.

    Shapes must be equal; dtypes may differ (a float32 or bfloat16 result against a float64
    reference). Non-finite entries (-inf of a causal mask) must match exactly, and NaN fails.
    """
    assert rel > 0, f"rel={rel}: use an exact comparison instead"
    assert actual.shape == expected.shape, f"{msg}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a, e = actual.detach().to(torch.float64), expected.detach().to(torch.float64)
    assert not a.isnan().any() and not e.isnan().any(), f"{msg}: NaN in the result or the reference"
    finite = torch.isfinite(e)
    assert torch.equal(torch.isfinite(a), finite) and torch.equal(a[~finite], e[~finite]), (
        f"{msg}: the infinite entries differ"
    )
    error, magnitude = scale_error(a, e)
    scale = max(magnitude, TINY)
    assert error <= rel * scale, (
        f"{msg}{': ' if msg else ''}max |actual - expected| = {error:.3e}, scale max |expected| = "
        f"{magnitude:.3e}, ratio {error / scale:.3e} > rel = {rel:.1e} ({error / scale / EPS32:.1f} x EPS32)"
    )
