"""xPos (posab.encodings.xpos): the scaled rotation against its formula in float64, forward and gradients,
the reference code's layout and centre, relative invariance, and why the centre is fixed (cached decoding).
The shared suite runs it too (tests/test_encodings.py, tests/test_cache_equivalence.py, ...)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from posab.encodings import Dims, Positions
from posab.encodings.rope import RoPE
from posab.encodings.xpos import XPos, xpos_zeta
from posab.errors import ConfigError
from tolerances import EPS32, assert_close_to_scale

TRAIN_LEN, HEADS, DIM = 512, 2, 16
SCALE_BASE = 512.0


def leaves(length: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """float64 q, k: (1, H, T, D) that require gradients."""
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, HEADS, length, DIM, generator=g, dtype=torch.float64) for _ in range(2))
    return q.requires_grad_(), k.requires_grad_()


def formula_scores(q: Tensor, k: Tensor, positions: Tensor, rotary_dim: int) -> Tensor:
    """The paper's q_n . k_m, all pairs, float64: per RoPE pair c (channels c, c + R/2) the rotation by
    (n - m) theta_c times zeta_c^((n - m) / 512); the channels past R unrotated. (1, H, T, T)."""
    r, half = rotary_dim, rotary_dim // 2
    theta = 10000.0 ** -(torch.arange(half, dtype=torch.float64) * 2 / r)  # (R/2,)
    zeta = (torch.arange(half, dtype=torch.float64) * 2 + 0.4 * r) / (1.4 * r)  # (R/2,)
    delta = (positions[:, None] - positions[None, :]).double()  # (T, T): n - m
    angle = delta[..., None] * theta  # (T, T, R/2)
    decay = zeta ** (delta[..., None] / SCALE_BASE)  # (T, T, R/2)
    qa, qb, ka, kb = q[..., :half], q[..., half:r], k[..., :half], k[..., half:r]  # (1, H, T, R/2) each
    # Re[(qa + i qb) (ka - i kb) e^{i angle}]: the real part of q's pair times k's conjugate, rotated
    real = qa[..., :, None, :] * ka[..., None, :, :] + qb[..., :, None, :] * kb[..., None, :, :]
    imag = qb[..., :, None, :] * ka[..., None, :, :] - qa[..., :, None, :] * kb[..., None, :, :]
    pairs = ((real * angle.cos() - imag * angle.sin()) * decay).sum(-1)  # (1, H, T, T)
    return pairs + q[..., r:] @ k[..., r:].transpose(-1, -2)


def encoding_scores(enc: XPos, q: Tensor, k: Tensor, pos: Positions) -> Tensor:
    """q_n . k_m of the encoding's rotated float32 q and k: (1, H, T, T)."""
    q32, k32 = enc.rotate(q.float(), k.float(), pos)
    return q32 @ k32.transpose(-1, -2)


def lower(scores: Tensor) -> Tensor:
    """The causal pairs m <= n (the rest set to 0: a key after its query is never scored)."""
    return scores.tril()


@pytest.mark.parametrize("rotary_dim", [None, 8])
@pytest.mark.parametrize(("offset", "step"), [(0, 1), (1000, 1), (0, 8), (0, 64)])
def test_scores_equal_the_formula_forward_and_backward(
    rotary_dim: int | None, offset: int, step: int
) -> None:
    """q_n . k_m of the rotated, scaled q and k (float32 tables) against the formula in float64 over 64
    positions (contiguous, at offset 1000, every 8th up to 504 and every 64th up to 4,032: scales to
    zeta_0^(+-7.4), as at 8x the training length), and the gradients of a
    weighted sum with respect to q and k. Budget: float64 tables cast once to float32 (1 EPS32 per factor:
    cos, sin, scale), products and sums of 16 terms: observed <= 2.5 EPS32 of the scale; 1e-5 = 84 EPS32,
    while a wrong pair, centre sign or zeta is off by ~1e-1."""
    enc = XPos(Dims(HEADS * DIM, HEADS, TRAIN_LEN), rotary_dim=rotary_dim)
    positions = offset + step * torch.arange(64)
    pos = Positions(positions, offset, largest=int(positions[-1]))
    q, k = leaves(64)
    weights = torch.randn(1, HEADS, 64, 64, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    expected = lower(formula_scores(q, k, positions, enc.rope.rotary_dim))
    (expected * weights).sum().backward()
    slow = [expected.detach(), q.grad, k.grad]
    q.grad = k.grad = None
    actual = lower(encoding_scores(enc, q, k, pos))
    (actual * weights).sum().backward()
    for name, fast, reference in zip(["scores", "dq", "dk"], [actual, q.grad, k.grad], slow, strict=True):
        assert_close_to_scale(fast, reference, rel=1e-5, msg=name)


def reference_layout(x: Tensor, length: int, key: bool) -> Tensor:
    """The reference code's map on a window of `length` tokens at positions 0 .. length-1, written from its
    formula (torchscale's xpos_relative_position.py): interleaved pairs (2c, 2c + 1), angle r theta_c for
    row r, scale zeta_c^((r + min_pos) / 512) with min_pos = -(length) // 2 (the centre of the window),
    inverted for keys. x: (T, D) float64 -> (T, D)."""
    d = x.shape[-1]
    theta = 10000.0 ** -(torch.arange(d // 2, dtype=torch.float64) / (d // 2))  # (D/2,)
    rows = torch.arange(length, dtype=torch.float64)
    angle = rows[:, None] * theta  # (T, D/2)
    scale = xpos_zeta(d, 0.4) ** ((rows[:, None] + (-length // 2)) / SCALE_BASE)  # (T, D/2)
    scale = 1 / scale if key else scale
    even, odd = x[:, 0::2], x[:, 1::2]  # (T, D/2) each
    out_even = (even * angle.cos() - odd * angle.sin()) * scale
    out_odd = (odd * angle.cos() + even * angle.sin()) * scale
    return torch.stack([out_even, out_odd], dim=-1).flatten(1)  # (T, D/2, 2) -> (T, D)


@pytest.mark.parametrize("train_len", [TRAIN_LEN, 33])
def test_at_the_training_length_q_and_k_are_the_reference_code_s_up_to_the_channel_order(
    train_len: int,
) -> None:
    """A window of the training length at 0: the reference's moving centre is then ours, and its map on
    interleaved pairs is ours on RoPE's pairs (c, c + R/2) after the channel permutation 2c <-> c,
    2c + 1 <-> c + R/2 (the learned projections absorb it). float32 tables vs float64, one product and one
    sum per channel: observed < 0.5 EPS32 of the scale; 1e-5 = 84 EPS32, while a swapped pair, a wrong
    frequency or centre is off by ~1e-1 or more."""
    enc = XPos(Dims(HEADS * DIM, HEADS, train_len))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(train_len, DIM, generator=g, dtype=torch.float64)
    to_halves = torch.cat([torch.arange(0, DIM, 2), torch.arange(1, DIM, 2)])  # interleaved -> half-split
    halves = x[:, to_halves][None, None]  # (1, 1, T, D): the same vectors in RoPE's channel order
    ours_q, ours_k = enc.rotate(halves, halves, Positions.build(train_len))
    for ours, key in ((ours_q, False), (ours_k, True)):
        expected = reference_layout(x, train_len, key)[:, to_halves]
        assert_close_to_scale(ours[0, 0], expected, rel=1e-5, msg="k" if key else "q")


def test_at_any_length_the_scores_are_the_reference_code_s_whose_centre_cancels() -> None:
    """At 3x the training length the reference's centre moves to the new window's middle and ours stays:
    the scales differ, the causal scores q_n . k_m do not (the centre cancels in every product): float32
    tables and a sum of 16 terms, 1e-5 = 84 EPS32 as above."""
    length = 3 * 64
    enc = XPos(Dims(HEADS * DIM, HEADS, 64))
    x, y = (
        torch.randn(length, DIM, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
        for s in (2, 3)
    )
    to_halves = torch.cat([torch.arange(0, DIM, 2), torch.arange(1, DIM, 2)])
    reference = reference_layout(x, length, False) @ reference_layout(y, length, True).T  # (T, T)
    q, k = enc.rotate(x[:, to_halves][None, None], y[:, to_halves][None, None], Positions.build(length))
    ours = q[0, 0] @ k[0, 0].T  # (T, T): a dot product is blind to the channel order
    assert not torch.allclose(q[0, 0], reference_layout(x, length, False)[:, to_halves])  # other scales
    assert_close_to_scale(lower(ours), lower(reference), rel=1e-5)


def test_scores_depend_on_the_distance_alone_at_any_offset() -> None:
    """The same q and k at positions 0.. and 1000..: equal causal scores (float32 rounding of the angles
    and scales only, observed ~2 EPS32 of the scale; 1e-5 = 84 EPS32)."""
    enc = XPos(Dims(HEADS * DIM, HEADS, TRAIN_LEN))
    q, k = leaves(48)
    with torch.no_grad():
        near = encoding_scores(enc, q, k, Positions.build(48))
        far = encoding_scores(enc, q, k, Positions.build(48, offset=1000))
    assert_close_to_scale(lower(far), lower(near), rel=1e-5)


def test_the_scales_stay_in_float32_and_bfloat16_range_at_eight_times_the_training_length() -> None:
    """Positions to 8x + the shift evaluator's offset: scales between e^(-1.25 x 8.5) and e^(1.25 x 8.5)
    (zeta_0 = 2/7, 4,351 positions from the centre), finite in bfloat16, each rounded relative to itself."""
    enc = XPos(Dims(HEADS * DIM, HEADS, TRAIN_LEN))
    last = 8 * TRAIN_LEN + TRAIN_LEN - 1
    up, down = enc.scales(torch.arange(last + 1), last)
    bound = (2 / 7) ** (-(last - enc.centre) / SCALE_BASE)
    assert math.isclose(float(down.max()), bound, rel_tol=1e-6) and 4e4 < bound < 5e4
    assert math.isclose(float(up.min()), 1 / bound, rel_tol=1e-6)
    assert torch.isfinite(up.bfloat16()).all() and torch.isfinite(down.bfloat16()).all()
    # every scale and its inverse multiply to 1 (the product q_n . k_n of a token with itself is RoPE's)
    assert_close_to_scale(up * down, torch.ones_like(up), rel=4 * EPS32)


def two_calls(enc: XPos, q: Tensor, k: Tensor, split: int, moving: bool) -> Tensor:
    """Causal scores (1, H, T, T) of keys rotated in two calls, as a cache holds them (positions 0 .. split-1,
    then split .. T-1), against the queries of the second call. `moving`: each call recentred as the
    reference centres a call of keys 0 .. last, at -(last + 1) // 2."""
    rotated = []
    for start, end in ((0, split), (split, q.shape[2])):
        pos = Positions.build(end - start, offset=start)
        if moving:
            enc.centre, enc.up_cached, enc.down_cached = (
                (end + 1) // 2,
                enc.up_cached[:0],
                enc.down_cached[:0],
            )
        rotated.append(enc.rotate(q[:, :, start:end].float(), k[:, :, start:end].float(), pos))
    keys = torch.cat([rotated[0][1], rotated[1][1]], dim=2)  # (1, H, T, D): the cache's keys
    return rotated[1][0] @ keys.transpose(-1, -2)  # (1, H, T - split, T)


@pytest.mark.parametrize("moving", [False, True])
def test_keys_cached_under_an_earlier_call_score_as_in_one_call_only_with_a_fixed_centre(
    moving: bool,
) -> None:
    """Why the centre is fixed: keys cached by one call and queries of a later call score q_n . k_m as one
    call over every position does (the same table rows: observed exactly equal; 1e-5 = 84 EPS32), with
    the fixed centre; recentred per call as the reference does (its cache keeps keys unscaled and rescales
    them all at every step; posab's keeps them rotated), they are off by zeta^(shift / 512): 9e-3 here.
    The model-level check is the shared one (tests/test_cache_equivalence.py)."""
    enc = XPos(Dims(HEADS * DIM, HEADS, 64))
    q, k = (t.detach() for t in leaves(76))
    with torch.no_grad():
        whole = encoding_scores(enc, q, k, Positions.build(76))[:, :, 64:]  # (1, H, 12, T)
        split = two_calls(enc, q, k, 64, moving)
    if moving:
        with pytest.raises(AssertionError, match="ratio"):
            assert_close_to_scale(lower_rows(split, 64), lower_rows(whole, 64), rel=1e-3)
    else:
        assert_close_to_scale(lower_rows(split, 64), lower_rows(whole, 64), rel=1e-5)


def lower_rows(scores: Tensor, first: int) -> Tensor:
    """The causal pairs of query rows first, first + 1, ... (1, H, c, n)."""
    return scores.tril(first)


def test_rope_is_xpos_without_the_scales_and_bad_settings_are_named() -> None:
    """The rotation is RoPE's own (its numbers unchanged): xPos / its scales == RoPE, exactly."""
    dims = Dims(HEADS * DIM, HEADS, TRAIN_LEN)
    enc, rope = XPos(dims), RoPE(dims)
    q, k = (t.detach().float() for t in leaves(20))
    pos = Positions.build(20, offset=7)
    xq, xk = enc.rotate(q, k, pos)
    up, down = enc.scales(pos.token, pos.last)
    rq, rk = rope.rotate(q, k, pos)
    assert torch.equal(xq, rq * up) and torch.equal(xk, rk * down)
    assert enc.variants == () and enc.relative_only
    for settings, message in (
        ({"scale_base": 0.0}, "scale_base=0.0"),
        ({"rotary_dim": 3}, "rotary dimension"),
    ):
        with pytest.raises(ConfigError, match=message):
            XPos(dims, **settings)  # type: ignore[arg-type]
