"""p-RoPE (Barbero et al., ICLR 2025; conf/encoding/p_rope.yaml): RoPE with its lowest frequencies set to 0.
Against the paper's definition written out in float64 (the kept frequencies RoPE's own, the removed
channels left as they are), forward and gradient; p = 1 is RoPE; the context extensions keep the removed
frequencies at 0; bad fractions name the valid range. (The shared suite runs p_rope as every encoding.)"""

from __future__ import annotations

import pytest
import torch

from conftest import typed_config
from posab.encodings import Dims, Positions
from posab.encodings.rope import RoPE
from posab.errors import ConfigError
from tolerances import assert_close_to_scale

DIMS = Dims(d_model=64, n_heads=2, train_len=64)  # head_dim 32: 16 frequencies


def paper_rotation(
    x: torch.Tensor, positions: torch.Tensor, fraction: float, base: float = 1e4
) -> torch.Tensor:
    """x (.., T, D) rotated as the paper's `apply_p_rope` defines it, in float64: int(p D / 2) angles at
    position * base^(-2c/D), c = 0 .. kept - 1, and the remaining channel pairs (c, c + D/2) unrotated."""
    half = x.shape[-1] // 2
    kept = int(fraction * x.shape[-1] // 2)
    frequencies = [base ** (-2 * c / x.shape[-1]) if c < kept else 0.0 for c in range(half)]
    angles = positions.double()[:, None] * torch.tensor(frequencies, dtype=torch.float64)  # (T, D/2)
    first, second = x.double()[..., :half], x.double()[..., half:]
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


@pytest.mark.parametrize("fraction", [0.25, 0.75, 1.0])
def test_p_rope_is_the_papers_rotation_forward_and_backward(fraction: float) -> None:
    rope = RoPE(DIMS, fraction=fraction)
    generator = torch.Generator().manual_seed(0)
    qk = torch.randn(2, 1, 2, 300, 32, generator=generator, requires_grad=True)  # q and k: (1, H, T, D)
    weights = torch.randn(2, 1, 2, 300, 32, generator=generator, dtype=torch.float64)
    got = rope.rotate(qk[0], qk[1], Positions.build(300))
    sum((g.double() * w).sum() for g, w in zip(got, weights, strict=True)).backward()
    leaf = qk.detach().double().requires_grad_()
    want = [paper_rotation(leaf[i], torch.arange(300), fraction) for i in (0, 1)]
    sum((w_ * w).sum() for w_, w in zip(want, weights, strict=True)).backward()
    for got_one, want_one in zip(got, want, strict=True):
        assert_close_to_scale(got_one, want_one, rel=1e-5)
    assert qk.grad is not None and leaf.grad is not None
    assert_close_to_scale(qk.grad, leaf.grad, rel=1e-5)


def test_the_removed_channels_are_not_rotated_and_the_kept_ones_are_ropes() -> None:
    p_rope, rope = RoPE(DIMS, fraction=0.75), RoPE(DIMS)
    x = torch.randn(1, 2, 50, 32)
    (pq, _), (rq, _) = p_rope.rotate(x, x, Positions.build(50)), rope.rotate(x, x, Positions.build(50))
    kept = [*range(12), *range(16, 28)]  # the pairs (c, c + 16) of the 12 highest frequencies
    removed = [*range(12, 16), *range(28, 32)]
    assert torch.equal(pq[..., kept], rq[..., kept])
    assert torch.equal(pq[..., removed], x[..., removed])
    assert not torch.equal(rq[..., removed], x[..., removed])  # RoPE rotates them


def test_p_one_is_rope_and_the_extensions_keep_the_removed_frequencies_at_zero() -> None:
    assert torch.equal(RoPE(DIMS, fraction=1.0).inv_freq, RoPE(DIMS).inv_freq)
    p_rope = RoPE(DIMS, fraction=0.5)
    for kind in ("pi", "ntk", "yarn"):
        with p_rope.variant(kind, 4.0):
            assert torch.equal(p_rope.inv_freq[8:], torch.zeros(8, dtype=torch.float64)), kind
            assert bool((p_rope.inv_freq[:8] > 0).all()), kind
    assert typed_config(["encoding=p_rope"]).encoding["fraction"] == 0.75


@pytest.mark.parametrize("fraction", [0.0, 1.5, -0.5, True, 0.05])
def test_a_bad_fraction_names_the_valid_range(fraction: float) -> None:
    with pytest.raises(ConfigError, match=r"rope fraction=.* in \(0, 1\], keeping at least one of 16"):
        RoPE(DIMS, fraction=fraction)
