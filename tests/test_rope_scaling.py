"""RoPE context extension at evaluation (PI, NTK-aware, YaRN) and its perplexity rows."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from conftest import tiny_model, typed_config
from posab.data import CorpusData
from posab.encodings import Dims, Positions
from posab.encodings.rope import RoPE
from posab.errors import ConfigError
from posab.evaluate import EvalConfig, run_evaluator
from posab.evaluate.context import EvalContext
from posab.evaluate.perplexity import PerplexityConfig, scaled_losses, token_losses, window_count
from tolerances import assert_close_to_scale

DIMS = Dims(d_model=32, n_heads=2, train_len=64)  # head_dim 16
KINDS = ["none", "pi", "ntk", "yarn"]


def rotated(rope: RoPE, length: int = 300, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate fixed random q, k (1, 2, length, 16) at positions 0 .. length-1."""
    generator = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 1, 2, length, 16, generator=generator)  # 2 x (1, H, T, D)
    return rope.rotate(q, k, Positions.build(length))


def by_hand(x: torch.Tensor, positions: torch.Tensor, frequencies: list[float]) -> torch.Tensor:
    """x (.., T, R) rotated with rotate_half: x * cos + (-x2, x1) * sin, angle = position * frequency.

    All in float64: the reference for the float32 rotation."""
    angles = positions.double()[:, None] * torch.tensor(frequencies, dtype=torch.float64)[None, :]  # (T, R/2)
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)  # (T, R)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)  # (T, R)
    x = x.double()
    half = x.shape[-1] // 2
    rotate_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotate_half * sin


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_every_method_at_scale_one_is_plain_rope(kind: str, rotary_dim: int | None) -> None:
    plain = RoPE(DIMS, rotary_dim=rotary_dim)
    scaled = RoPE(DIMS, rotary_dim=rotary_dim)
    with scaled.variant(kind, 1.0):
        assert torch.equal(scaled.inv_freq, plain.inv_freq)
        for got, expected in zip(rotated(scaled), rotated(plain), strict=True):
            assert torch.equal(got, expected)


def test_pi_at_two_is_plain_rope_at_half_positions() -> None:
    rope = RoPE(DIMS)
    positions = torch.arange(300)
    with rope.variant("pi", 2.0):
        cos, sin = rope.tables(positions)
    halves = positions.double() / 2  # (T,) non-integer positions
    angles = halves[:, None] * RoPE(DIMS).inv_freq[None, :]  # (T, R/2)
    torch.testing.assert_close(cos, torch.cat([angles.cos(), angles.cos()], dim=-1).float(), rtol=0, atol=0)
    torch.testing.assert_close(sin, torch.cat([-angles.sin(), angles.sin()], dim=-1).float(), rtol=0, atol=0)


def test_ntk_base_formula() -> None:
    s, d = 4.0, 16
    base = 10000.0 * s ** (d / (d - 2))  # bloc97: base' = base * s^(D / (D - 2))
    rope, reference = RoPE(DIMS), RoPE(DIMS, base=base)
    with rope.variant("ntk", s):
        expected = torch.tensor([base ** (-2 * c / d) for c in range(d // 2)], dtype=torch.float64)
        torch.testing.assert_close(rope.inv_freq, expected, rtol=1e-12, atol=0)
        for got, want in zip(rotated(rope), rotated(reference), strict=True):
            assert torch.equal(got, want)
        # the highest frequency is kept, the lowest is interpolated by exactly s
        assert rope.inv_freq[0] == 1.0 and rope.inv_freq[-1] == pytest.approx(10000.0 ** (-14 / 16) / s)


def test_yarn_matches_the_published_formula() -> None:
    """Peng et al. (2023), NTK-by-parts with alpha = 1, beta = 32, and sqrt(1/t) = 0.1 ln(s) + 1."""
    dims = Dims(d_model=16, n_heads=2, train_len=256)  # |D| = 8
    base, d, s, big_l, alpha, beta = 10000.0, 8, 4.0, 256, 1.0, 32.0
    expected = []
    for c in range(d // 2):
        theta = base ** (-2 * c / d)
        r = big_l / (2 * math.pi / theta)  # L / wavelength
        gamma = 0.0 if r < alpha else 1.0 if r > beta else (r - alpha) / (beta - alpha)
        expected.append((1 - gamma) * theta / s + gamma * theta)
    # the case covers the three parts: r = 40.7 (kept), 4.07 (ramp), 0.41 and 0.04 (interpolated)
    assert expected[0] == 1.0 and expected[2:] == pytest.approx([0.01 / s, 0.001 / s], rel=1e-12)
    assert 0.1 / s < expected[1] < 0.1
    scale = 0.1 * math.log(s) + 1  # sqrt(1/t)
    rope = RoPE(dims)
    q, k = torch.randn(2, 1, 2, 50, 8, generator=torch.Generator().manual_seed(1))  # 2 x (1, H, T, D)
    pos = Positions.build(50, offset=200)
    with rope.variant("yarn", s):
        frequencies = rope.inv_freq
        q_yarn, k_yarn = rope.rotate(q, k, pos)
    torch.testing.assert_close(frequencies, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0)
    q_hand, k_hand = by_hand(q, pos.token, expected), by_hand(k, pos.token, expected)  # float64
    # float32 cos/sin tables (angles up to 250 rad, computed in float64, rounded once), x cos + rot(x) sin
    # times sqrt(1/t): <= ~4 roundings of |x_c| + |x_c'| <= 2x the scale, observed ~1e-7 of it;
    # 2e-6 = 17 EPS32, while a frequency off by 1e-5 of itself moves the angle at position 250 by 2.5e-3
    assert_close_to_scale(q_yarn, scale * q_hand, rel=2e-6, msg="q")
    assert_close_to_scale(k_yarn, scale * k_hand, rel=2e-6, msg="k")
    logits, plain = q_yarn @ k_yarn.transpose(-1, -2), q_hand @ k_hand.transpose(-1, -2)  # (1, H, T, T)
    # 8-term float32 dot products of those: 1e-5 = 84 EPS32 of the logits' scale; without the attention
    # factor 1/t = (0.1 ln s + 1)^2 = 1.30 they would be off by 23% of it
    assert_close_to_scale(logits, scale**2 * plain, rel=1e-5, msg="logits")


def test_partial_rotary_yarn_scales_every_channel() -> None:
    rope = RoPE(DIMS, rotary_dim=8)
    q, k = torch.randn(2, 1, 2, 10, 16, generator=torch.Generator().manual_seed(2))  # 2 x (1, H, T, D)
    with rope.variant("yarn", 3.0):
        q_yarn, _ = rope.rotate(q, k, Positions.build(10))
    torch.testing.assert_close(q_yarn[..., 8:], (0.1 * math.log(3.0) + 1) * q[..., 8:])


@pytest.mark.parametrize("kind", KINDS)
def test_context_manager_restores_the_original_state(kind: str) -> None:
    rope, fresh = RoPE(DIMS), RoPE(DIMS)
    before = rotated(rope, length=100)  # fills the cache up to 100 positions
    with rope.variant(kind, 8.0):
        during = rotated(rope, length=700)  # grows a scaled cache past the original one
        assert rope.cos_cached.shape[0] >= 700
    assert rope.attention_factor == 1.0
    assert torch.equal(rope.inv_freq, fresh.inv_freq)
    after = rotated(rope, length=700)
    reference = rotated(fresh, length=700)
    for got, want in zip(after, reference, strict=True):
        assert torch.equal(got, want)
    assert torch.equal(rope.cos_cached[:700], fresh.cos_cached[:700])
    assert torch.equal(rope.sin_cached[:700], fresh.sin_cached[:700])
    assert all(torch.equal(a, b) for a, b in zip(before, rotated(fresh, length=100), strict=True))
    if kind != "none":
        assert not torch.equal(during[0], reference[0])


def test_state_is_restored_after_an_error() -> None:
    rope = RoPE(DIMS)
    with pytest.raises(RuntimeError), rope.variant("yarn", 2.0):
        rotated(rope)
        raise RuntimeError
    assert rope.attention_factor == 1.0 and rope.cos_cached.shape[0] == 0
    assert torch.equal(rope.inv_freq, RoPE(DIMS).inv_freq)


def test_bad_scalings() -> None:
    with pytest.raises(ValueError, match="unknown rope scaling"), RoPE(DIMS).variant("linear", 2.0):
        pass
    with pytest.raises(ValueError, match=">= 1"), RoPE(DIMS).variant("pi", 0.5):
        pass
    with pytest.raises(ConfigError, match="eval.perplexity.rope_scaling"):
        typed_config(["eval.perplexity.rope_scaling=[none,linear]"])
    with pytest.raises(ConfigError, match="eval.perplexity.rope_scaling"):
        typed_config(["eval.perplexity.rope_scaling=[pi,pi]"])
    with pytest.raises(ConfigError, match="eval.perplexity.rope_scaling_factor"):
        typed_config(["eval.perplexity.rope_scaling_factor=0.5"])
    assert typed_config().eval.perplexity.rope_scaling == KINDS


def perplexity_eval(ctx: EvalContext) -> dict[str, Any]:
    return run_evaluator(ctx, "perplexity").results


def context(corpus: CorpusData, encoding: str, **scaling: object) -> EvalContext:
    """`scaling`: the perplexity section's rope_scaling and rope_scaling_factor."""
    perplexity = PerplexityConfig(token_budget=256, position_bins=4, **scaling)  # type: ignore[arg-type]
    cfg = EvalConfig(lengths=[64, 128], batch_tokens=256, progress=False, perplexity=perplexity)
    return EvalContext(
        tiny_model(encoding), corpus.tokenizer, corpus.streams["valid"], torch.device("cpu"), None, 64, cfg
    )


def test_perplexity_rows_per_scaling(corpus: CorpusData) -> None:
    ctx = context(corpus, "rope")
    results = perplexity_eval(ctx)
    for kind in ("pi", "ntk", "yarn"):
        assert 1 < results[f"ppl@{kind}/128"] < 1000
        assert results[f"ppl@{kind}/128"] == pytest.approx(math.exp(results[f"loss@{kind}/128"]))
        assert len(results[f"position_loss@{kind}/128"]) == 4
        assert f"ppl@{kind}/64" not in results  # L <= train_len: the same as none
    assert not any(key.startswith(("ppl@none", "loss@none")) for key in results)
    starts = ctx.valid.fixed_windows(128, window_count(ctx.cfg.perplexity, 128))
    plain = token_losses(ctx, starts, 128)  # (N, L)
    for kind, losses in scaled_losses(ctx, starts, 128).items():  # untrained: small but real differences
        assert not torch.equal(losses, plain), kind
    assert torch.equal(token_losses(ctx, starts, 128), plain)  # unscaled again afterwards


def test_the_scaled_tail_and_windows_come_from_the_scaled_losses(corpus: CorpusData) -> None:
    """Under each scaling: the tail of its own per-token losses (positions >= the training length 64) and
    its per-window losses in the arrays; no capped perplexity (it is the model at the training length)."""
    ctx = context(corpus, "rope")
    output = run_evaluator(ctx, "perplexity")
    results, arrays = output.results, output.arrays["perplexity_windows"]
    starts = ctx.valid.fixed_windows(128, window_count(ctx.cfg.perplexity, 128))  # one chunk per window
    for kind, losses in scaled_losses(ctx, starts, 128).items():  # (N, 128)
        tail = losses[:, 64:]  # (N, 64)
        assert results[f"loss_tail@{kind}/128"] == pytest.approx(float(tail.mean()), rel=1e-5)
        assert results[f"ppl_tail@{kind}/128"] == pytest.approx(math.exp(results[f"loss_tail@{kind}/128"]))
        assert results[f"loss_tail@{kind}/128"] != results["loss_tail/128"], kind
        assert arrays[f"loss@{kind}/128"] == pytest.approx(losses.mean(dim=1).numpy(), rel=1e-5)
        assert arrays[f"loss_tail@{kind}/128"] == pytest.approx(tail.mean(dim=1).numpy(), rel=1e-5)
        assert not [
            k for k in (*results, *arrays) if k.startswith((f"loss_capped@{kind}", f"ppl_capped@{kind}"))
        ]
        assert f"loss_tail@{kind}/64" not in results and f"loss@{kind}/64" not in arrays


def test_perplexity_rows_follow_the_config(corpus: CorpusData) -> None:
    results = perplexity_eval(context(corpus, "rope", rope_scaling=["yarn"], rope_scaling_factor=1.0))
    assert results["ppl@yarn/128"] == pytest.approx(results["ppl/128"], rel=1e-6)  # s = 1: plain RoPE
    assert not any("@pi/" in key or "@ntk/" in key for key in results)


def test_no_scaled_rows_for_other_encodings(corpus: CorpusData) -> None:
    results = perplexity_eval(context(corpus, "alibi"))
    assert "ppl/128" in results
    assert not any("@" in key for key in results if not key.startswith("time/"))
