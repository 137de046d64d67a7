"""Perplexity at several lengths: the same tokens at every length, tail and capped perplexity, per-position
loss, per-document means, per-window arrays, sliding windows."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from conftest import tiny_model, typed_config
from posab.catalog import perplexity as perplexity_columns
from posab.data import CorpusData
from posab.encodings import Dims
from posab.encodings.nope import NoPE
from posab.errors import ConfigError
from posab.evaluate import EvalConfig, run_evaluator
from posab.evaluate.context import EvalContext
from posab.evaluate.perplexity import (
    PerplexityConfig,
    binned,
    capped_tail_losses,
    chunk_starts,
    sliding_loss,
    token_losses,
    window_count,
)
from tolerances import assert_close_to_scale

LENGTHS = [32, 64, 128]
TRAIN_LEN = 64


def perplexity_eval(ctx: EvalContext) -> dict[str, Any]:
    return run_evaluator(ctx, "perplexity").results


def context(corpus: CorpusData, encoding: str | nn.Module, **perplexity: object) -> EvalContext:
    cfg = EvalConfig(
        lengths=LENGTHS,
        batch_tokens=256,
        progress=False,
        perplexity=PerplexityConfig(token_budget=512, position_bins=8, **perplexity),  # type: ignore[arg-type]
    )
    model = tiny_model(encoding) if isinstance(encoding, str) else encoding
    valid = corpus.streams["valid"]
    return EvalContext(model, corpus.tokenizer, valid, torch.device("cpu"), None, TRAIN_LEN, cfg)  # type: ignore[arg-type]


class ContextFree(nn.Module):
    """Logits that depend on the current token only: the loss of a (token, next token) pair is the same
    wherever and after whatever it comes."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.table = nn.Embedding(vocab, vocab)
        nn.init.normal_(self.table.weight, generator=torch.Generator().manual_seed(0))
        self.encoding = NoPE(Dims(8, 2))

    def forward(
        self,
        tokens: Tensor,
        sentence: Tensor | None = None,
        paragraph: Tensor | None = None,
        offset: int = 0,
        observe: object = None,
    ) -> Tensor:
        return self.table(tokens)  # (B, T) -> (B, T, V)


def windows(ctx: EvalContext) -> np.ndarray:
    return ctx.valid.fixed_windows(max(LENGTHS), window_count(ctx.cfg.perplexity, max(LENGTHS)))


def test_keys_and_ranges(corpus: CorpusData, encoding: str) -> None:
    ctx = context(corpus, encoding, stride=16)
    started = time.perf_counter()
    results = perplexity_eval(ctx)
    elapsed = time.perf_counter() - started
    for length in LENGTHS:
        assert results[f"ppl/{length}"] == pytest.approx(math.exp(results[f"loss/{length}"]))
        assert 1 < results[f"ppl/{length}"] < 1000
        assert results[f"ppl_windows/{length}"] == 512 // length  # 4 windows of 128, cut into chunks
        assert len(results[f"position_loss/{length}"]) == 8
        assert all(v > 0 for v in results[f"position_loss/{length}"])
        assert 1 < results[f"ppl_sliding/{length}"] < 1000
    # one wall time per length, in seconds rounded to ms: disjoint parts of the evaluator's own
    times = {k: v for k, v in results.items() if k.startswith("time/")}
    assert set(times) == {f"time/ppl@{length}_s" for length in LENGTHS}
    assert all(t == round(t, 3) for t in times.values())
    assert sum(times.values()) <= elapsed + 0.0005 * len(times)  # + rounding


def test_every_length_scores_the_same_tokens(corpus: CorpusData) -> None:
    ctx = context(corpus, "alibi")
    starts = windows(ctx)
    assert len(starts) == 4 and np.all(np.diff(starts) >= 128)  # non-overlapping windows of the longest
    scored = {}
    for length in LENGTHS:
        chunks = chunk_starts(starts, 128, length)
        assert len(chunks) == len(starts) * 128 // length
        batch = ctx.valid.batch(chunks, length)
        scored[length] = (batch.inputs.reshape(-1).tolist(), batch.targets.reshape(-1).tolist())
    assert scored[32] == scored[64] == scored[128]  # the same (input, target) pairs, in the same order


def test_a_context_free_model_has_the_same_perplexity_at_every_length(corpus: CorpusData) -> None:
    """Every length scores the same (token, next token) pairs, so a model that sees only the current token
    gets the same loss at every length, and its capped tail equals its tail."""
    results = perplexity_eval(context(corpus, ContextFree(corpus.vocab_size)))
    for length in LENGTHS:  # means of the same float32 losses in other batch shapes: rel 1e-6 = 8 EPS32
        assert results[f"loss/{length}"] == pytest.approx(results["loss/32"], rel=1e-6)
    assert results["loss_capped/128"] == pytest.approx(results["loss_tail/128"], rel=1e-6)
    assert "loss_tail/64" not in results and "loss_capped/32" not in results  # no tail at L <= T


def test_capped_tail_is_the_tail_rescored_with_training_length_context(corpus: CorpusData) -> None:
    ctx = context(corpus, "alibi")
    chunks = chunk_starts(windows(ctx), 128, 128)
    # stride = T: one window of T tokens, [T, 2T) of each chunk, scored from its own start
    capped = capped_tail_losses(ctx, chunks, 128, stride=TRAIN_LEN)  # (N, 64)
    direct = token_losses(ctx, chunks + TRAIN_LEN, TRAIN_LEN)  # (N, 64)
    assert_close_to_scale(capped, direct, rel=1e-5)
    # stride 16: block b of 16 tail tokens in the window that ends with it
    capped = capped_tail_losses(ctx, chunks, 128, stride=16)
    for block in range(4):
        end = TRAIN_LEN + 16 * (block + 1)
        window = token_losses(ctx, chunks + end - TRAIN_LEN, TRAIN_LEN)[:, -16:]  # (N, 16)
        assert_close_to_scale(capped[:, 16 * block : 16 * (block + 1)], window, rel=1e-5)


def test_tail_keys_and_per_window_arrays(corpus: CorpusData) -> None:
    output = run_evaluator(context(corpus, "rope"), "perplexity")
    results, arrays = output.results, output.arrays["perplexity_windows"]
    assert results["ppl_tail/128"] == pytest.approx(math.exp(results["loss_tail/128"]))
    assert results["ppl_capped/128"] == pytest.approx(math.exp(results["loss_capped/128"]))
    assert len(arrays["starts"]) == 4
    for key in ("loss/32", "loss/64", "loss/128", "loss_tail/128", "loss_capped/128"):
        assert arrays[key].shape == (4,) and arrays[key].dtype == np.float32
    for length in LENGTHS:  # equal-sized windows: the mean of the per-window means is the mean
        assert float(arrays[f"loss/{length}"].mean()) == pytest.approx(results[f"loss/{length}"], rel=1e-5)
    assert float(arrays["loss_tail/128"].mean()) == pytest.approx(results["loss_tail/128"], rel=1e-5)


def test_each_window_records_the_document_that_holds_most_of_it(corpus: CorpusData) -> None:
    ctx = context(corpus, "nope")
    arrays = run_evaluator(ctx, "perplexity").arrays["perplexity_windows"]
    targets = ctx.valid.target_documents(arrays["starts"], 128)  # (N, 128)
    assert targets is not None and arrays["documents"].shape == (4,)
    for row, document in zip(targets, arrays["documents"], strict=True):
        counts = np.bincount(row)
        assert counts[document] == counts.max() and document == int(np.flatnonzero(counts == counts.max())[0])


def test_per_document_means_weigh_every_document_equally(corpus: CorpusData) -> None:
    ctx = context(corpus, "alibi")
    results = perplexity_eval(ctx)
    chunks = chunk_starts(windows(ctx), 128, 32)
    documents = ctx.valid.target_documents(chunks, 32)  # (N, 32)
    assert documents is not None and len(np.unique(documents)) >= 2  # the windows span documents
    losses = token_losses(ctx, chunks, 32).double()
    means = [float(losses[torch.from_numpy(documents == d)].mean()) for d in np.unique(documents)]
    assert results["loss_docmean/32"] == pytest.approx(float(np.mean(means)), rel=1e-6)
    assert results["ppl_docmean/32"] == pytest.approx(math.exp(results["loss_docmean/32"]))


def test_every_length_must_divide_the_longest() -> None:
    with pytest.raises(ConfigError, match=r"every length must divide the longest \(2048\).*bad: \[768\]"):
        typed_config(["eval.lengths=[512,768,2048]"])
    typed_config(["eval.lengths=[512,768,2048]", "eval.perplexity.enabled=false"])  # only perplexity needs it
    with pytest.raises(ConfigError, match="eval.split='train'"):
        typed_config(["eval.split=train"])


def test_windows_are_the_same_for_every_encoding(corpus: CorpusData) -> None:
    a, b = context(corpus, "alibi"), context(corpus, "sinusoidal")
    np.testing.assert_array_equal(windows(a), windows(b))
    first, second = perplexity_eval(a), perplexity_eval(a)
    assert {k: v for k, v in first.items() if not k.startswith("time/")} == {
        k: v for k, v in second.items() if not k.startswith("time/")
    }


def test_loss_matches_a_direct_computation(corpus: CorpusData) -> None:
    ctx = context(corpus, "rope")
    batch = ctx.valid.batch(chunk_starts(windows(ctx), 128, 64), 64)
    with torch.no_grad():
        logits = ctx.model(batch.inputs, batch.sentence, batch.paragraph)
    expected = F.cross_entropy(logits.double().flatten(0, 1), batch.targets.flatten())  # mean in float64
    # the same float32 logits up to the batch shape (4 windows a batch there, 8 here), a mean of 512
    # losses: observed ~2e-8 of it; 1e-5 = 84 EPS32, while a target off by one position moves it by ~1e-2
    assert perplexity_eval(ctx)["loss/64"] == pytest.approx(float(expected), rel=1e-5)


def test_bits_per_byte_divide_the_loss_by_the_text_bytes_not_the_anchors(corpus: CorpusData) -> None:
    ctx = context(corpus, "alibi")
    targets = ctx.valid.batch(chunk_starts(windows(ctx), 128, 64), 64).targets  # (N, 64)
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


def test_report_columns_show_tail_capped_and_bits_per_byte() -> None:
    """ppl at every length, tail and capped perplexity where a run has them, bits per byte at the two ends."""
    keys = {f"{kind}/{n}" for kind in ("ppl", "bpb") for n in (512, 1024, 2048)}
    keys |= {f"{kind}/{n}" for kind in ("ppl_tail", "ppl_capped") for n in (1024, 2048)}
    headers = [
        (c.header, c.key) for c in perplexity_columns.report_columns(keys | {"ppl@pi/1024", "loss/512"})
    ]
    assert headers == [
        ("ppl@512", "ppl/512"),
        ("ppl@1024", "ppl/1024"),
        ("ppl@2048", "ppl/2048"),
        ("tail@1024", "ppl_tail/1024"),
        ("tail@2048", "ppl_tail/2048"),
        ("capped@1024", "ppl_capped/1024"),
        ("capped@2048", "ppl_capped/2048"),
        ("bpb@512", "bpb/512"),
        ("bpb@2048", "bpb/2048"),
    ]
    assert perplexity_columns.report_columns(set()) == []
