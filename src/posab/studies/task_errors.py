"""Where the task suite's errors are (issue 58): each wrong answer as the task evaluator classes it
(`posab.evaluate.task`: stopped early, ran long, a wrong token), the oracle-length reading beside exact
match, and a heatmap of exact match per task (encodings x instance length), so that a reading can say
which encodings fail at the content and which only at the length decision.

- `error_lines`: per task, one line per encoding, the means over seeds and over the lengths past the
  training lengths of exact match, of each kind of error (their shares of the examples) and of the oracle
  reading, then the same at the first unseen length (where copy and reverse fall off a cliff). Runs made
  before the evaluator classed errors (no `task/wrong_token@n`) are left out of it and counted.
- `heatmap_figure`: a panel per task, exact match per encoding (rows) and instance length (columns), the
  mean over seeds, the training boundary marked, the encodings sorted by their unseen exact match, the five
  of the NoPE study above a line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.image import AxesImage

from posab.keys import key_lengths, metric_key
from posab.plots import new_figure
from posab.report.markdown import markdown_table
from posab.report.records import RunRecord
from posab.report.styles import display_name

TASK, TRAIN_LENGTHS = "data.task.name", "data.task.train_lengths"
POSITIONS = "data.task.positions"  # sequential | coupled (runs from before the option: sequential)


def task_of(run: RunRecord) -> str:
    """The task a run's row names: its task, `@coupled` after it when its positions were coupled (rows of
    their own, issue 58)."""
    coupled = run.config.get(POSITIONS) == "coupled"
    return f"{run.config[TASK]}@coupled" if coupled else str(run.config[TASK])


BREAKDOWN = ("exact", "stopped_early", "ran_long", "wrong_token", "oracle_exact")
PAPER_FIVE = ("nope", "t5", "alibi", "rope", "sinusoidal")  # the NoPE study's encodings (APE: sinusoidal)


def train_high(run: RunRecord) -> int:
    """The longest training length of a task run (`data.task.train_lengths` [low, high])."""
    return int(run.config[TRAIN_LENGTHS].strip("[]").split(",")[1])


def classed(run: RunRecord) -> bool:
    """Whether the run's evaluator classed its wrong answers (newer runs)."""
    return bool(key_lengths(run.metrics, "wrong_token"))


def breakdown(runs: Sequence[RunRecord], lengths: Sequence[int]) -> list[float]:
    """BREAKDOWN's means over the runs (seeds) and the given lengths; nan where a metric was not read."""
    means = []
    for metric in BREAKDOWN:
        values = [run.metrics.get(metric_key(metric, n), math.nan) for run in runs for n in lengths]
        means.append(float(np.mean(values)) if values else math.nan)
    return means


def task_rows(runs: Sequence[RunRecord]) -> dict[str, list[RunRecord]]:
    """The finished, classed runs of one task by encoding, the NoPE study's five first."""
    by_encoding: dict[str, list[RunRecord]] = {}
    for run in runs:
        by_encoding.setdefault(run.encoding, []).append(run)
    order = [e for e in PAPER_FIVE if e in by_encoding] + sorted(set(by_encoding) - set(PAPER_FIVE))
    return {encoding: by_encoding[encoding] for encoding in order}


def cell(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.3f}"


def error_lines(runs: Sequence[RunRecord]) -> list[str]:
    """The section's Markdown: a table per task (module docstring); [] when no run classed its errors."""
    task_runs = [r for r in runs if r.finished and TASK in r.config]
    kept = [r for r in task_runs if classed(r)]
    if not kept:
        return []
    headers = ["encoding", "runs", *BREAKDOWN, *(f"{m}@first unseen" for m in BREAKDOWN)]
    lines = [
        "## Where the errors are",
        "",
        "Per task, means over seeds: past the training lengths (mean over those lengths), then at the first "
        "unseen length. `exact` + `stopped_early` + `ran_long` + `wrong_token` = 1; `oracle_exact` decodes "
        "with EOS suppressed for the answer's length and scores the answer's tokens alone (a model that "
        "fails only at stopping is right there).",
        "",
    ]
    for task in sorted({task_of(r) for r in kept}):
        mine = [r for r in kept if task_of(r) == task]
        high = train_high(mine[0])
        unseen = [n for n in key_lengths(mine[0].metrics, "exact") if n > high]
        body = [
            [
                display_name(encoding),
                str(len(group)),
                *map(cell, breakdown(group, unseen)),
                *map(cell, breakdown(group, unseen[:1])),
            ]  # fmt: skip
            for encoding, group in task_rows(mine).items()
        ]
        lines += [f"### {task} (trained to n = {high})", "", *markdown_table(headers, body), ""]
    if len(kept) < len(task_runs):
        lines += [
            f"{len(task_runs) - len(kept)} runs made before errors were classed are not in these tables.",
            "",
        ]
    return lines


def heatmap_figure(runs: Sequence[RunRecord]) -> Figure | None:
    """Exact match per encoding and instance length, a panel per task (module docstring); None without
    task runs."""
    task_runs = [r for r in runs if r.finished and TASK in r.config]
    tasks = sorted({task_of(r) for r in task_runs})
    if not tasks:
        return None
    fig = new_figure(6.0 * min(3, len(tasks)), 0.5 + 4.5 * math.ceil(len(tasks) / 3), layout="constrained")
    for index, task in enumerate(tasks):
        mine = [r for r in task_runs if task_of(r) == task]
        ax = fig.add_subplot(math.ceil(len(tasks) / 3), min(3, len(tasks)), index + 1)
        image = task_panel(ax, task, mine)
    fig.colorbar(image, ax=fig.axes, label="exact match", shrink=0.6)
    return fig


def task_panel(ax: Axes, task: str, runs: Sequence[RunRecord]) -> AxesImage:
    """One task's heatmap on `ax`; returns the image (for the colour bar)."""
    lengths = key_lengths(runs[0].metrics, "exact")
    high = train_high(runs[0])
    groups = task_rows(runs)
    unseen = {e: breakdown(g, [n for n in lengths if n > high])[0] for e, g in groups.items()}
    five = sorted((e for e in groups if e in PAPER_FIVE), key=lambda e: -unseen[e])
    rest = sorted((e for e in groups if e not in PAPER_FIVE), key=lambda e: -unseen[e])
    order = five + rest
    grid = np.array([[breakdown(groups[e], [n])[0] for n in lengths] for e in order])  # (E, N)
    image = ax.imshow(grid, vmin=0.0, vmax=1.0, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.axvline(lengths.index(high) + 0.5, color="white", linewidth=2)  # the training boundary
    if five and rest:
        ax.axhline(len(five) - 0.5, color="white", linewidth=1, linestyle="--")  # the NoPE study's five above
    ax.set_yticks(range(len(order)), [display_name(e) for e in order], fontsize="small")
    step = max(1, len(lengths) // 10)
    ax.set_xticks(range(0, len(lengths), step), [str(n) for n in lengths[::step]])
    ax.set(xlabel="instance length n", title=f"{task} (trained to n = {high})")
    return image
