"""The report on evaluation corpora (`eval.corpora`): paired differences, flat counts and columns per corpus,
from the runs that scored it; and a claims file, whose comparisons Holm corrects as a family of their own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from report_runs import finished_run

from posab.report.claims import CLAIMS_FAMILY, Claim, read_claims
from posab.report.cli import main as report_cli
from posab.report.flat import flat_counts, flat_section
from posab.report.grouping import group_rows
from posab.report.records import CorpusWindows, ReportError, RunRecord
from posab.report.resampling import holm
from posab.report.runs_csv import load_csv, write_csv
from posab.report.stats import ORDERED, PAIRED_METRICS, SUGGESTIVE, paired_differences

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


def test_a_corpus_is_compared_on_the_runs_that_scored_it_in_its_own_family() -> None:
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
    assert rope["p_seeds"] == pytest.approx(2 / 6)  # 2 vs 2 seeds on the corpus: 1/3 at best
    assert set(corpus["family"]) == {f"nope | loss/64 | {CORPUS}"} and set(split["family"]) == {
        "nope | loss/64"
    }
    for _, family in frame.groupby("family"):  # Holm never mixes the corpora
        assert family["p_holm"].tolist() == pytest.approx(holm(family["p_seeds"].tolist()))


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
    metrics = {f"ppl/{n}": v for n, v in zip((512, 1024, 2048), split, strict=True)}
    if corpus:
        metrics |= {f"{CORPUS}:ppl/{n}": v for n, v in zip((512, 1024, 2048), corpus, strict=True)}
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
    assert section.count("Legend:") == 1


def test_the_claims_are_one_family_and_the_rest_keep_theirs() -> None:
    """Seven rows 5 vs 5 fully separated from nope: p = 2/252 each. Over all seven, Holm gives 7 x 2/252 =
    0.056: suggestive. Two of them stated as claims: 2 x 2/252 = 0.016, ordered; the other five, a family of
    five, 5 x 2/252 = 0.040."""
    rows = group_rows(grid(ENCODINGS, corpus_from=5))
    everything = paired_differences(rows, references=["nope"]).frame
    assert everything["p_holm"].tolist() == pytest.approx([7 * 2 / 252] * 7)
    assert set(everything["verdict"]) == {SUGGESTIVE}
    claims = [Claim("rope", "nope", "loss", 64), Claim("t5", "nope", "loss", 64)]
    frame = paired_differences(rows, references=["nope"], claims=claims).frame
    claimed = frame[frame["family"] == CLAIMS_FAMILY]
    assert sorted(claimed["row"]) == ["rope", "t5"]
    assert claimed["p_holm"].tolist() == pytest.approx([2 * 2 / 252] * 2) and set(claimed["verdict"]) == {
        ORDERED
    }
    rest = frame[frame["family"] != CLAIMS_FAMILY]
    assert rest["p_holm"].tolist() == pytest.approx([5 * 2 / 252] * 5)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_claims_file_is_read_and_its_mistakes_are_named(tmp_path: Path) -> None:
    good = write(
        tmp_path / "claims.csv",
        "row,reference,metric,length,corpus\nrope,nope,loss,64,\nt5,nope,loss_tail,4096,wikitext2\n",
    )
    assert read_claims(good, PAIRED_METRICS) == [
        Claim("rope", "nope", "loss", 64),
        Claim("t5", "nope", "loss_tail", 4096, "wikitext2"),
    ]
    bad = {
        "row,reference,metric\nrope,nope,loss\n": r"no column \['length'\]",
        "row,reference,metric,length\nrope,nope,ppl,64\n": "metric 'ppl'; metrics: loss, loss_tail",
        "row,reference,metric,length\nrope,nope,loss,sixty\n": "line 2: length 'sixty' is not a positive",
    }
    for text, message in bad.items():
        with pytest.raises(ReportError, match=message):
            read_claims(write(tmp_path / "bad.csv", text), PAIRED_METRICS)
    rows = group_rows(grid(("nope", "rope"), seeds=2, corpus_from=2))
    with pytest.raises(ReportError, match=r"`fire` vs `nope`, loss/64 names no comparison.*rows: \['rope'\]"):
        paired_differences(rows, references=["nope"], claims=[Claim("fire", "nope", "loss", 64)])


def test_the_command_line_takes_a_claims_file_and_a_bad_one_writes_nothing(tmp_path: Path) -> None:
    runs = grid(("nope", "rope", "t5"), seeds=3, corpus_from=3)
    write_csv(runs, tmp_path / "runs.csv")
    claims = write(tmp_path / "claims.csv", "row,reference,metric,length\nrope,nope,loss,64\n")
    assert (
        report_cli(
            [str(tmp_path), "--out", str(tmp_path / "out"), "--references", "nope", "--claims", str(claims)]
        )
        == 0
    )
    frame = pd.read_csv(tmp_path / "out" / "paired_differences.csv", keep_default_na=False)
    assert frame[frame["family"] == CLAIMS_FAMILY]["row"].tolist() == ["rope"]
    assert "(0.100, claim)" in (tmp_path / "out" / "report.md").read_text()
    wrong = write(tmp_path / "wrong.csv", "row,reference,metric,length\nkerple,nope,loss,64\n")
    assert report_cli([str(tmp_path), "--out", str(tmp_path / "none"), "--claims", str(wrong)]) == 2
    assert not (tmp_path / "none").exists()
