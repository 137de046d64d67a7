"""The command line: `posab report DIR [DIR ...] --out results/NAME`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from posab.report.claimed import read_verdicts
from posab.report.document import write_report
from posab.report.records import ReportError, RunRecord
from posab.report.rundirs import find_runs, load_run, run_names
from posab.report.runs_csv import load_csv
from posab.report.stats import PAIRED_REFERENCES


def collect_runs(paths: Sequence[Path]) -> list[RunRecord]:
    """All runs behind the given paths: report folders (runs.csv) and folders of run directories."""
    records: list[RunRecord] = []
    dirs = []
    for path in paths:
        if (path / "runs.csv").is_file() and not (path / "results.json").is_file():
            records.extend(load_csv(path / "runs.csv"))
        else:
            dirs.extend(find_runs([path]))
    dirs = list(dict.fromkeys(dirs))
    records.extend(load_run(d, name) for d, name in zip(dirs, run_names(dirs), strict=True))
    names = [r.name for r in records]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise ReportError(f"the same run name comes from two inputs: {', '.join(clashes)}")
    return records


def selected(
    runs: Sequence[RunRecord], encodings: Sequence[str] | None, experiments: Sequence[str] | None
) -> list[RunRecord]:
    """The runs of the given encodings and experiments (every one where None); a name that selects no run is
    an error naming the ones there are."""
    for names, field in ((encodings, "encoding"), (experiments, "experiment")):
        have = sorted({_field(r, field) for r in runs})
        missing = sorted(set(names or ()) - set(have))
        if missing:
            raise ReportError(f"no run of {field}(s) {', '.join(missing)}; the runs have: {', '.join(have)}")
    return [
        r
        for r in runs
        if (not encodings or r.encoding in encodings)
        and (not experiments or _field(r, "experiment") in experiments)
    ]


def _field(run: RunRecord, name: str) -> str:
    return run.encoding if name == "encoding" else run.info.get(name, "")


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: `posab report DIR [DIR ...] --out results/NAME`; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="posab report",
        description="Tables, CSV, plots and configs from run directories, sweeps or a report's runs.csv.",
    )
    parser.add_argument("paths", nargs="+", type=Path, help="run/sweep directories, or report folders")
    parser.add_argument("--out", type=Path, default=Path("results/report"), help="output folder")
    parser.add_argument(
        "--references",
        nargs="+",
        default=list(PAIRED_REFERENCES),
        metavar="ROW",
        help="rows every other row is compared with in the paired differences: a row label (as in the "
        "table) or an encoding with one row in the study (default: %(default)s)",
    )
    parser.add_argument(
        "--encodings",
        nargs="+",
        metavar="NAME",
        help="keep only the runs of these encodings (e.g. an ablation's arms with its references)",
    )
    parser.add_argument(
        "--experiments",
        nargs="+",
        metavar="NAME",
        help="keep only the runs of these experiments (their `experiment`, e.g. study_main)",
    )
    parser.add_argument(
        "--claims",
        type=Path,
        metavar="CSV",
        help="the study's claim verdicts (`posab claims` writes results/study/claims/verdicts.csv): a "
        "comparison of this report that a claim names takes its family, Holm p and verdict from it",
    )
    args = parser.parse_args(argv)
    try:
        claimed = read_verdicts(args.claims) if args.claims else {}
        runs = selected(collect_runs(args.paths), args.encodings, args.experiments)
        report = write_report(runs, args.out, args.references, claimed)
    except ReportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{report}: {len(runs)} runs")
    return 0
