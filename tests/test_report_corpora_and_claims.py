"""The report on evaluation corpora (`eval.corpora`): paired differences, flat counts and columns per corpus,
from the runs that scored it; and the claim verdicts a report takes (`posab report --claims`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from report_runs import finished_run

from posab.report.cli import main as report_cli
from posab.report.flat import flat_counts, flat_section
from posab.report.grouping import group_rows
from posab.report.records import CorpusWindows, RunRecord
from posab.report.runs_csv import load_csv, write_csv
from posab.report.stats import SUGGESTIVE, paired_differences

CORPUS = "wikitext2"
STARTS = [1000 * i for i in range(8)]
DOCUMENTS = [0, 0, 1, 1, 2, 2, 3, 3]
ENCODINGS = ("nope", "alibi", "rope", "t5", "fire", "kerple", "learned", "sinusoidal")


def run(encoding: str, seed: int, shift: float, scored_corpus: bool) -> RunRecord:
    """A run of study `s` scoring 8 windows of `eval.split` (loss 3 + shift + noise) and, if `scored_corpus`,
    8 windows of CORPUS in 4 documents (loss 4 + 2 x shift + noise)."""
    rng = np.random.default_rng([seed, len(encoding)])
    split = 3.0 + shift + rng.normal(0.0, 0.002, size=8)  # (W,)
    windows = {"loss/64": [float(f"{v:.7g}") for v in split]}
    corpus_windows = {}
    metrics = {"ppl/64": float(np.exp(split.mean()))}
    if scored_corpus:
        other = 4.0 + 2 * shift + rng.normal(0.0, 0.002, size=8)  # (W,)
        windows[f"{CORPUS}:loss/64"] = [float(f"{v:.7g}") for v in other]
        corpus_windows[CORPUS] = CorpusWindows([7 * s for s in STARTS], DOCUMENTS)
    fields = {"windows": windows, "window_starts": STARTS, "window_documents": [0] * 4 + [1] * 4}
    return finished_run(
        f"{encoding}-{seed}", encoding, seed, "s", None, metrics, corpus_windows=corpus_windows, **fields
    )


def grid(encodings: tuple[str, ...], seeds: int = 5, corpus_from: int = 3) -> list[RunRecord]:
    """`seeds` runs of each encoding, the i-th encoding 0.05 x i above the first; seeds >= `corpus_from`
    also scored CORPUS (as a grid that gained a corpus in its fourth seed)."""
    return [
        run(encoding, seed, 0.05 * i, seed >= corpus_from)
        for i, encoding in enumerate(encodings)
        for seed in range(seeds)
    ]


def test_a_corpus_is_compared_on_the_runs_that_scored_it() -> None:
    runs = grid(("nope", "alibi", "rope"))
    frame = paired_differences(group_rows(runs), references=["nope"]).frame
    split, corpus = frame[frame["corpus"] == ""], frame[frame["corpus"] == CORPUS]
    assert set(split["seeds_row"]) == {5} and set(corpus["seeds_row"]) == {2}
    assert set(corpus["documents"]) == {4} and set(split["documents"]) == {2}
    rope = corpus[corpus["row"] == "rope"].iloc[0]
    by_hand = [
        np.mean([r.windows[f"{CORPUS}:loss/64"] for r in runs if r.encoding == e and r.seed >= 3])
        for e in ("rope", "nope")
    ]
    assert rope["difference"] == pytest.approx(by_hand[0] - by_hand[1], abs=1e-9)  # about 2 x 0.1
    assert rope["p_seeds"] == pytest.approx(2 / 4)  # 2 seed-matched pairs on the corpus: 1/2 at best
    assert set(frame["design"]) == {"seed-matched"} and set(frame["family"]) == {"exploratory"}


def test_corpus_windows_survive_runs_csv(tmp_path: Path) -> None:
    runs = grid(("nope", "rope"), seeds=2, corpus_from=1)
    write_csv(runs, tmp_path / "runs.csv")
    back = load_csv(tmp_path / "runs.csv")
    assert [r.corpus_windows for r in back] == [r.corpus_windows for r in runs]
    assert [r.windows for r in back] == [r.windows for r in runs]
    header = pd.read_csv(tmp_path / "runs.csv", nrows=0).columns.tolist()
    assert f"{CORPUS}:window_starts" in header and f"{CORPUS}:window_documents" in header
    assert not any(k.startswith(CORPUS) for r in back for k in r.metrics if "window" in k)


def ppl_run(encoding: str, seed: int, split: list[float], corpus: list[float] | None) -> RunRecord:
    """A run trained at 512 with these perplexities at 512, 1,024 and 2,048 (past 512, its tail's too) on
    the split and, if given, on CORPUS."""
    metrics = {f"ppl/{n}": v for n, v in zip((512, 1024, 2048), split, strict=True)}
    metrics |= {f"ppl_tail/{n}": v for n, v in zip((1024, 2048), split[1:], strict=True)}
    if corpus:
        metrics |= {f"{CORPUS}:ppl/{n}": v for n, v in zip((512, 1024, 2048), corpus, strict=True)}
        metrics |= {f"{CORPUS}:ppl_tail/{n}": v for n, v in zip((1024, 2048), corpus[1:], strict=True)}
    return finished_run(f"{encoding}-{seed}", encoding, seed, "s", {"train.seq_len": "512"}, metrics)


def test_flat_is_counted_per_corpus_over_the_runs_that_scored_it() -> None:
    runs = [
        ppl_run("alibi", 0, [5.0, 5.0, 5.1], None),
        ppl_run("alibi", 1, [5.0, 5.0, 5.0], [9.0, 9.1, 12.0]),  # flat on the split, breaks on the corpus
        ppl_run("alibi", 2, [5.0, 5.1, 5.1], [9.0, 9.0, 9.2]),
    ]
    rows = group_rows(runs)["s"]
    (split,), (corpus,) = flat_counts(rows), flat_counts(rows, CORPUS)
    assert (split.k, split.n) == (3, 3) and (corpus.k, corpus.n) == (1, 2)
    section = "\n".join(flat_section("s", rows))
    assert f"(study s) on `{CORPUS}`" in section and "flat in 1 of 2 runs on" in section
    assert "| 1 | 9.00 | 9.10 | 12.00 | no | 1.333 |" in section  # seed 1's tail on the corpus
    assert "| alibi | 512 → 2048 (4×) | tail | 1 of 2 | [0.09, 0.91] | 1 / 1 / 1 |" in section
    assert section.count("Legend:") == 1


def test_an_exploratory_comparison_has_no_holm_family_that_the_folder_makes() -> None:
    """Seven rows, 5 seed-matched pairs each fully on one side of nope: each is its own test (sign-flip,
    1/16), never adjusted by the rows beside it and never ordered; claims get their verdicts elsewhere
    (`posab claims`, tests/test_claims.py)."""
    rows = group_rows(grid(ENCODINGS, corpus_from=5))
    everything = paired_differences(rows, references=["nope"]).frame
    assert everything["p_seeds"].tolist() == pytest.approx([1 / 16] * 7)
    assert everything["p_holm"].isna().all() and set(everything["family"]) == {"exploratory"}
    assert set(everything["verdict"]) == {SUGGESTIVE}


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_command_line_takes_claim_verdicts_and_a_missing_file_writes_nothing(tmp_path: Path) -> None:
    runs = grid(("nope", "rope", "t5"), seeds=3, corpus_from=3)
    write_csv(runs, tmp_path / "runs.csv")
    assert report_cli([str(tmp_path), "--out", str(tmp_path / "plain"), "--references", "nope"]) == 0
    plain = pd.read_csv(tmp_path / "plain" / "paired_differences.csv", keep_default_na=False, dtype=str)
    rope = plain[(plain["row"] == "rope") & (plain["corpus"] == "")].iloc[0]
    verdicts = write(
        tmp_path / "verdicts.csv",
        f"claim,family,comparison,p_holm,verdict\np.1,p,{rope['comparison']},0.125,suggestive\n",
    )
    arguments = [str(tmp_path), "--out", str(tmp_path / "out"), "--references", "nope", "--claims"]
    assert report_cli([*arguments, str(verdicts)]) == 0
    frame = pd.read_csv(tmp_path / "out" / "paired_differences.csv", keep_default_na=False)
    assert frame[frame["family"] == "p"]["row"].tolist() == ["rope"]
    assert "(p.1: Holm 0.125)" in (tmp_path / "out" / "report.md").read_text()
    missing = [str(tmp_path), "--out", str(tmp_path / "none"), "--claims", str(tmp_path / "no.csv")]
    assert report_cli(missing) == 2
    assert not (tmp_path / "none").exists()
