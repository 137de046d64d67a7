"""The task suite's budgets, set by learning (issue 58): from the budget pilot's runs
(conf/experiment/tasks_pilot.yaml), each task's budget is the fewest steps at which every reference (NoPE
and RoPE by default) reaches exact match >= the target (0.95) at the training lengths on every pilot seed;
a task that no budget of the ladder brings there is not learned within the cap, reported with the best each
reference reached, and left out of the aggregate.

    posab task-budgets SWEEP [DIR ...] --out results/tasks/pilot [--target 0.95] [--references nope rope]

Writes budgets.csv (task, budget or empty, learned, the cap, and per reference the exact match at the
training lengths at each budget, the least over its seeds) and budgets.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from posab.io import write_text
from posab.keys import metric_key
from posab.report.cli import collect_runs
from posab.report.markdown import markdown_table
from posab.report.records import ReportError, RunRecord
from posab.studies.task_errors import TASK, task_of

STEPS = "train.steps"
SEEN = metric_key("exact_seen")
TARGET = 0.95  # the exact match at the training lengths a reference must reach (issue 58)
REFERENCES = ("nope", "rope")


def pilot_frame(runs: Sequence[RunRecord], references: Sequence[str]) -> pd.DataFrame:
    """One line per finished pilot run of a reference: task, encoding, seed, steps, exact_seen."""
    lines = [
        {
            "task": task_of(r),
            "encoding": r.encoding,
            "seed": r.seed,
            "steps": int(r.config[STEPS]),
            "exact_seen": r.metrics[SEEN],
        }  # fmt: skip
        for r in runs
        if r.finished
        and TASK in r.config
        and STEPS in r.config
        and SEEN in r.metrics
        and r.encoding in references
    ]
    if not lines:
        raise ReportError(f"no finished pilot run of {', '.join(references)} with `{SEEN}` and `{STEPS}`")
    return pd.DataFrame(lines)


def budgets(frame: pd.DataFrame, references: Sequence[str], target: float) -> pd.DataFrame:
    """Per task: the fewest steps at which every reference's least seed reaches `target` (module
    docstring), or none; the cap; the least exact_seen over seeds per (reference, steps)."""
    lines = []
    for task, runs in frame.groupby("task"):
        least = runs.groupby(["encoding", "steps"])["exact_seen"].min()  # over seeds
        ladder = sorted(runs["steps"].unique())
        reached = [s for s in ladder if all((e, s) in least and least[(e, s)] >= target for e in references)]
        line = {"task": task, "budget": reached[0] if reached else None, "learned": bool(reached),
                "cap": ladder[-1]}  # fmt: skip
        line |= {f"{e}@{s}": least.get((e, s)) for e in references for s in ladder}
        lines.append(line)
    return pd.DataFrame(lines)


def budget_lines(table: pd.DataFrame, references: Sequence[str], target: float) -> list[str]:
    """budgets.md."""
    head = ["task", "budget (steps)", *(c for c in table.columns if "@" in c)]
    body = [
        [
            line["task"],
            f"{int(line['budget']):,}" if line["learned"] else f"not learned within {line['cap']:,}",
            *("–" if pd.isna(line[c]) else f"{line[c]:.2f}" for c in head[2:]),
        ]  # fmt: skip
        for _, line in table.iterrows()
    ]
    left_out = table.loc[~table["learned"], "task"].tolist()
    return [
        "# The task suite's budgets, set by learning",
        "",
        f"A task's budget: the fewest steps at which {' and '.join(references)} each reach exact match >= "
        f"{target:g} at the training lengths on every pilot seed (each cell: the least over seeds).",
        "",
        *markdown_table(head, body),
        "",
        f"Left out of the aggregate (not learned within the cap): {', '.join(left_out) or 'none'}.",
        "",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="posab task-budgets", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "paths", nargs="+", type=Path, help="the pilot's run/sweep directories, or runs.csv folders"
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--target", type=float, default=TARGET, help="exact match to reach (default 0.95)")
    parser.add_argument("--references", nargs="+", default=list(REFERENCES), help="encodings that must learn")
    args = parser.parse_args(argv)
    if not 0.0 < args.target <= 1.0:
        print(f"error: --target {args.target}: use an exact match in (0, 1]", file=sys.stderr)
        return 2
    try:
        table = budgets(pilot_frame(collect_runs(args.paths), args.references), args.references, args.target)
    except (ReportError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "budgets.csv", index=False)
    path = write_text(args.out / "budgets.md", "\n".join(budget_lines(table, args.references, args.target)))
    print(path)
    return 0
