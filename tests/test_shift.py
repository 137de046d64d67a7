"""Shift stability: offsets leave relative-only encodings unchanged, prefixes change every encoding."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from conftest import tiny_model
from posab.data import Batch, CorpusData, DataConfig, SyntheticConfig, TokenStream, prepare_data
from posab.data.tokenizer import VOCAB_SIZE
from posab.errors import ConfigError
from posab.evaluate import EvalConfig, run_evaluator
from posab.evaluate.context import EvalContext
from posab.evaluate.shift import Prefix, ShiftConfig, prefix_text, shift_windows, with_prefix
from tolerances import scale_of

TRAIN_LEN = 64
SHIFT = ShiftConfig(offsets=[1, 64, 1000], prefix_lengths=[16, 64], windows=3)
METRICS = ("max_abs_logit", "kl", "top1_agree", "dloss")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> CorpusData:
    synthetic = SyntheticConfig(vocab_size=300, train_docs=4, valid_docs=3, test_docs=2)
    return prepare_data(
        DataConfig(cache_dir=str(tmp_path_factory.mktemp("shift") / "cache"), synthetic=synthetic)
    )


def shift_eval(ctx: EvalContext) -> dict[str, Any]:
    return run_evaluator(ctx, "shift").results


def eval_context(corpus: CorpusData, encoding: str, valid: TokenStream | None = None) -> EvalContext:
    """fp32 on the CPU; batch_tokens=128 puts 2 windows per batch alone and 1 with a 64-token prefix."""
    return EvalContext(
        model=tiny_model(encoding),
        tokenizer=corpus.tokenizer,
        valid=corpus.streams["valid"] if valid is None else valid,
        device=torch.device("cpu"),
        dtype=None,
        train_len=TRAIN_LEN,
        cfg=EvalConfig(batch_tokens=128, progress=False, shift=SHIFT),
    )


def test_offsets_change_only_absolute_encodings_and_prefixes_change_all(
    corpus: CorpusData, encoding: str
) -> None:
    ctx = eval_context(corpus, encoding)
    results = shift_eval(ctx)
    windows = shift_windows(ctx.valid, TRAIN_LEN, SHIFT)
    logit_scale = scale_of(ctx.logits(windows.inputs, windows.sentence, windows.paragraph))  # the reference's
    loss_scale = math.log(VOCAB_SIZE)  # an untrained model's loss
    names = [f"offset{k}" for k in SHIFT.offsets] + [f"prefix{k}" for k in SHIFT.prefix_lengths]
    assert set(results) == {f"shift/{name}/{metric}" for name in names for metric in METRICS}
    for name in names:
        r = {metric: results[f"shift/{name}/{metric}"] for metric in METRICS}
        assert r["kl"] >= 0 and 0 <= r["top1_agree"] <= 1 and r["max_abs_logit"] >= 0, (name, r)
    for k in SHIFT.offsets:
        r = {metric: results[f"shift/offset{k}/{metric}"] for metric in METRICS}
        # relative encodings: float32 rounding only (RoPE: of its angles; observed ~2e-7 of the logits'
        # scale, and a loss change ~1e-8); 1e-5 = 84 EPS32 of either scale. Absolute ones differ by more than
        # 1e-4 of the logits' scale (FIRE, untrained and relative below its threshold, the least: ~7e-4)
        if ctx.model.encoding.relative_only:
            assert r["max_abs_logit"] <= 1e-5 * logit_scale and r["top1_agree"] == 1, (k, logit_scale, r)
            assert abs(r["dloss"]) <= 1e-5 * loss_scale, (k, r)
        elif k == max(SHIFT.offsets):  # FIRE is relative while positions stay below its threshold
            assert r["max_abs_logit"] > 1e-4 * logit_scale and r["kl"] > 0, (k, logit_scale, r)
    for k in SHIFT.prefix_lengths:  # observed >= 0.14 of the logits' scale
        r = {metric: results[f"shift/prefix{k}/{metric}"] for metric in METRICS}
        assert r["max_abs_logit"] > 1e-3 * logit_scale and r["kl"] > 0 and r["dloss"] != 0, (k, r)
    assert shift_eval(ctx) == results


def test_prefixed_structure_indices_continue_after_the_prefix() -> None:
    prefix = Prefix(
        tokens=torch.tensor([7, 8, 9]),
        sentence=torch.tensor([0, 1, 1]),
        paragraph=torch.zeros(3, dtype=torch.long),
    )
    windows = Batch(
        inputs=torch.tensor([[1, 2], [3, 4]]),
        targets=torch.tensor([[2, 5], [4, 6]]),
        sentence=torch.tensor([[0, 0], [0, 1]]),
        paragraph=torch.tensor([[0, 1], [0, 0]]),
    )
    inputs, sentence, paragraph = with_prefix(prefix, windows)
    assert inputs.tolist() == [[7, 8, 9, 1, 2], [7, 8, 9, 3, 4]]
    assert sentence.tolist() == [[0, 1, 1, 2, 2], [0, 1, 1, 2, 3]]
    assert paragraph.tolist() == [[0, 0, 0, 1, 2], [0, 0, 0, 1, 1]]


def test_windows_end_before_the_prefix_text_at_the_end_of_the_split() -> None:
    n = 100
    numbered = TokenStream(
        np.arange(n, dtype=np.uint16), np.zeros(n, np.int32), np.zeros(n, np.int32), "valid"
    )
    cfg = ShiftConfig(prefix_lengths=[8, 20], windows=3)
    windows = shift_windows(numbered, 16, cfg)
    assert windows.inputs.shape == (3, 16) and int(windows.targets.max()) < n - 20
    assert prefix_text(numbered, 8).tokens.tolist() == list(range(n - 8, n))
    assert len(prefix_text(numbered, 0)) == 0


def test_a_split_too_short_for_windows_and_prefixes_names_the_sizes(corpus: CorpusData) -> None:
    valid = corpus.streams["valid"]
    needed = SHIFT.windows * TRAIN_LEN + 1 + max(SHIFT.prefix_lengths)  # 3 * 64 + 1 + 64 = 257
    short = TokenStream(*(a[: needed - 1] for a in (valid.tokens, valid.sentence, valid.paragraph)), "valid")
    with pytest.raises(ConfigError, match=rf"needs {needed} tokens.*windows=3.*64 tokens.*has {needed - 1}"):
        shift_eval(eval_context(corpus, "nope", valid=short))
