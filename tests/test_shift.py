"""Shift stability: offsets leave relative-only encodings unchanged; unrelated prefixes and real context
change every encoding, within the training length."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from conftest import tiny_model, typed_config
from posab.build import max_positions
from posab.catalog import shift as shift_columns
from posab.data import Batch, CorpusData, DataConfig, SyntheticConfig, TokenStream, prepare_data
from posab.data.tokenizer import VOCAB_SIZE
from posab.errors import ConfigError
from posab.evaluate import EvalConfig, run_evaluator
from posab.evaluate.context import EvalContext
from posab.evaluate.shift import (
    Agreement,
    Prefix,
    Shift,
    ShiftConfig,
    alone,
    compared,
    forward_rows,
    prefix_texts,
    shift_windows,
    tail,
    with_prefix,
)
from tolerances import scale_of

TRAIN_LEN = 64
SHIFT = ShiftConfig(offsets=[1, 64, 1000], prefix_lengths=[16, 48], prefixes=2, windows=3)
METRICS = ("max_abs_logit", "kl", "top1_agree", "dloss")
KINDS = ("offset", "prefix", "context")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> CorpusData:
    synthetic = SyntheticConfig(vocab_size=300, train_docs=4, valid_docs=3, test_docs=2)
    return prepare_data(
        DataConfig(cache_dir=str(tmp_path_factory.mktemp("shift") / "cache"), synthetic=synthetic)
    )


class Recorder(nn.Module):
    """Runs `inner` and records the (tokens, offset) of every forward pass."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls: list[tuple[Tensor, int]] = []

    def forward(
        self, tokens: Tensor, sentence: Tensor, paragraph: Tensor, offset: int = 0, **_: Any
    ) -> Tensor:
        self.calls.append((tokens.clone(), offset))
        return self.inner(tokens, sentence, paragraph, offset=offset)


class CurrentToken(nn.Module):
    """Logits from the current token alone (B, T) -> (B, T, V): no context, no position."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0)))

    def forward(self, tokens: Tensor, *_: Any, **__: Any) -> Tensor:
        return self.table[tokens]  # (B, T) -> (B, T, V)


class Copy(nn.Module):
    """Predicts the token `lag` positions back, confidently (logit 20); uniform where the input has none."""

    def __init__(self, vocab: int, lag: int) -> None:
        super().__init__()
        self.vocab, self.lag = vocab, lag

    def forward(self, tokens: Tensor, *_: Any, **__: Any) -> Tensor:
        logits = torch.zeros(*tokens.shape, self.vocab)  # (B, T, V)
        logits[:, self.lag :] = 20.0 * nn.functional.one_hot(tokens[:, : -self.lag], self.vocab).float()
        return logits


def shift_eval(ctx: EvalContext) -> dict[str, Any]:
    return run_evaluator(ctx, "shift").results


def eval_context(
    corpus: CorpusData, model: nn.Module, valid: TokenStream | None = None, shift: ShiftConfig = SHIFT
) -> EvalContext:
    """fp32 on the CPU; batch_tokens=128 puts 2 windows of 64 tokens in a batch."""
    return EvalContext(
        model=model,  # type: ignore[arg-type]
        tokenizer=corpus.tokenizer,
        valid=corpus.streams["valid"] if valid is None else valid,
        device=torch.device("cpu"),
        dtype=None,
        train_len=TRAIN_LEN,
        cfg=EvalConfig(batch_tokens=128, progress=False, shift=shift),
    )


def metrics_of(results: dict[str, Any], kind: str, k: int) -> dict[str, float]:
    return {metric: results[f"shift/{kind}{k}/{metric}"] for metric in METRICS}


def test_offsets_change_only_absolute_encodings_and_prefixes_and_context_change_all(
    corpus: CorpusData, encoding: str
) -> None:
    ctx = eval_context(corpus, tiny_model(encoding))
    results = shift_eval(ctx)
    windows = shift_windows(ctx.valid, TRAIN_LEN, SHIFT)
    logit_scale = scale_of(ctx.logits(windows.inputs, windows.sentence, windows.paragraph))  # the reference's
    loss_scale = math.log(VOCAB_SIZE)  # an untrained model's loss
    shifts = [("offset", k) for k in SHIFT.offsets]
    shifts += [(kind, k) for kind in ("prefix", "context") for k in SHIFT.prefix_lengths]
    assert set(results) == {f"shift/{kind}{k}/{metric}" for kind, k in shifts for metric in METRICS}
    for kind, k in shifts:
        r = metrics_of(results, kind, k)
        assert r["kl"] >= 0 and 0 <= r["top1_agree"] <= 1 and r["max_abs_logit"] >= 0, (kind, k, r)
    for k in SHIFT.offsets:
        r = metrics_of(results, "offset", k)
        # relative encodings: float32 rounding only (RoPE: of its angles; observed ~2e-7 of the logits'
        # scale, and a loss change ~1e-8); 1e-5 = 84 EPS32 of either scale. Absolute ones differ by more than
        # 1e-4 of the logits' scale (FIRE, untrained and relative below its threshold, the least: ~7e-4)
        if ctx.model.encoding.relative_only:
            assert r["max_abs_logit"] <= 1e-5 * logit_scale and r["top1_agree"] == 1, (k, logit_scale, r)
            assert abs(r["dloss"]) <= 1e-5 * loss_scale, (k, r)
        elif k == max(SHIFT.offsets):  # FIRE is relative while positions stay below its threshold
            assert r["max_abs_logit"] > 1e-4 * logit_scale and r["kl"] > 0, (k, logit_scale, r)
    for kind in ("prefix", "context"):  # other tokens before the scored ones change every encoding
        for k in SHIFT.prefix_lengths:
            r = metrics_of(results, kind, k)
            assert r["max_abs_logit"] > 1e-3 * logit_scale and r["kl"] > 0 and r["dloss"] != 0, (kind, k, r)
    assert shift_eval(eval_context(corpus, tiny_model(encoding))) == results  # deterministic


def test_every_input_stays_within_the_training_length_and_each_prefix_text_is_distinct(
    corpus: CorpusData,
) -> None:
    model = Recorder(tiny_model("alibi"))
    ctx = eval_context(corpus, model)
    shift_eval(ctx)
    windows = shift_windows(ctx.valid, TRAIN_LEN, SHIFT)
    lengths = {tokens.shape[1] for tokens, _ in model.calls}
    assert lengths == {TRAIN_LEN, *(TRAIN_LEN - k for k in SHIFT.prefix_lengths)}, lengths
    assert {offset for _, offset in model.calls} == {0, *SHIFT.offsets}
    seen = Counter(
        tuple(row.tolist())
        for tokens, offset in model.calls
        if offset == 0
        for row in tokens
        if len(row) == TRAIN_LEN
    )
    expected = Counter(tuple(w.tolist()) for w in windows.inputs)  # the whole windows: offsets, context
    valid, block = ctx.valid.tokens, max(SHIFT.prefix_lengths)
    for k in SHIFT.prefix_lengths:
        texts = {tuple(valid[len(valid) - j * block - k :][:k].tolist()) for j in range(SHIFT.prefixes)}
        assert len(texts) == SHIFT.prefixes  # distinct texts, ending 0, 48, ... tokens before the split's end
        expected.update(text + tuple(w[k:].tolist()) for text in texts for w in windows.inputs)
    assert seen == expected  # each prefix text once before every window's tail, nothing else


def test_prefix_metrics_average_over_the_prefix_texts(corpus: CorpusData) -> None:
    ctx = eval_context(corpus, tiny_model("rope"))
    results = shift_eval(ctx)
    windows = shift_windows(ctx.valid, TRAIN_LEN, SHIFT)
    for k in SHIFT.prefix_lengths:
        scored = tail(windows, k)
        reference = alone(ctx, scored)  # (W, T - k, V), batched as the evaluator batches it
        each = [
            compared(Agreement(), reference, scored, forward_rows(ctx, scored, text, 0)).values()
            for text in prefix_texts(ctx.valid, k, SHIFT)
        ]
        assert len({r["dloss"] for r in each}) == SHIFT.prefixes, each  # every text changes the loss its way
        r = metrics_of(results, "prefix", k)
        assert r["max_abs_logit"] == max(e["max_abs_logit"] for e in each)
        for metric in ("kl", "top1_agree", "dloss"):  # means of sums over equal position counts
            mean = sum(e[metric] for e in each) / len(each)
            assert abs(r[metric] - mean) <= 1e-9 * max(abs(mean), 1.0), (k, metric, r, each)


def test_a_model_of_the_current_token_alone_gives_zero_for_every_shift(corpus: CorpusData) -> None:
    results = shift_eval(eval_context(corpus, CurrentToken(VOCAB_SIZE)))
    for kind in KINDS:
        for k in SHIFT.offsets if kind == "offset" else SHIFT.prefix_lengths:
            r = metrics_of(results, kind, k)
            assert r == {"max_abs_logit": 0.0, "kl": 0.0, "top1_agree": 1.0, "dloss": 0.0}, (kind, k, r)


def periodic_stream(n: int, period: int) -> TokenStream:
    """Tokens period..2 period - 1 in a fixed shuffled order, repeated: the next token is the one period - 1
    back; token 0 (the argmax of uniform logits) never occurs."""
    order = (period + np.random.default_rng(0).permutation(period)).astype(np.uint16)
    zeros = np.zeros(n, np.int32)
    return TokenStream(np.resize(order, n), zeros, zeros, "valid")


def test_real_preceding_text_lowers_the_loss_of_a_model_that_reads_it(corpus: CorpusData) -> None:
    period, vocab = 8, 16  # tokens 8..15
    stream = periodic_stream(400, period)
    results = shift_eval(eval_context(corpus, Copy(vocab, lag=period - 1), valid=stream))
    for k in SHIFT.prefix_lengths:
        # alone, the first period - 1 scored tokens have nothing to copy (loss log V); after the real
        # context every token is copied (loss ~0: 15 e^-20 ~ 3e-8, below float32 rounding of 1)
        expected = -(period - 1) * math.log(vocab) / (TRAIN_LEN - k)
        r = metrics_of(results, "context", k)
        assert abs(r["dloss"] - expected) <= 1e-5 * math.log(vocab), (k, r, expected)
        assert r["kl"] > 0 and r["top1_agree"] == pytest.approx(
            (TRAIN_LEN - k - period + 1) / (TRAIN_LEN - k)
        )


@pytest.mark.parametrize(
    ("shift", "train_len", "expected"),
    [
        ({"prefix_lengths": [16, 0]}, None, r"eval\.shift\.prefix_lengths=\[16, 0\].*>= 1.*bad: \[0\]"),
        ({"prefix_lengths": [-3]}, None, r"eval\.shift\.prefix_lengths=\[-3\].*bad: \[-3\]"),
        ({"prefixes": 0}, None, r"eval\.shift\.prefixes=0 must be positive"),
        ({"offsets": [-1]}, None, r"eval\.shift\.offsets=\[-1\].*>= 0"),
        ({"windows": 0}, None, r"eval\.shift\.windows=0 must be positive"),
        (
            {"prefix_lengths": [16, 64]},
            64,
            r"eval\.shift\.prefix_lengths=\[16, 64\].*in 1\.\.63.*train\.seq_len=64.*bad: \[64\]",
        ),
    ],
)
def test_bad_settings_name_the_key(shift: dict[str, Any], train_len: int | None, expected: str) -> None:
    cfg = ShiftConfig(**{**SHIFT.__dict__, **shift})
    with pytest.raises(ConfigError, match=expected):
        if train_len is None:
            cfg.validate(EvalConfig())
        else:
            cfg.check_prefix_lengths(train_len)


def test_a_prefix_as_long_as_the_training_length_fails_before_any_work(corpus: CorpusData) -> None:
    model = Recorder(CurrentToken(VOCAB_SIZE))
    too_long = ShiftConfig(**{**SHIFT.__dict__, "prefix_lengths": [16, TRAIN_LEN]})
    with pytest.raises(ConfigError, match=rf"eval\.shift\.prefix_lengths.*train\.seq_len={TRAIN_LEN}"):
        shift_eval(eval_context(corpus, model, shift=too_long))
    assert model.calls == []
    with pytest.raises(ConfigError, match=r"eval\.shift\.prefix_lengths=\[16, 128\].*train\.seq_len=128"):
        max_positions(
            typed_config(["+experiment=tiny", "eval.shift.prefix_lengths=[16,128]"])
        )  # pre-training
    with pytest.raises(ConfigError, match=r"eval\.shift\.prefix_lengths"):
        Shift(too_long).positions(EvalConfig(), TRAIN_LEN)
    assert Shift(SHIFT).positions(EvalConfig(), TRAIN_LEN) == 1000 + TRAIN_LEN + 1  # prefixes add none


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


def test_the_scored_tail_restarts_its_structure_indices() -> None:
    windows = Batch(
        inputs=torch.tensor([[1, 2, 3, 4]]),
        targets=torch.tensor([[2, 3, 4, 5]]),
        sentence=torch.tensor([[0, 1, 1, 2]]),
        paragraph=torch.tensor([[0, 0, 1, 1]]),
    )
    scored = tail(windows, 2)
    assert scored.inputs.tolist() == [[3, 4]] and scored.targets.tolist() == [[4, 5]]
    assert scored.sentence.tolist() == [[0, 1]] and scored.paragraph.tolist() == [[0, 0]]


def test_windows_end_before_the_disjoint_prefix_texts_at_the_end_of_the_split() -> None:
    n = 200
    numbered = TokenStream(
        np.arange(n, dtype=np.uint16), np.zeros(n, np.int32), np.zeros(n, np.int32), "valid"
    )
    cfg = ShiftConfig(prefix_lengths=[8, 20], prefixes=3, windows=3)
    windows = shift_windows(numbered, 16, cfg)
    assert windows.inputs.shape == (3, 16) and int(windows.targets.max()) < n - 3 * 20
    texts = [p.tokens.tolist() for p in prefix_texts(numbered, 8, cfg)]
    assert texts == [list(range(n - j * 20 - 8, n - j * 20)) for j in range(3)]


def test_a_split_too_short_for_windows_and_prefixes_names_the_sizes(corpus: CorpusData) -> None:
    valid = corpus.streams["valid"]
    needed = SHIFT.windows * TRAIN_LEN + 1 + SHIFT.prefixes * max(SHIFT.prefix_lengths)  # 192 + 1 + 96 = 289
    short = TokenStream(*(a[: needed - 1] for a in (valid.tokens, valid.sentence, valid.paragraph)), "valid")
    with pytest.raises(ConfigError, match=rf"needs {needed} tokens.*windows=3.*64 tokens.*has {needed - 1}"):
        shift_eval(eval_context(corpus, CurrentToken(VOCAB_SIZE), valid=short))


def test_report_columns_name_the_largest_offset_prefix_and_context() -> None:
    new = {
        "shift/offset4096/kl",
        *(f"shift/{kind}{k}/dloss" for kind in ("prefix", "context") for k in (64, 256)),
    }
    headers = [(c.header, c.key) for c in shift_columns.report_columns(new)]
    assert headers == [
        ("KL offset 4096", "shift/offset4096/kl"),
        ("Δloss prefix 256", "shift/prefix256/dloss"),
        ("Δloss context 256", "shift/context256/dloss"),
    ]
