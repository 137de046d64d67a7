"""Perplexity at several lengths: fixed windows, per-position loss, sliding windows."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_model
from posab.data import CorpusData
from posab.evaluate import EvalConfig, run_evaluator
from posab.evaluate.context import EvalContext
from posab.evaluate.perplexity import PerplexityConfig, binned, sliding_loss, token_losses, window_count

LENGTHS = [32, 64, 128]


def perplexity_eval(ctx: EvalContext) -> dict[str, Any]:
    return run_evaluator(ctx, "perplexity").results


def context(corpus: CorpusData, encoding: str, **perplexity: object) -> EvalContext:
    cfg = EvalConfig(
        lengths=LENGTHS,
        batch_tokens=256,
        progress=False,
        perplexity=PerplexityConfig(token_budget=512, position_bins=8, **perplexity),  # type: ignore[arg-type]
    )
    return EvalContext(
        tiny_model(encoding), corpus.tokenizer, corpus.streams["valid"], torch.device("cpu"), None, 64, cfg
    )


def test_keys_and_ranges(corpus: CorpusData, encoding: str) -> None:
    results = perplexity_eval(context(corpus, encoding, stride=16))
    for length in LENGTHS:
        assert results[f"ppl/{length}"] == pytest.approx(math.exp(results[f"loss/{length}"]))
        assert 1 < results[f"ppl/{length}"] < 1000
        assert results[f"ppl_windows/{length}"] == 512 // length
        assert len(results[f"position_loss/{length}"]) == 8
        assert all(v > 0 for v in results[f"position_loss/{length}"])
        assert 1 < results[f"ppl_sliding/{length}"] < 1000
        assert results[f"time/ppl@{length}_s"] >= 0


def test_windows_are_the_same_for_every_encoding(corpus: CorpusData) -> None:
    a, b = context(corpus, "alibi"), context(corpus, "sinusoidal")
    for length in LENGTHS:
        starts_a = a.valid.fixed_windows(length, window_count(a.cfg.perplexity, length))
        starts_b = b.valid.fixed_windows(length, window_count(b.cfg.perplexity, length))
        np.testing.assert_array_equal(starts_a, starts_b)
        assert np.all(np.diff(starts_a) >= length)  # non-overlapping
    first, second = perplexity_eval(a), perplexity_eval(a)
    assert {k: v for k, v in first.items() if not k.startswith("time/")} == {
        k: v for k, v in second.items() if not k.startswith("time/")
    }


def test_loss_matches_a_direct_computation(corpus: CorpusData) -> None:
    ctx = context(corpus, "rope")
    starts = ctx.valid.fixed_windows(64, window_count(ctx.cfg.perplexity, 64))
    batch = ctx.valid.batch(starts, 64)
    with torch.no_grad():
        logits = ctx.model(batch.inputs, batch.sentence, batch.paragraph)
    expected = F.cross_entropy(logits.double().flatten(0, 1), batch.targets.flatten())  # mean in float64
    # the same float32 logits up to the batch shape (4 windows a batch there, 8 here), a mean of 512
    # losses: observed ~2e-8 of it; 1e-5 = 84 EPS32, while a target off by one position moves it by ~1e-2
    assert perplexity_eval(ctx)["loss/64"] == pytest.approx(float(expected), rel=1e-5)


def test_bits_per_byte_divide_the_loss_by_the_text_bytes_not_the_anchors(corpus: CorpusData) -> None:
    ctx = context(corpus, "alibi")
    starts = ctx.valid.fixed_windows(64, window_count(ctx.cfg.perplexity, 64))
    targets = ctx.valid.batch(starts, 64).targets  # (N, 64)
    text_bytes = int((targets < 256).sum())  # byte tokens; BOS/EOS/PARA/SENT stand for no text
    assert 0 < text_bytes < targets.numel()  # the corpus has anchors
    results = perplexity_eval(ctx)
    total_loss = results["loss/64"] * targets.numel()
    assert results["bpb/64"] == pytest.approx(total_loss / math.log(2) / text_bytes, rel=1e-6)


def test_sliding_with_stride_equal_to_length_is_contiguous_windows(corpus: CorpusData) -> None:
    ctx = context(corpus, "alibi")
    contiguous = token_losses(ctx, np.arange(4) * 32, 32).double()  # the mean in float64
    # the same float32 losses, summed in another order: observed ~4e-8 of the mean; 1e-6 = 8 EPS32, while
    # one token of 128 counted twice or left out moves it by ~1e-3
    assert sliding_loss(ctx, 32, 32, 4 * 32) == pytest.approx(float(contiguous.mean()), rel=1e-6)


def test_sliding_scores_each_token_once_with_more_context(corpus: CorpusData) -> None:
    ctx = context(corpus, "alibi")
    losses = token_losses(ctx, np.array([0, 16, 32]), 64).double()  # windows [0,64), [16,80), [32,96)
    expected = (losses[0].sum() + losses[1, -16:].sum() + losses[2, -16:].sum()) / (64 + 32)  # in float64
    # as above: observed ~3e-8 of the mean; 1e-6 = 8 EPS32, while a token scored twice is ~1e-3 off
    assert sliding_loss(ctx, 64, 16, 96) == pytest.approx(float(expected), rel=1e-6)


def test_binned_means() -> None:
    curve = torch.arange(8, dtype=torch.float32)
    assert binned(curve, 4) == [0.5, 2.5, 4.5, 6.5]
    assert binned(curve[:3], 8) == [0.0, 1.0, 2.0]
