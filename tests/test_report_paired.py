"""Paired-bootstrap differences between encodings: the statistic, the runs.csv columns it needs, and the
report section, on synthetic per-window losses (the tests themselves: test_report_statistics.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from report_runs import finished_run

from posab.report import main as report_main
from posab.report.cli import collect_runs
from posab.report.document import write_report
from posab.report.grouping import group_rows
from posab.report.records import RunRecord
from posab.report.rundirs import load_run
from posab.report.runs_csv import load_csv, write_csv
from posab.report.stats import paired_differences

STARTS = [0, 4096, 8192, 12288]
DOCUMENTS = [0, 0, 1, 1]  # the windows of STARTS lie in two documents
SECTION = "### Paired differences (study s)"


def record(
    encoding: str,
    seed: int,
    windows: dict[str, list[float]],
    starts: list[int] | None = None,
    metrics: dict[str, float] | None = None,
    documents: list[int] | None = None,
) -> RunRecord:
    """A finished run of study `s` with these per-window losses, rounded as a run directory's are, and
    (optionally) each window's document."""
    rounded = {k: [float(f"{v:.7g}") for v in values] for k, values in windows.items()}
    starts = list(STARTS if starts is None else starts)
    fields = {"windows": rounded, "window_starts": starts, "window_documents": list(documents or [])}
    return finished_run(f"{encoding}-{seed}", encoding, seed, "s", None, metrics, **fields)


def shifted_arms(shift: float, windows: int = 200, seeds: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """(seeds, W) losses of an arm and a reference: windows vary a lot (std 0.5), seeds little (0.01),
    and the arm is `shift` above the reference in every window."""
    rng = np.random.default_rng(1)
    difficulty = rng.normal(3.0, 0.5, size=windows)  # (W,)
    reference = difficulty + rng.normal(0.0, 0.01, size=(seeds, windows))  # (W,) -> (seeds, W)
    arm = difficulty + shift + rng.normal(0.0, 0.01, size=(seeds, windows))  # (W,) -> (seeds, W)
    return arm, reference


def runs_of(encoding: str, losses: np.ndarray, key: str = "loss/512") -> list[RunRecord]:
    """One run per seed (row of `losses`), each scoring the same W windows."""
    starts = [1000 * i for i in range(losses.shape[1])]
    return [record(encoding, seed, {key: row.tolist()}, starts) for seed, row in enumerate(losses)]


def unpaired_width(arm: np.ndarray, reference: np.ndarray, draws: int = 2000) -> float:
    """Width of the 95% interval when each row's windows are resampled on their own (no pairing)."""
    rng = np.random.default_rng(0)

    def means(losses: np.ndarray) -> np.ndarray:
        seeds = rng.integers(0, len(losses), size=(draws, len(losses)))  # (draws, seeds)
        windows = rng.integers(0, losses.shape[1], size=(draws, losses.shape[1]))  # (draws, W)
        by_window = losses[seeds].mean(axis=1)  # (draws, seeds, W) -> (draws, W)
        return np.take_along_axis(by_window, windows, axis=1).mean(axis=1)  # (draws, W) -> (draws,)

    low, high = np.percentile(means(arm) - means(reference), [2.5, 97.5])
    return float(high - low)


def line(frame: pd.DataFrame, row: str, reference: str, length: int, metric: str = "loss") -> pd.Series:
    """The one line of a paired-differences frame for this comparison."""
    match = frame[
        (frame["row"] == row)
        & (frame["reference"] == reference)
        & (frame["length"] == length)
        & (frame["metric"] == metric)
    ]
    assert len(match) == 1, match
    return match.iloc[0]


def test_a_constant_shift_is_found_with_an_interval_far_narrower_than_unpaired() -> None:
    arm, reference = shifted_arms(0.05)
    runs = runs_of("rope", arm) + runs_of("nope", reference)
    frame = paired_differences(group_rows(runs)).frame
    found = line(frame, "rope", "nope", 512)
    assert found["low"] < 0.05 < found["high"] and found["excludes_zero"]
    assert abs(found["difference"] - 0.05) < 0.005
    assert (found["seeds_row"], found["seeds_reference"], found["windows"]) == (3, 3, 200)
    width = found["high"] - found["low"]
    assert width < unpaired_width(arm, reference) / 3, (width, unpaired_width(arm, reference))


def test_identical_rows_differ_by_zero_both_ways() -> None:
    arm, _ = shifted_arms(0.0, windows=50, seeds=2)
    frame = paired_differences(group_rows(runs_of("alibi", arm) + runs_of("nope", arm))).frame
    assert sorted(zip(frame["row"], frame["reference"], strict=True)) == [
        ("alibi", "nope"),
        ("nope", "alibi"),
    ]
    for _, found in frame.iterrows():
        assert found["difference"] == 0.0
        assert found["low"] <= 0.0 <= found["high"] and not found["excludes_zero"]


def test_the_same_runs_give_the_same_frame() -> None:
    arm, reference = shifted_arms(0.02, windows=40)
    table = group_rows(runs_of("rope", arm) + runs_of("alibi", reference))
    first, second = paired_differences(table).frame, paired_differences(table).frame
    assert len(first) == 1
    pd.testing.assert_frame_equal(first, second, check_exact=True)


def synthetic_study(documents: list[int] | None = None) -> list[RunRecord]:
    """nope, alibi (2 seeds each) and rope (with a `pi` scaling view), trained at 64, evaluated at 64 and
    128 (tail beyond 64); with `documents`, each window's document."""
    rng = np.random.default_rng(2)
    difficulty = rng.normal(3.0, 0.5, size=len(STARTS))  # (W,)
    shifts = {"nope": 0.3, "alibi": 0.0, "rope": 0.02}
    runs = []
    for encoding, shift in shifts.items():
        for seed in range(2):
            noise = rng.normal(0.0, 0.01, size=(3, len(STARTS)))  # (keys, W)
            losses = difficulty + shift + noise  # (W,) + (keys, W) -> (keys, W)
            keys = ["loss/64", "loss/128", "loss_tail/128"]
            windows = {k: v.tolist() for k, v in zip(keys, losses, strict=True)}
            metrics = {"ppl/128": 20.0, "ppl@pi/128": 19.0} if encoding == "rope" else {"ppl/128": 21.0}
            runs.append(record(encoding, seed, windows, metrics=metrics, documents=documents))
    return runs


def test_every_row_but_scaling_views_is_compared_at_each_length() -> None:
    table = group_rows(synthetic_study())
    assert [row.label for row in table["s"]] == ["alibi", "nope", "rope", "rope + pi"]
    frame = paired_differences(table).frame
    pairs = list(dict.fromkeys(zip(frame["row"], frame["reference"], strict=True)))
    assert pairs == [("alibi", "nope"), ("nope", "alibi"), ("rope", "nope"), ("rope", "alibi")]
    keys = frame[(frame["row"] == "rope") & (frame["reference"] == "nope")][["length", "metric"]]
    assert keys.values.tolist() == [[64, "loss"], [128, "loss"], [128, "loss_tail"]]


def test_a_reference_tuned_to_its_own_rate_is_its_encodings_only_row() -> None:
    """Each encoding at its own learning rate: the labels show it, and `nope` and `alibi` still anchor the
    comparisons; an encoding with two rows (two rates) is no reference."""
    runs = []
    for run in synthetic_study():
        rate = {"nope": "0.003", "alibi": "0.001", "rope": "0.006"}[run.encoding]
        runs.append(replace(run, config={**run.config, "train.lr": rate}))
    table = group_rows(runs)
    assert [row.label for row in table["s"]][:2] == ["alibi, train.lr=0.001", "nope, train.lr=0.003"]
    frame = paired_differences(table).frame
    pairs = list(dict.fromkeys(zip(frame["row"], frame["reference"], strict=True)))
    nope, alibi, rope = "nope, train.lr=0.003", "alibi, train.lr=0.001", "rope, train.lr=0.006"
    assert pairs == [(alibi, nope), (nope, alibi), (rope, nope), (rope, alibi)]
    two_rates = [
        replace(r, config={**r.config, "train.lr": str(r.seed)}) if r.encoding == "nope" else r for r in runs
    ]
    frame = paired_differences(group_rows(two_rates)).frame
    assert set(frame["reference"]) == {alibi}


def cells(found: pd.Series) -> str:
    """The difference, interval, `excludes 0`, p-values and verdict cells of one comparison as the report
    writes them."""
    excludes = ("yes" if found["excludes_zero"] else "no") + (" (unstable)" if found["unstable"] else "")
    return (
        f"{found['difference']:+.3f} | [{found['low']:+.3f}, {found['high']:+.3f}] | {excludes} | "
        f"{found['p_seeds']:.3f} | {found['verdict']}"
    )


def test_the_report_shows_a_table_per_study_and_writes_the_csv(tmp_path: Path) -> None:
    runs = synthetic_study(DOCUMENTS)
    report = write_report(runs, tmp_path).read_text()
    lines = report.split(SECTION + "\n\n", 1)[1].splitlines()
    assert lines[0] == "Resampled: 2 documents holding 4 windows, and the seeds of each row."
    assert lines[2] == (
        "| encoding, swept values | vs | length | design | seeds | unmatched | Δ loss | 95% interval "
        "| excludes 0 | p seeds | verdict | Δ tail loss | 95% interval | excludes 0 | p seeds | verdict |"
    )
    frame = paired_differences(group_rows(runs)).frame
    none = "— | — | — | — | —"
    pair = "seed-matched | 2 vs 2 | precision?, cpu?, kernels?, commit?"  # these runs record no provenance
    assert f"| rope | alibi | 64 | {pair} | {cells(line(frame, 'rope', 'alibi', 64))} | {none} |" in lines
    long, tail = line(frame, "rope", "alibi", 128), line(frame, "rope", "alibi", 128, "loss_tail")
    assert f"| rope | alibi | 128 | {pair} | {cells(long)} | {cells(tail)} |" in lines
    nope = next(text for text in lines if text.startswith("| nope | alibi | 64 |"))
    assert nope.startswith(f"| nope | alibi | 64 | {pair} | +0.")  # shift 0.3
    assert nope.endswith("| yes | 0.500 | suggestive | — | — | — | — | — |")  # 2 pairs: p >= 1/2
    assert len([text for text in lines[4:] if text.startswith("|")]) == 8  # 4 pairs x 2 lengths
    assert report.index("## Study `s`") < report.index(SECTION) < report.index("## Plots")
    assert "hierarchical bootstrap" in report and "sign-flip test" in report
    assert "resamples the windows alone" not in report
    written = pd.read_csv(tmp_path / "paired_differences.csv")
    assert list(written.columns) == list(frame.columns)
    assert written[["row", "reference", "length", "metric"]].values.tolist() == (
        frame[["row", "reference", "length", "metric"]].values.tolist()
    )
    assert "- `paired_differences.csv`:" in report.split("## Files", 1)[1]


def test_a_report_read_back_from_runs_csv_gives_the_same_paired_differences(tmp_path: Path) -> None:
    runs = synthetic_study(DOCUMENTS)
    write_report(runs, tmp_path / "first")
    header = (tmp_path / "first" / "runs.csv").read_text().splitlines()[0].split(",")
    windows = ["windows:loss/64", "windows:loss/128", "windows:loss_tail/128"]
    assert header[-5:] == [*windows, "window_starts", "window_documents"]
    read_back = collect_runs([tmp_path / "first"])
    assert [r.windows for r in read_back] == [r.windows for r in runs]
    assert [r.window_starts for r in read_back] == [STARTS] * len(runs)
    assert [r.window_documents for r in read_back] == [DOCUMENTS] * len(runs)
    assert not any(k.startswith("window") for r in read_back for k in r.metrics)
    pd.testing.assert_frame_equal(
        paired_differences(group_rows(read_back)).frame,
        paired_differences(group_rows(runs)).frame,
        check_exact=True,
    )
    write_report(read_back, tmp_path / "second")
    for name in ("report.md", "runs.csv", "paired_differences.csv"):
        assert (tmp_path / "second" / name).read_text() == (tmp_path / "first" / name).read_text(), name


def test_a_run_directory_gives_its_windows_rounded_as_runs_csv_keeps_them(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(json.dumps({"experiment": "s", "seed": 0, "encoding": {"name": "nope"}}))
    (run / "results.json").write_text(json.dumps({"status": "finished", "encoding": "nope"}))
    losses = np.array([1.8658185, 1.7301248, 2.0], dtype=np.float32)
    starts, documents = np.array([0, 8, 16], dtype=np.int64), np.array([3, 3, 4], dtype=np.int64)
    np.savez(run / "perplexity_windows.npz", starts=starts, documents=documents, **{"loss/512": losses})
    loaded = load_run(run)
    assert loaded.windows == {"loss/512": [1.865819, 1.730125, 2.0]}  # `documents` is no loss
    assert (loaded.window_starts, loaded.window_documents) == ([0, 8, 16], [3, 3, 4])
    write_csv([loaded], tmp_path / "runs.csv")
    (back,) = load_csv(tmp_path / "runs.csv")
    assert (back.windows, back.window_starts, back.window_documents) == (
        loaded.windows,
        loaded.window_starts,
        loaded.window_documents,
    )
    np.savez(run / "perplexity_windows.npz", starts=starts, **{"loss/512": losses})  # before documents
    assert (load_run(run).window_starts, load_run(run).window_documents) == ([0, 8, 16], [])
    (run / "perplexity_windows.npz").unlink()
    without = load_run(run)
    assert (without.windows, without.window_starts, without.window_documents) == ({}, [], [])


def test_rows_that_scored_different_windows_are_not_compared(tmp_path: Path) -> None:
    arm, reference = shifted_arms(0.05, windows=len(STARTS), seeds=2)
    moved = [s + 1 for s in STARTS]
    runs = [record("rope", i, {"loss/64": row.tolist()}, moved) for i, row in enumerate(arm)]
    runs += [record("nope", i, {"loss/64": row.tolist()}) for i, row in enumerate(reference)]
    runs += [record("alibi", i, {"loss/64": row.tolist()}) for i, row in enumerate(reference)]
    paired = paired_differences(group_rows(runs))
    assert list(zip(paired.frame["row"], paired.frame["reference"], strict=True)) == [
        ("alibi", "nope"),
        ("nope", "alibi"),
    ]
    assert len(paired.notes["s"]) == 2
    assert all("`rope` vs" in note and "window_starts" in note for note in paired.notes["s"])
    assert "`nope`" in paired.notes["s"][0] and "`alibi`" in paired.notes["s"][1]
    section = write_report(runs, tmp_path).read_text().split(SECTION, 1)[1].split("## Plots", 1)[0]
    assert "Not compared:" in section and f"- {paired.notes['s'][0]}" in section


def test_no_references_or_no_windows_make_no_section_and_no_csv(tmp_path: Path) -> None:
    arm, reference = shifted_arms(0.05, windows=len(STARTS), seeds=1)
    without_references = runs_of("rope", arm, "loss/64") + runs_of("t5", reference, "loss/64")
    without_windows = [record(e, 0, {}, starts=[], metrics={"ppl/64": 2.0}) for e in ("nope", "alibi")]
    for name, runs in (("references", without_references), ("windows", without_windows)):
        paired = paired_differences(group_rows(runs))
        assert paired.frame.empty and not paired.notes, name
        report = write_report(runs, tmp_path / name).read_text()
        assert "Paired differences" not in report and "paired_differences.csv" not in report, name
        assert not (tmp_path / name / "paired_differences.csv").exists(), name
    header = (tmp_path / "windows" / "runs.csv").read_text().splitlines()[0]
    assert "window" not in header
    assert [r.windows for r in load_csv(tmp_path / "windows" / "runs.csv")] == [{}, {}]


def test_a_row_named_on_the_command_line_is_a_reference_too(tmp_path: Path) -> None:
    """`--references nope rope`: every row against nope and rope (an ablation against its full model); a
    name that is no row is an error that lists the rows, and nothing is written."""
    runs = synthetic_study()
    write_csv(runs, tmp_path / "runs.csv")
    out = tmp_path / "report"
    assert report_main([str(tmp_path), "--out", str(out), "--references", "nope", "rope"]) == 0
    frame = pd.read_csv(out / "paired_differences.csv")
    pairs = list(dict.fromkeys(zip(frame["row"], frame["reference"], strict=True)))
    assert pairs == [("alibi", "nope"), ("alibi", "rope"), ("nope", "rope"), ("rope", "nope")]
    assert "vs: the reference row (`nope` or `rope`:" in (out / "report.md").read_text()
    assert report_main([str(tmp_path), "--out", str(tmp_path / "bad"), "--references", "hierarchical"]) == 2
    assert not (tmp_path / "bad").exists()
