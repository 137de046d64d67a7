"""Attention entropy and mean attended distance per layer and head, from the model's own attention path."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
import torch

from conftest import tiny_model, typed_config
from posab.data import CorpusData
from posab.errors import ConfigError
from posab.evaluate import EvalConfig, enabled_evaluators, run_evaluator
from posab.evaluate.attention_analysis import AnalysisConfig, head_statistics
from posab.evaluate.context import EvalContext
from posab.forms import Additive, AttentionInputs, Causal, Scaled
from posab.model import DecoderLM
from posab.plots import png_bytes
from tolerances import EPS32, assert_close_to_scale

LENGTHS = [32, 64]


def context(corpus: CorpusData, encoding: str, lengths: list[int] = LENGTHS) -> EvalContext:
    cfg = EvalConfig(lengths=lengths, progress=False, analysis=AnalysisConfig(enabled=True, windows=2))
    model = tiny_model(encoding)
    return EvalContext(
        model, corpus.tokenizer, corpus.streams["valid"], torch.device("cpu"), None, 32, cfg, encoding
    )


def analysis(ctx: EvalContext) -> dict[str, Any]:
    return run_evaluator(ctx, "analysis").results


def test_keys_and_ranges(corpus: CorpusData, encoding: str) -> None:
    ctx = context(corpus, encoding)
    started = time.perf_counter()
    output = run_evaluator(ctx, "analysis")
    elapsed = time.perf_counter() - started
    results = output.results
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
    # one wall time per length, in seconds rounded to ms: disjoint parts of the evaluator's own
    times = {k: v for k, v in results.items() if k.startswith("time/")}
    assert set(times) == {f"time/attn@{length}_s" for length in LENGTHS}
    assert all(t == round(t, 3) for t in times.values())
    assert sum(times.values()) <= elapsed + 0.0005 * len(times)  # + rounding
    table = output.tables["attention_stats"]
    assert table.columns == ["length", "layer", "head", "entropy", "distance"]
    assert len(table.rows) == len(LENGTHS) * layers * heads
    assert set(output.figures) == {"attention"}


def observed_and_actual(model: DecoderLM) -> tuple[list[AttentionInputs], torch.Tensor, torch.Tensor]:
    """Every layer's observed attention inputs; layer 1's v (B, H, T, D) and its output before `proj`."""
    tokens = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(0))
    structure = torch.arange(40).repeat(2, 1) // 10  # (B, T) sentence and paragraph indices
    called: list[tuple[Any, ...]] = []
    outputs: list[torch.Tensor] = []
    attn = model.blocks[1].attn
    hooks = [
        attn.register_forward_pre_hook(lambda _, args: called.append(args)),
        attn.proj.register_forward_pre_hook(lambda _, args: outputs.append(args[0])),
    ]
    observed: list[AttentionInputs] = []
    with torch.no_grad():
        model(tokens, structure, structure // 2, offset=7, observe=observed.append)
        x, layer = called[0][:2]  # (x, the layer context, its cache)
        _, _, v = attn.queries_keys_values(x, layer.encoding, layer.pos)  # (B, H, T, D)
    for hook in hooks:
        hook.remove()
    return observed, v, outputs[0]


def applied(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """p @ v as the module's output before `proj`: (B, H, T, D) -> (B, T, C)."""
    return (p @ v).transpose(1, 2).reshape(2, 40, -1)


def test_observed_probabilities_reproduce_the_attention_output(encoding: str) -> None:
    model = tiny_model(encoding)
    observed, v, actual = observed_and_actual(model)
    assert len(observed) == len(model.blocks)
    p = observed[1].probabilities()  # (B, H, T, T)
    assert_close_to_scale(p.sum(-1), torch.ones(2, 2, 40), rel=64 * EPS32)
    assert torch.all(p.triu(1) == 0)  # causal
    # the fused kernel and p @ v sum 40 terms each in float32: a few tens of EPS32 of the output's scale
    assert_close_to_scale(applied(p, v), actual, rel=1e-5, msg=encoding)


def test_observed_probabilities_follow_a_score_scale() -> None:
    model = tiny_model("multiscale", "encoding.form=multiplicative")
    with torch.no_grad():
        torch.nn.init.normal_(model.encoding.gate_mlp.mlp[-1].weight)  # type: ignore[union-attr,index]
    observed, v, actual = observed_and_actual(model)
    form = observed[1].form
    assert isinstance(form, Scaled) and not torch.allclose(form.scale, torch.ones(()))
    assert_close_to_scale(applied(observed[1].probabilities(), v), actual, rel=1e-5)


def test_chunked_statistics_equal_one_pass() -> None:
    generator = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 1, 3, 50, 8, generator=generator)  # 2 x (B, H, T, D)
    bias = torch.randn(1, 3, 50, 50, generator=generator)  # (1, H, T, T) without the causal mask
    scale = torch.rand(1, 3, 50, 50, generator=generator) + 0.5  # (1, H, T, T)
    additive = Additive(bias, torch.float32)
    for form in (Causal(), additive, Scaled(scale, None), Scaled(scale, additive)):
        inputs = AttentionInputs(q, k, form)
        one_pass = head_statistics(inputs, chunk=50)  # float32 sums, in float64
        assert_close_to_scale(head_statistics(inputs, chunk=7), one_pass, rel=1e-5)


def test_probabilities_are_the_explicit_attention_path() -> None:
    generator = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(3, 2, 2, 30, 8, generator=generator).double()  # 3 x (B, H, T, D), float64
    bias = torch.randn(1, 2, 30, 30, generator=generator).double()  # (1, H, T, T) without the causal mask
    scale = torch.rand(1, 2, 30, 30, generator=generator).double() + 0.5  # (1, H, T, T)
    form = Scaled(scale, Additive(bias, torch.float64))
    expected = form.attend(q, k, v)  # (B, H, T, D)
    assert_close_to_scale(form.probabilities(q, k, 0, 30).double() @ v, expected, rel=1e-5)
    rows = form.probabilities(q, k, 10, 30)  # queries 10..29 over keys 0..29
    assert_close_to_scale(rows, form.probabilities(q, k, 0, 30)[:, :, 10:], rel=1e-6)


def test_uniform_attention_gives_the_closed_forms() -> None:
    q = torch.zeros(1, 2, 100, 4)  # every score 0: uniform over keys 0..i
    entropy, distance = head_statistics(AttentionInputs(q, q, Causal()), chunk=32)  # (H,) each
    assert_close_to_scale(entropy, torch.full((2,), math.lgamma(101) / 100, dtype=torch.float64), rel=1e-5)
    assert_close_to_scale(distance, torch.full((2,), 99 / 4, dtype=torch.float64), rel=1e-5)


def test_alibi_steep_heads_are_local(corpus: CorpusData) -> None:
    """Untrained, the content scores are near 0: ALiBi attention follows its slopes, NoPE is near uniform."""
    alibi = analysis(context(corpus, "alibi", [64]))["attn/grid"]
    nope = analysis(context(corpus, "nope", [64]))["attn/grid"]
    for layer in (0, 1):
        steep, shallow = alibi["distance"][0][layer]  # slopes 2^-4, 2^-8
        assert steep < shallow
        assert steep < min(nope["distance"][0][layer])
        assert nope["distance"][0][layer] == pytest.approx([63 / 4, 63 / 4], rel=0.05)


def test_runs_last_and_only_when_enabled(corpus: CorpusData) -> None:
    ctx = context(corpus, "nope")
    assert [e.name for e in enabled_evaluators(ctx.cfg)][-2:] == ["shift", "analysis"]
    ctx.cfg.analysis.enabled = False  # type: ignore[attr-defined]
    assert "analysis" not in [e.name for e in enabled_evaluators(ctx.cfg)]
    assert typed_config().eval.analysis == AnalysisConfig(enabled=False, windows=2, lengths=None)
    with pytest.raises(ConfigError, match="eval.analysis.lengths"):
        typed_config(["eval.lengths=[512]", "eval.analysis.lengths=[1024]"])
    with pytest.raises(ConfigError, match="eval.analysis.windows"):
        typed_config(["eval.analysis.windows=0"])


def test_figure_renders_as_a_png(corpus: CorpusData) -> None:
    figure = run_evaluator(context(corpus, "alibi"), "analysis").figures["attention"]
    png = png_bytes(figure)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    assert figure.get_suptitle() == "alibi"  # the run's title (EvalContext.title)
