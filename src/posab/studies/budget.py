"""The budget of a study (the reference study's part 1): the step after which the ranking of its rows by
validation loss at the training length no longer changes.

    posab budget outputs/multirun/SWEEP [DIR ...] --out results/NAME [--minimum 600]

Reads the runs as `scripts/report.py` does (run directories or a report's runs.csv) and their validation
curves (`val/loss` every `train.val_every` steps on the same fixed windows for every run). At each step
logged by every row, the rows are ranked by their mean validation loss over seeds; the ranking settles at
the earliest step, not below `--minimum`, from which every later ranking equals the final one. Writes
budget.md (the settling step, the ranking at every step, the final gaps between neighbours) and
ranking.csv (the mean loss of each row at each step).

One schedule, read at its steps: the loss at step s of a long cosine schedule is not the end of an
s-step run, so the settling step says where the ordering stops moving along this schedule; the budget
chosen from it is then trained as its own schedule.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from posab.report.cli import collect_runs
from posab.report.grouping import Row, group_rows
from posab.report.markdown import markdown_table
from posab.report.records import ReportError
from posab.report.stats import curve_band


def loss_by_step(rows: Mapping[str, Row]) -> pd.DataFrame:
    """Mean validation loss over the seeds of each row (columns) at every step all rows logged (index)."""
    curves = {
        label: curve_band([r.val_curve for r in row.runs if r.val_curve])["mean"]
        for label, row in rows.items()
        if not row.scaling and any(r.val_curve for r in row.runs)
    }
    if len(curves) < 2:
        raise ReportError("a ranking needs two rows with validation curves (metrics.jsonl `val/loss`)")
    return pd.DataFrame(curves).dropna()  # (steps, rows)


def rankings(losses: pd.DataFrame) -> list[tuple[str, ...]]:
    """The rows from lowest to highest loss at each step (ties in column order)."""
    return [tuple(losses.columns[losses.loc[step].argsort(kind="stable")]) for step in losses.index]


def settled_step(losses: pd.DataFrame, minimum: int) -> int | None:
    """The earliest step >= `minimum` from which every ranking equals the final one; None when the last
    step logged is below `minimum`."""
    orders = rankings(losses)
    settled = None
    for step, order in zip(reversed(losses.index), reversed(orders), strict=True):
        if order != orders[-1] or step < minimum:
            break
        settled = int(step)
    return settled


def ranking_lines(losses: pd.DataFrame) -> list[str]:
    """A Markdown table: each step's ranking, `a < b < c` with each mean loss, and whether it is final."""
    final = rankings(losses)[-1]
    cells = [
        [
            str(step),
            " < ".join(f"{name} {losses.at[step, name]:.3f}" for name in order),
            "yes" if order == final else "no",
        ]
        for step, order in zip(losses.index, rankings(losses), strict=True)
    ]
    return markdown_table(["step", "ranking by validation loss (lowest first)", "final order"], cells)


def gap_lines(losses: pd.DataFrame) -> list[str]:
    """The final ranking's neighbours and the loss gap between them at the last step."""
    last = losses.iloc[-1].sort_values(kind="stable")
    pairs = zip(last.index[:-1], last.index[1:], strict=True)
    cells = [[f"{a} < {b}", f"{last[b] - last[a]:.4f}"] for a, b in pairs]
    return markdown_table(["neighbours at the last step", "loss gap (nats/token)"], cells)


def budget_document(study: str, losses: pd.DataFrame, minimum: int) -> list[str]:
    settled = settled_step(losses, minimum)
    verdict = (
        f"The ranking settles at step **{settled}**: from there to step {int(losses.index[-1])} every "
        "logged ranking equals the final one."
        if settled is not None and settled < losses.index[-1]
        else f"The ranking has not settled by step {int(losses.index[-1])} (it still changes at the last "
        "logged steps, or the runs end below the minimum)."
    )
    return [
        f"## Study `{study}`",
        "",
        f"{len(losses.columns)} rows; validation loss at the training length, mean over each row's seeds; "
        f"budget not below step {minimum}.",
        "",
        verdict,
        "",
        *gap_lines(losses),
        "",
        *ranking_lines(losses),
        "",
    ]


def write_budget(paths: Sequence[Path], out: Path, minimum: int) -> Path:
    runs = [r for r in collect_runs(paths) if r.finished]
    table = group_rows(runs)
    if not table:
        raise ReportError("no finished runs")
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# Budget: where the ranking stops changing", "", (__doc__ or "").split("\n\n")[-1].strip(), ""]
    frames = []
    for study, rows in table.items():
        losses = loss_by_step({row.label: row for row in rows})
        lines += budget_document(study, losses, minimum)
        frames.append(losses.rename_axis("step").reset_index().assign(study=study))
    pd.concat(frames).to_csv(out / "ranking.csv", index=False, float_format="%.6g")
    path = out / "budget.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="posab budget", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run/sweep directories, or report folders")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--minimum", type=int, default=600, help="the smallest budget considered (steps)")
    args = parser.parse_args(argv)
    try:
        path = write_budget(args.paths, args.out, args.minimum)
    except ReportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0
