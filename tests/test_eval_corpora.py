"""Further evaluation corpora (`eval.corpora`): read as documents, encoded with the run's tokenizer, scored
by the perplexity evaluator exactly as the run's own split is, under keys `NAME:...`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from report_runs import finished_run

from conftest import run_main, tiny_model, typed_config
from posab.data import CorpusData, TokenStream, eval_corpus_stream
from posab.data.corpora import load_eval_documents
from posab.data.streams import place_windows
from posab.errors import ConfigError
from posab.evaluate import EvalConfig, run_evaluations, run_evaluator
from posab.evaluate.context import EvalContext
from posab.evaluate.perplexity import PerplexityConfig
from posab.outputs import for_corpus
from posab.report.document import write_report
from posab.report.grouping import group_rows
from posab.report.rundirs import load_run
from posab.report.runs_csv import load_csv

WIKITEXT = (
    " \n = First = \n \n Text of the first article . \n = = Section = = \n More of it . \n"
    " = Second = \n \n The second one , with @-@ joins . \n = Third = \n Short . \n"
)


def folder_of_documents(tmp_path: Path, count: int = 3, size: int = 900) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(count):
        words = " ".join(f"word{(i * 7 + j) % 13}" for j in range(size // 6))
        (folder / f"doc{i}.txt").write_text(f"Document {i}.\n\n{words}.\n")
    return folder


def test_wikitext_files_are_read_as_their_articles(tmp_path: Path) -> None:
    path = tmp_path / "wiki.test.raw"
    path.write_text(WIKITEXT)
    docs = load_eval_documents(str(path), "wikitext", "eval.corpora[0]")
    assert [doc.splitlines()[0] for doc in docs] == [" = First = ", " = Second = ", " = Third = "]
    assert "= = Section = =" in docs[0]  # a section heading stays in its article


def test_a_text_folder_gives_one_document_per_file(tmp_path: Path) -> None:
    docs = load_eval_documents(str(folder_of_documents(tmp_path)), "text", "eval.corpora[0]")
    assert [doc.split(".")[0] for doc in docs] == ["Document 0", "Document 1", "Document 2"]


def test_the_stream_keeps_each_document_with_its_anchors(tmp_path: Path, corpus: CorpusData) -> None:
    folder = folder_of_documents(tmp_path)
    stream = eval_corpus_stream(str(folder), "text", corpus.tokenizer, "eval.corpora[0]")
    assert stream.document is not None and list(np.unique(stream.document)) == [0, 1, 2]
    one = corpus.tokenizer.encode((folder / "doc1.txt").read_text())
    np.testing.assert_array_equal(stream.tokens[stream.document == 1], one.tokens)  # BOS ... EOS included


def context(corpus: CorpusData, corpora: dict) -> EvalContext:
    sections = {"perplexity": PerplexityConfig(token_budget=256)}
    cfg = EvalConfig(lengths=[32, 64], batch_tokens=256, progress=False, **sections)
    for name in ("needle", "shift"):
        getattr(cfg, name).enabled = False
    model = tiny_model("alibi")
    valid = corpus.streams["valid"]
    cpu = torch.device("cpu")
    return EvalContext(model, corpus.tokenizer, valid, cpu, None, 32, cfg, corpora=corpora)  # type: ignore[arg-type]


def test_a_corpus_is_scored_exactly_as_the_split_is(tmp_path: Path, corpus: CorpusData) -> None:
    stream = eval_corpus_stream(str(folder_of_documents(tmp_path)), "text", corpus.tokenizer, "mine")
    ctx = context(corpus, {"mine": stream})
    output = run_evaluations(ctx)
    alone = for_corpus(run_evaluator(replace(ctx, valid=stream, corpora={}), "perplexity"), "mine")
    plain = run_evaluator(replace(ctx, corpora={}), "perplexity")
    for key, value in alone.scalars.items():
        if "time/" not in key:
            assert output.scalars[key] == value
    assert {k for k in plain.scalars if "time/" not in k} == {
        k.removeprefix("mine:") for k in alone.scalars if "time/" not in k
    }
    assert output.scalars["mine:ppl/64"] != output.scalars["ppl/64"]  # another text, another number
    arrays = output.arrays["mine.perplexity_windows"]
    assert {"mine:starts", "mine:documents", "mine:loss/64"} <= set(arrays)
    assert "mine.perplexity" in output.tables and "perplexity" in output.tables


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("{name: '2x', path: p}", r"eval.corpora\[0\].name='2x': use letters"),
        ("{name: a, path: p, format: csv}", r"eval.corpora\[0\].format='csv': use text or wikitext"),
        ("{name: windows, path: p}", r"eval.corpora\[0\].name='windows': .* other than windows and curve"),
    ],
)
def test_a_bad_entry_names_the_value_and_what_is_valid(entry: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        typed_config([f"eval.corpora=[{entry}]"])


def test_a_name_given_twice_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"each name once; \['a'\]"):
        typed_config(["eval.corpora=[{name: a, path: p}, {name: a, path: q}]"])


def test_a_missing_corpus_fails_before_training(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.raw"
    with pytest.raises(ConfigError, match=r"eval.corpora\[0\].path='.*nowhere.raw' does not exist"):
        entry = f"eval.corpora=[{{name: w, path: '{missing}', format: wikitext}}]"
        run_main(["+experiment=tiny", f"data.cache_dir={tmp_path / 'cache'}", entry], tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoint.pt").exists()  # nothing trained


def test_a_run_writes_the_corpus_metrics_and_files(tmp_path: Path) -> None:
    path = tmp_path / "wiki.test.raw"
    path.write_text(WIKITEXT * 60)  # 180 short articles: windows span several of them
    entry = f"eval.corpora=[{{name: wiki, path: '{path}', format: wikitext}}]"
    overrides = ["+experiment=tiny", f"data.cache_dir={tmp_path / 'cache'}", "train.steps=2", entry]
    results = run_main(overrides, tmp_path / "run")
    assert results["eval"]["wiki:ppl/256"] > 0 and "wiki:loss_tail/256" in results["eval"]
    saved = np.load(tmp_path / "run" / "wiki.perplexity_windows.npz")
    assert saved["wiki:loss/256"].shape == saved["wiki:documents"].shape
    run = load_run(tmp_path / "run")  # the report reads the corpus's windows beside the split's
    assert run.corpus_windows["wiki"].starts == saved["wiki:starts"].tolist()
    assert run.corpus_windows["wiki"].documents == saved["wiki:documents"].tolist()
    assert len(run.windows["wiki:loss/256"]) == len(saved["wiki:loss/256"]) and "loss/256" in run.windows
    report = write_report([run], tmp_path / "report").read_text()
    headers = [line for line in report.splitlines() if line.startswith("| encoding")]
    assert any("| wiki ppl@256 |" in line for line in headers)  # the corpus has its own columns
    (back,) = load_csv(tmp_path / "report" / "runs.csv")
    assert (back.corpus_windows, back.windows) == (run.corpus_windows, run.windows)


def test_runs_with_and_without_a_further_corpus_share_a_row() -> None:
    """A further corpus adds its own keys and never changes the split's numbers: not a row of its own."""
    corpora = "[{'name': 'wikitext2', 'path': 'wiki.test.raw', 'format': 'wikitext'}]"
    runs = [
        finished_run("a", "alibi", 0, "s", {"eval.corpora": "[]"}, {"ppl/512": 5.0}),
        finished_run("b", "alibi", 1, "s", {"eval.corpora": corpora}, {"ppl/512": 5.1, "wiki:ppl/512": 9.0}),
    ]
    (row,) = group_rows(runs)["s"]
    assert row.label == "alibi" and [r.name for r in row.runs] == ["a", "b"]


@pytest.mark.parametrize(
    ("begin", "end", "length", "per", "expected"),
    [
        (0, 100, 10, 2, [22, 66]),  # room 89: starts at 1/4 and 3/4 of it, rounded down
        (50, 61, 10, 2, [50]),  # room 0: one window, flush with both ends
        (0, 10, 10, 2, []),  # 10 tokens cannot hold 10 inputs and a target
        (0, 31, 10, 5, [5, 15]),  # room 20 holds two windows 10 apart, not five
    ],
)
def test_windows_are_placed_inside_a_document_at_fixed_fractions(
    begin: int, end: int, length: int, per: int, expected: list[int]
) -> None:
    assert place_windows(begin, end, length, per).tolist() == expected


def test_each_document_gets_its_own_windows_and_none_crosses_a_document_end() -> None:
    sizes = [500, 40, 130, 2000]  # the second document is too short for one window of 64
    document = np.repeat(np.arange(len(sizes)), sizes).astype(np.int32)  # (N,)
    tokens = np.zeros(len(document), dtype=np.uint16)
    stream = TokenStream(tokens, tokens, tokens, "books", document=document, windows_per_document=3)
    starts = stream.evaluation_windows(64, count=1)  # the count is the whole stream's rule, not this one
    windows = document[starts[:, None] + np.arange(65)[None, :]]  # (N, 65): inputs and target
    assert (windows == windows[:, :1]).all()  # every token of a window in one document
    assert np.bincount(windows[:, 0], minlength=4).tolist() == [3, 0, 1, 3]
    assert (np.diff(starts) >= 64).all()  # non-overlapping, in stream order


def test_windows_per_document_must_be_positive() -> None:
    with pytest.raises(ConfigError, match=r"eval.corpora\[0\].windows_per_document=0: use a positive count"):
        typed_config(["eval.corpora=[{name: a, path: p, windows_per_document: 0}]"])


def test_a_corpus_scored_per_document_has_its_windows_in_its_documents(tmp_path: Path) -> None:
    folder = folder_of_documents(tmp_path, count=4, size=1200)
    entry = f"eval.corpora=[{{name: books, path: '{folder}', windows_per_document: 2}}]"
    overrides = ["+experiment=tiny", f"data.cache_dir={tmp_path / 'cache'}", "train.steps=2", entry]
    results = run_main(overrides, tmp_path / "run")
    saved = np.load(tmp_path / "run" / "books.perplexity_windows.npz")
    assert saved["books:documents"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert results["eval"]["books:ppl_windows/256"] == 8  # each length scores the same 8 windows' tokens
