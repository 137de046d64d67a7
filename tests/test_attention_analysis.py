"""Attention entropy and mean attended distance per layer and head, recomputed from hooked inputs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from conftest import tiny_model, typed_config
from posab.attention import scaled_attention
from posab.config import AnalysisConfig, EvalConfig
from posab.data import CorpusData
from posab.errors import ConfigError
from posab.evaluate import evaluators
from posab.evaluate.attention_analysis import (
    AttentionInputs,
    analysis_eval,
    attention_plot,
    captured_inputs,
    head_statistics,
    probabilities,
    queries_keys_values,
)
from posab.evaluate.context import EvalContext
from posab.model import DecoderLM

LENGTHS = [32, 64]


def context(corpus: CorpusData, encoding: str, lengths: list[int] = LENGTHS) -> EvalContext:
    cfg = EvalConfig(lengths=lengths, progress=False, analysis=AnalysisConfig(enabled=True, windows=2))
    return EvalContext(
        tiny_model(encoding), corpus.tokenizer, corpus.streams["valid"], torch.device("cpu"), None, 32, cfg
    )


def test_keys_and_ranges(corpus: CorpusData, encoding: str) -> None:
    ctx = context(corpus, encoding)
    results = analysis_eval(ctx)
    layers, heads = len(ctx.model.blocks), ctx.model.cfg.n_heads
    grid = results["attn/grid"]
    assert grid["lengths"] == LENGTHS and grid["layers"] == [0, 1] and grid["heads"] == [0, 1]
    for i, length in enumerate(LENGTHS):
        for layer in range(layers):
            for head in range(heads):
                entropy = results[f"attn/entropy@{length}/layer{layer}/head{head}"]
                distance = results[f"attn/distance@{length}/layer{layer}/head{head}"]
                assert -1e-6 <= entropy <= math.log(length) + 1e-5
                assert -1e-6 <= distance <= length - 1
                assert grid["entropy"][i][layer][head] == entropy
                assert grid["distance"][i][layer][head] == distance
        assert results[f"time/attn@{length}_s"] >= 0


def recomputed_and_actual(model: DecoderLM) -> tuple[torch.Tensor, torch.Tensor, AttentionInputs]:
    """Layer 1's recomputed probabilities (B, H, T, T), its actual output before `proj`, and its inputs."""
    tokens = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(0))
    structure = torch.arange(40).repeat(2, 1) // 10  # (B, T) sentence and paragraph indices
    outputs: list[torch.Tensor] = []
    hook = model.blocks[1].attn.proj.register_forward_pre_hook(lambda _, args: outputs.append(args[0]))
    with torch.no_grad(), captured_inputs(model) as captured:
        model(tokens, structure, structure // 2, offset=7)
    hook.remove()
    assert len(captured) == len(model.blocks)
    assert all(not block.attn._forward_pre_hooks for block in model.blocks)  # hooks removed
    q, k, v = queries_keys_values(model.blocks[1].attn, captured[1])
    p = probabilities(q, k, captured[1].mask, captured[1].scale, 0, 40)  # (B, H, T, T)
    return p, outputs[0], captured[1]


def applied(p: torch.Tensor, model: DecoderLM, inputs: AttentionInputs) -> torch.Tensor:
    """p @ v for layer 1, as the module's output before `proj`: (B, T, C)."""
    _, _, v = queries_keys_values(model.blocks[1].attn, inputs)
    return (p @ v).transpose(1, 2).reshape(2, 40, -1)  # (B, H, T, D) -> (B, T, C)


def test_recomputed_probabilities_reproduce_the_attention_output(encoding: str) -> None:
    model = tiny_model(encoding)
    p, actual, inputs = recomputed_and_actual(model)
    torch.testing.assert_close(p.sum(-1), torch.ones(2, 2, 40))
    assert torch.all(p.triu(1) == 0)  # causal
    torch.testing.assert_close(applied(p, model, inputs), actual, rtol=1e-4, atol=1e-6)


def test_recomputed_probabilities_follow_a_score_scale() -> None:
    model = tiny_model("multiscale", "encoding.form=multiplicative")
    with torch.no_grad():
        torch.nn.init.normal_(model.encoding.gate_mlp.mlp[-1].weight)  # type: ignore[union-attr,index]
    p, actual, inputs = recomputed_and_actual(model)
    assert inputs.scale is not None and not torch.allclose(inputs.scale, torch.ones(()))
    torch.testing.assert_close(applied(p, model, inputs), actual, rtol=1e-4, atol=1e-6)


def test_chunked_statistics_equal_one_pass() -> None:
    generator = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 1, 3, 50, 8, generator=generator)  # 2 x (B, H, T, D)
    mask = torch.randn(1, 3, 50, 50, generator=generator) + torch.full((50, 50), float("-inf")).triu(1)
    scale = torch.rand(1, 3, 50, 50, generator=generator) + 0.5  # (1, H, T, T)
    for m, s in ((None, None), (mask, None), (None, scale), (mask, scale)):
        one_pass = head_statistics(q, k, m, s, chunk=50)  # float32 sums, in float64
        torch.testing.assert_close(head_statistics(q, k, m, s, chunk=7), one_pass, rtol=1e-5, atol=1e-6)


def test_probabilities_follow_the_score_scale() -> None:
    generator = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(3, 2, 2, 30, 8, generator=generator)  # 3 x (B, H, T, D)
    mask = torch.randn(1, 2, 30, 30, generator=generator) + torch.full((30, 30), float("-inf")).triu(1)
    scale = torch.rand(1, 2, 30, 30, generator=generator) + 0.5  # (1, H, T, T)
    expected = scaled_attention(q, k, v, mask, scale, 0.0)  # (B, H, T, D)
    torch.testing.assert_close(probabilities(q, k, mask, scale, 0, 30) @ v, expected)


def test_uniform_attention_gives_the_closed_forms() -> None:
    q = torch.zeros(1, 2, 100, 4)  # every score 0: uniform over keys 0..i
    entropy, distance = head_statistics(q, q, None, chunk=32)  # (H,) each
    torch.testing.assert_close(entropy, torch.full((2,), math.lgamma(101) / 100, dtype=torch.float64))
    torch.testing.assert_close(distance, torch.full((2,), 99 / 4, dtype=torch.float64))


def test_alibi_steep_heads_are_local(corpus: CorpusData) -> None:
    """Untrained, the content scores are near 0: ALiBi attention follows its slopes, NoPE is near uniform."""
    alibi = analysis_eval(context(corpus, "alibi", [64]))["attn/grid"]
    nope = analysis_eval(context(corpus, "nope", [64]))["attn/grid"]
    for layer in (0, 1):
        steep, shallow = alibi["distance"][0][layer]  # slopes 2^-4, 2^-8
        assert steep < shallow
        assert steep < min(nope["distance"][0][layer])
        assert nope["distance"][0][layer] == pytest.approx([63 / 4, 63 / 4], rel=0.05)


def test_registered_after_shift_only_when_enabled(corpus: CorpusData) -> None:
    ctx = context(corpus, "nope")
    assert list(evaluators(ctx))[-2:] == ["shift", "analysis"]
    ctx.cfg.analysis.enabled = False
    assert "analysis" not in evaluators(ctx)
    assert typed_config().eval.analysis == AnalysisConfig(enabled=False, windows=2, lengths=None)
    with pytest.raises(ConfigError, match="eval.analysis.lengths"):
        typed_config(["eval.lengths=[512]", "eval.analysis.lengths=[1024]"])
    with pytest.raises(ConfigError, match="eval.analysis.windows"):
        typed_config(["eval.analysis.windows=0"])


def test_plot_is_a_png(corpus: CorpusData, tmp_path: Path) -> None:
    grid = analysis_eval(context(corpus, "alibi"))["attn/grid"]
    path = attention_plot(grid, tmp_path / "plots" / "attention.png", "alibi")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000
