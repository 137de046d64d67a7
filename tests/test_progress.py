"""Progress bars where people wait: each counts its work to the end, shows nothing when its `progress`
setting is off or on a rank other than 0, and changes no number."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tqdm import tqdm

from conftest import tiny_model
from posab.data import CorpusData, DataConfig, SyntheticConfig, corpora, prepare_data
from posab.encodings import EncodingOptimizer
from posab.evaluate import EvalConfig, run_evaluator
from posab.evaluate.attention_analysis import AnalysisConfig
from posab.evaluate.context import EvalContext
from posab.evaluate.needle import NeedleConfig
from posab.evaluate.perplexity import PerplexityConfig, window_count
from posab.logging import NullLogger
from posab.passkey.stage import PasskeyStage, PasskeyStageConfig

LENGTHS = [32, 64, 128]
TRAIN_LEN = 64
Bars = dict[str, list[tuple[int, float]]]  # desc -> (n, total) of each bar shown, as it closed


@pytest.fixture
def bars(monkeypatch: pytest.MonkeyPatch) -> Bars:
    """Every bar that is shown, recorded when it closes (tqdm itself still draws it)."""
    shown: Bars = {}
    close = tqdm.close

    def recording_close(self: tqdm) -> None:
        if not self.disable:
            shown.setdefault(self.desc.removesuffix(": "), []).append((self.n, self.total))
        close(self)

    monkeypatch.setattr(tqdm, "close", recording_close)
    return shown


def context(corpus: CorpusData, progress: bool, **settings: object) -> EvalContext:
    cfg = EvalConfig(
        lengths=LENGTHS,
        batch_tokens=256,
        progress=progress,
        perplexity=PerplexityConfig(token_budget=512),
        **settings,  # type: ignore[arg-type]
    )
    valid = corpus.streams["valid"]
    model = tiny_model("alibi")
    return EvalContext(model, corpus.tokenizer, valid, torch.device("cpu"), None, TRAIN_LEN, cfg)  # type: ignore[arg-type]


def perplexity_numbers(ctx: EvalContext) -> dict[str, Any]:
    """The evaluator's results but its wall times."""
    results = run_evaluator(ctx, "perplexity").results
    return {k: v for k, v in results.items() if not k.startswith("time/")}


def test_perplexity_bars_count_lengths_and_the_batches_within_each(
    corpus: CorpusData, bars: Bars, capsys: pytest.CaptureFixture[str]
) -> None:
    ctx = context(corpus, progress=True)
    run_evaluator(ctx, "perplexity")
    windows = window_count(ctx.cfg.perplexity, max(LENGTHS))
    for length in LENGTHS:
        chunks = windows * max(LENGTHS) // length
        batches = math.ceil(chunks / ctx.batch_size(length))
        assert batches > 1
        assert bars[f"ppl L={length}"] == [(batches, batches)]
    assert bars["ppl capped L=128"] == [(1, 1)]  # L > T: the tail again in windows of T
    assert bars["perplexity"] == [(3, 3)]
    assert "ppl L=128" in capsys.readouterr().err


def test_no_bar_when_progress_is_off_or_off_rank_0(
    corpus: CorpusData, bars: Bars, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    shown = perplexity_numbers(context(corpus, progress=True))
    capsys.readouterr()
    bars.clear()
    off = perplexity_numbers(context(corpus, progress=False))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    rank_1 = perplexity_numbers(context(corpus, progress=True))
    assert capsys.readouterr().err == ""
    assert bars == {}
    assert off == shown == rank_1  # the bars change no number


def test_needle_bars_count_cells_and_batches(corpus: CorpusData, bars: Bars) -> None:
    needle = NeedleConfig(lengths=[128], depths=[0.0, 1.0], trials=3)
    ctx = context(corpus, progress=True, needle=needle)  # 2 examples of 128 per batch
    run_evaluator(ctx, "needle")
    assert bars["needle"] == [(2, 2)]
    assert bars["needle L=128"] == [(2, 2)] * 4  # keys and controls of each cell: 3 examples, 2 batches


def test_attention_analysis_bars_count_lengths_and_windows(corpus: CorpusData, bars: Bars) -> None:
    ctx = context(corpus, progress=True, analysis=AnalysisConfig(enabled=True, windows=2))
    run_evaluator(ctx, "analysis")
    assert bars["attention"] == [(3, 3)]
    assert all(bars[f"attention L={length}"] == [(2, 2)] for length in LENGTHS)


def test_tokenizing_counts_every_character(
    tmp_path: Path, bars: Bars, capsys: pytest.CaptureFixture[str]
) -> None:
    synthetic = SyntheticConfig(vocab_size=300, train_docs=2, valid_docs=1, test_docs=1)
    quiet = prepare_data(DataConfig(cache_dir=str(tmp_path / "a"), synthetic=synthetic, progress=False))
    assert capsys.readouterr().err == "" and bars == {}
    data = prepare_data(DataConfig(cache_dir=str(tmp_path / "b"), synthetic=synthetic, progress=True))
    assert "tokenizing train" in capsys.readouterr().err
    for split in ("train", "valid", "test"):
        ((done, total),) = bars[f"tokenizing {split}"]
        assert done == total > 0
        assert np.array_equal(quiet.streams[split].tokens, data.streams[split].tokens)


def test_hashing_counts_every_byte_and_keeps_the_digest(
    tmp_path: Path, bars: Bars, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = {"a.txt": "One sentence. Another one.\n\nA paragraph.\n", "b.txt": "Short.\n"}
    for name, text in texts.items():
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(corpora, "HASH_CHUNK", 5)  # several chunks per file
    identity = corpora.corpus_identity(DataConfig(source="text", path=str(tmp_path), progress=True))
    expected = [[name, hashlib.sha1(text.encode()).hexdigest()] for name, text in texts.items()]
    assert identity["files"] == {corpora.UNSPLIT: expected}
    size = sum(len(t.encode()) for t in texts.values())
    assert bars["hashing corpus"] == [(size, size)]


def test_the_passkey_stage_bar_shows_length_and_key_loss(
    corpus: CorpusData, bars: Bars, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = PasskeyStageConfig(
        enabled=True, lengths=[96, 128], steps=[2, 2], batch_tokens=256, log_every=1, probe_every=0
    )
    model = tiny_model("alibi")
    train = corpus.streams["train"]
    optim = EncodingOptimizer()
    stage = PasskeyStage(
        model, train, corpus.tokenizer, cfg, optim, 5, 0, NullLogger(), None, lambda state: None
    )
    stage.fit()
    err = capsys.readouterr().err
    assert bars["passkey"] == [(4, 4)]
    assert "length=128" in err and "key_loss=" in err
