"""The task suite's budgets, set by learning (issue 58): from the budget pilot's runs
(conf/experiment/tasks_pilot.yaml), each task's budget is the fewest steps at which every reference (NoPE
and RoPE by default) reaches exact match >= the target (0.95) at the training lengths on every pilot seed.
A task that only some references learn within the cap gets the cap as its budget and stays in the suite
(the grid's fit rule then drops the pairs whose runs do not fit); a task that no reference learns within
the cap is reported with the best each reference reached and left out of the aggregate
(conf/experiment/tasks_pilot.yaml, issue 58). A reference learns at a budget only where it has finished on
every seed the task's pilot has.

The ladder may be run in increasing order and stopped at the first budget that meets the rule
(scripts/pilot_ladder.sh): that is the budget the whole ladder gives, at a fraction of its cost for a task
learned early. `--cap` names the ladder's top, so that a task stopped below it without learning reads as
still running (`learned` false, `complete` false), not as left out.

    posab task-budgets SWEEP [DIR ...] --out results/tasks/pilot [--target 0.95] [--references nope rope]
        [--cap 8000]

Writes budgets.csv (task, budget or empty, learned (by every reference), complete, the cap, learned_by (the
references that learned it at some budget), left_out, and per reference the exact match at the training
lengths at each budget, the least over its seeds) and budgets.md.
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


def budgets(
    frame: pd.DataFrame, references: Sequence[str], target: float, cap: int | None = None
) -> pd.DataFrame:
    """Per task: the fewest steps at which every reference's least seed reaches `target` on every seed of
    the task's pilot, or, once the ladder is complete (run up to the cap: by default its highest budget
    run), the cap where only some references learned it, or none where no reference did (left out; module
    docstring); the least exact_seen over seeds per (reference, steps)."""
    lines = []
    for task, runs in frame.groupby("task"):
        cells = runs.groupby(["encoding", "steps"])["exact_seen"]
        least, counted = cells.min(), cells.count()  # over seeds
        ladder = sorted(runs["steps"].unique())
        top = ladder[-1] if cap is None else cap
        seeds = runs["seed"].nunique()
        reached = learned_steps(least, counted, seeds, references, target)
        learners = [e for e in references if learned_steps(least, counted, seeds, [e], target)]
        complete = bool(reached) or ladder[-1] >= top
        budget = reached[0] if reached else (top if complete and learners else None)
        line = {"task": task, "budget": budget, "learned": bool(reached), "complete": complete, "cap": top,
                "learned_by": " ".join(learners), "left_out": complete and not learners}  # fmt: skip
        line |= {f"{e}@{s}": least.get((e, s)) for e in references for s in ladder}
        lines.append(line)
    table = pd.DataFrame(lines)
    steps = sorted(frame["steps"].unique())
    cells = [f"{e}@{s}" for e in references for s in steps]  # one reference's ladder, then the next
    return table[[c for c in table.columns if "@" not in c] + cells]


def learned_steps(
    least: pd.Series, counted: pd.Series, seeds: int, references: Sequence[str], target: float
) -> list[int]:
    """The budgets (ascending) of one task's pilot at which every reference has finished on all `seeds` of
    the pilot and its least seed reaches `target`; `least` and `counted`: exact_seen's least and count over
    seeds, indexed by (encoding, steps)."""
    ladder = sorted({steps for _, steps in least.index})
    return [
        steps
        for steps in ladder
        if all(counted.get((e, steps), 0) == seeds and least[(e, steps)] >= target for e in references)
    ]


def budget_lines(table: pd.DataFrame, references: Sequence[str], target: float) -> list[str]:
    """budgets.md."""
    head = ["task", "budget (steps)", *(c for c in table.columns if "@" in c)]
    body = [
        [
            line["task"],
            budget_cell(line),
            *("–" if pd.isna(line[c]) else f"{line[c]:.2f}" for c in head[2:]),
        ]  # fmt: skip
        for _, line in table.iterrows()
    ]
    left_out = table.loc[table["left_out"], "task"].tolist()
    at_cap = [
        f"{line['task']} (learned by {line['learned_by']})"
        for _, line in table.iterrows()
        if line["complete"] and not line["learned"] and not line["left_out"]
    ]
    running = table.loc[~table["complete"], "task"].tolist()
    return [
        "# The task suite's budgets, set by learning",
        "",
        f"A task's budget: the fewest steps at which {' and '.join(references)} each reach exact match >= "
        f"{target:g} at the training lengths on every pilot seed (each cell: the least over seeds); where "
        "only some of them do within the cap, the cap, and the task stays in the suite.",
        "",
        *markdown_table(head, body),
        "",
        f"At the cap, learned by some references only: {', '.join(at_cap) or 'none'}.",
        "Left out of the aggregate (learned by no reference within the cap): "
        f"{', '.join(left_out) or 'none'}.",
        *([f"Ladder still running (not learned yet, below the cap): {', '.join(running)}."] * bool(running)),
        "",
    ]


def budget_cell(line: pd.Series) -> str:
    """A task's budget, or why it has none."""
    if line["learned"]:
        return f"{int(line['budget']):,}"
    if line["complete"] and not line["left_out"]:
        return f"{int(line['cap']):,} (the cap; learned by {line['learned_by']} only)"
    if line["complete"]:
        return f"not learned within {int(line['cap']):,}"
    return f"not learned yet (cap {int(line['cap']):,})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="posab task-budgets", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "paths", nargs="+", type=Path, help="the pilot's run/sweep directories, or runs.csv folders"
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--target", type=float, default=TARGET, help="exact match to reach (default 0.95)")
    parser.add_argument("--references", nargs="+", default=list(REFERENCES), help="encodings that must learn")
    parser.add_argument("--cap", type=int, help="the ladder's top budget (default: the highest one run)")
    args = parser.parse_args(argv)
    if args.cap is not None and args.cap < 1:
        print(f"error: --cap {args.cap}: give the ladder's top budget, in steps (> 0)", file=sys.stderr)
        return 2
    if not 0.0 < args.target <= 1.0:
        print(f"error: --target {args.target}: use an exact match in (0, 1]", file=sys.stderr)
        return 2
    try:
        frame = pilot_frame(collect_runs(args.paths), args.references)
        table = budgets(frame, args.references, args.target, args.cap)
    except (ReportError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "budgets.csv", index=False)
    path = write_text(args.out / "budgets.md", "\n".join(budget_lines(table, args.references, args.target)))
    print(path)
    return 0
