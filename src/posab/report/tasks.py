"""The algorithmic task suite's report (issue 44): exact match past the training lengths per task and
encoding, the NoPE study's aggregate, and the preregistered orderings tested seed by seed.

    posab tasks outputs/multirun/SWEEP [DIR ...] --out results/tasks [--claims results/tasks/claims.csv]

Reads the runs as `posab report` does (run folders, sweeps or a runs.csv), keeps the finished runs of a
task (`data.task.name`), and writes into `--out`: tasks.md, tasks.csv (one line per run), mrr.csv,
claims_verdicts.csv (with `--claims`), tasks.png (accuracy against instance length, a panel per task, the
mean over seeds per encoding, the training lengths shaded) and runs.csv.

- Accuracy: `task/exact_unseen`, the mean over the test lengths past `data.task.train_lengths` of exact
  match (`posab.evaluate.task`), per run; a cell is the mean over seeds, then each seed's value.
- The aggregate, as the NoPE study's (`plot_aggregate_final.ipynb` of McGill-NLP/length-generalization):
  for every (task, seed) the encodings are ranked by accuracy, and each encoding's mean reciprocal rank
  (MRR) is the mean of 1 / rank over them. Ties take the mean of the ranks they span (the reference's
  pandas `rank(method="first")` breaks them by row order, which at this scale, where many encodings score
  0, would rank by the order of the table). Computed among the five encodings the paper ranks, beside its
  values, and among every encoding that ran every task.
- Orderings: a claims file (columns `family, row, reference, task, direction, status, registered,
  statement`: encodings, a task or `mean` over the tasks both ran, `greater` or `less`) states each ordering
  before its runs. The pairs are the (task, seed) cells the claim covers: the two encodings' runs of one
  task and seed saw the same training examples in the same order and are scored on the same test
  examples, and runs of different cells are separate trainings. Each pair's difference is the mean over
  the unseen lengths; the one-sided sign-flip test over the pairs (`posab.report.resampling`: under the
  null the two runs of a cell are exchangeable) gives p, Holm-adjusted within the family; a 95% percentile
  bootstrap interval of the mean difference over tasks resamples the seeds and, within each task, the
  test lengths (every run is scored on the same examples at each length). Verdicts as the study's claims
  (`posab.report.stats.verdict`). A claim on one task has 3 pairs at 3 seeds, whose least p is 1/8; a
  claim on the `mean` of six tasks has 18, so its least p is far below α (each family's floor is
  stated). The per-seed column gives the mean over tasks at each seed.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from posab.keys import key_lengths, metric_key
from posab.plots import new_figure, save_figure
from posab.report.claims import claims_file_lines
from posab.report.cli import collect_runs
from posab.report.markdown import markdown_table
from posab.report.records import ReportError, RunRecord
from posab.report.resampling import holm, least_holm_p, least_one_sided_p, sign_flip_p
from posab.report.runs_csv import write_csv
from posab.report.stats import verdict
from posab.report.styles import encoding_colours, shared_colour_styles

TASK, TRAIN_LENGTHS = "data.task.name", "data.task.train_lengths"
UNSEEN, SEEN = metric_key("exact_unseen"), metric_key("exact_seen")
PAPER_FIVE = ("nope", "t5", "alibi", "rope", "sinusoidal")  # the NoPE study's encodings (APE: sinusoidal)
# the reference's printed MRR over its 17 dataset-splits, no scratchpad (plot_aggregate_final.ipynb)
PAPER_MRR = {"nope": 0.687, "t5": 0.549, "alibi": 0.502, "rope": 0.330, "sinusoidal": 0.215}
MEAN = "mean"  # a claim over the mean of the tasks both encodings ran
CLAIM_COLUMNS = ("family", "row", "reference", "task", "direction", "status", "registered", "statement")
DRAWS = 10_000  # bootstrap replicates (fixed generator: the same runs give the same interval)


@dataclass(frozen=True)
class TaskRun:
    encoding: str
    task: str
    seed: int
    unseen: float
    seen: float
    by_length: dict[int, float]  # exact match at each instance length
    train_lengths: tuple[int, int]


def task_runs(runs: Sequence[RunRecord]) -> list[TaskRun]:
    """The finished runs of a task that have their accuracy."""
    found = []
    for run in runs:
        if not (run.finished and TASK in run.config and UNSEEN in run.metrics and run.seed is not None):
            continue
        lengths = key_lengths(run.metrics, "exact")
        low, high = (int(v) for v in run.config[TRAIN_LENGTHS].strip("[]").split(","))
        by_length = {n: run.metrics[metric_key("exact", n)] for n in lengths}
        seen = run.metrics.get(SEEN, math.nan)
        found.append(
            TaskRun(
                run.encoding, run.config[TASK], run.seed, run.metrics[UNSEEN], seen, by_length, (low, high)
            )
        )
    if not found:
        raise ReportError(f"no finished task run (`{TASK}` in its config, `{UNSEEN}` in its results)")
    return found


def frame_of(found: Sequence[TaskRun]) -> pd.DataFrame:
    """One line per run: encoding, task, seed, exact_unseen, exact_seen; two runs of one (encoding, task,
    seed) are an error naming them."""
    frame = pd.DataFrame(
        [
            {
                "encoding": r.encoding,
                "task": r.task,
                "seed": r.seed,
                "exact_unseen": r.unseen,
                "exact_seen": r.seen,
            }
            for r in found
        ]
    )
    twice = frame[frame.duplicated(["encoding", "task", "seed"], keep=False)]
    if len(twice):
        raise ReportError(
            f"two runs of one encoding, task and seed: {twice[['encoding', 'task', 'seed']].values.tolist()}"
        )
    return frame.sort_values(["task", "encoding", "seed"]).reset_index(drop=True)


def accuracy_lines(frame: pd.DataFrame, column: str) -> list[str]:
    """A Markdown table, encodings by tasks: the mean over seeds, then each seed's value."""
    tasks = sorted(frame["task"].unique())
    body = []
    for encoding, runs in frame.groupby("encoding"):
        cells = []
        for task in tasks:
            values = runs[runs["task"] == task].sort_values("seed")[column]
            per_seed = " / ".join(f"{v:.2f}" for v in values)
            cells.append(f"{values.mean():.3f} ({per_seed})" if len(values) else "—")
        body.append([str(encoding), *cells])
    return markdown_table(["encoding", *tasks], body)


def reciprocal_ranks(frame: pd.DataFrame, encodings: Sequence[str]) -> pd.DataFrame:
    """1 / rank of each encoding of `encodings` in every (task, seed) all of them ran, ranked by
    exact_unseen (highest first, ties at their mean rank): columns encoding, task, seed, rr."""
    chosen = frame[frame["encoding"].isin(encodings)]
    parts = []
    for (_, _), group in chosen.groupby(["task", "seed"]):
        if set(group["encoding"]) != set(encodings):
            continue
        ranks = group["exact_unseen"].rank(ascending=False, method="average")
        parts.append(group.assign(rr=1.0 / ranks)[["encoding", "task", "seed", "rr"]])
    if not parts:
        raise ReportError(f"no (task, seed) was run by every one of {list(encodings)}")
    return pd.concat(parts)


def mrr(frame: pd.DataFrame, encodings: Sequence[str]) -> pd.Series:
    """Each encoding's mean reciprocal rank over the (task, seed)s all of `encodings` ran, best first."""
    return reciprocal_ranks(frame, encodings).groupby("encoding")["rr"].mean().sort_values(ascending=False)


def complete_encodings(frame: pd.DataFrame) -> list[str]:
    """The encodings that ran every task of the suite."""
    tasks = set(frame["task"])
    return sorted(e for e, runs in frame.groupby("encoding") if set(runs["task"]) == tasks)


@dataclass(frozen=True)
class TaskClaim:
    family: str
    row: str
    reference: str
    task: str
    direction: str
    status: str
    registered: str
    statement: str


def read_task_claims(path: Path, tasks: Sequence[str]) -> list[TaskClaim]:
    """The claims of a task claims file; a missing column or a value out of its set names its line."""
    claims = []
    for number, line in claims_file_lines(path, "task claims file", CLAIM_COLUMNS):
        where = f"task claims file {path}, line {number}"
        if line["task"] not in (*tasks, MEAN):
            raise ReportError(f"{where}: task {line['task']!r}; valid: {', '.join([*tasks, MEAN])}")
        if line["direction"] not in ("greater", "less"):
            raise ReportError(f"{where}: direction {line['direction']!r}; valid: greater, less")
        claims.append(TaskClaim(**{c: line[c] for c in CLAIM_COLUMNS}))
    return claims


def covered_tasks(found: Sequence[TaskRun], claim: TaskClaim) -> list[str]:
    """The claim's task, or for `mean` every task both encodings ran."""
    if claim.task != MEAN:
        return [claim.task]
    row, reference = ({r.task for r in found if r.encoding == e} for e in (claim.row, claim.reference))
    return sorted(row & reference)


def common_seeds(found: Sequence[TaskRun], claim: TaskClaim, tasks: Sequence[str]) -> list[int]:
    """The seeds at which both encodings ran every one of `tasks`."""
    seeds = [
        {r.seed for r in found if r.encoding == encoding and r.task == task}
        for encoding in (claim.row, claim.reference)
        for task in tasks
    ]
    return sorted(set.intersection(*seeds)) if seeds else []


def paired_lengths(found: Sequence[TaskRun], claim: TaskClaim) -> dict[str, np.ndarray]:
    """Per task the claim covers: (seeds, unseen lengths) accuracy differences, row minus reference, over
    the seeds at which both encodings ran every covered task."""
    runs = {(r.encoding, r.task, r.seed): r for r in found}
    tasks = covered_tasks(found, claim)
    seeds = common_seeds(found, claim, tasks)
    if len(seeds) < 2:
        raise ReportError(
            f"claim {claim.row} vs {claim.reference} on {claim.task}: fewer than 2 seeds with runs of both"
        )
    differences = {}
    for task in tasks:
        first = runs[(claim.row, task, seeds[0])]
        unseen = [n for n in sorted(first.by_length) if n > first.train_lengths[1]]
        row = [[runs[(claim.row, task, s)].by_length[n] for n in unseen] for s in seeds]
        reference = [[runs[(claim.reference, task, s)].by_length[n] for n in unseen] for s in seeds]
        differences[task] = np.asarray(row) - np.asarray(reference)  # (seeds, unseen lengths)
    return differences


def bootstrap(differences: dict[str, np.ndarray]) -> tuple[float, float]:
    """95% percentile interval of the mean over tasks of the mean difference: seeds resampled (the same
    draw for every task), lengths resampled within each task."""
    rng = np.random.default_rng(0)
    seeds = next(iter(differences.values())).shape[0]
    pick = rng.integers(0, seeds, size=(DRAWS, seeds))  # (draws, seeds)
    means = []
    for values in differences.values():
        lengths = values.shape[1]
        columns = rng.integers(0, lengths, size=(DRAWS, lengths))  # (draws, lengths)
        drawn = values[pick[:, :, None], columns[:, None, :]]  # (draws, seeds, lengths)
        means.append(drawn.mean(axis=(1, 2)))
    low, high = np.percentile(np.mean(means, axis=0), [2.5, 97.5])
    return float(low), float(high)


def claim_verdicts(found: Sequence[TaskRun], claims: Sequence[TaskClaim]) -> pd.DataFrame:
    """Each claim's difference, per-seed differences, its (task, seed) pairs, one-sided p over them, Holm
    within its family, interval and verdict."""
    lines = []
    for claim in claims:
        differences = paired_lengths(found, claim)
        cells = np.stack([values.mean(axis=1) for values in differences.values()])  # (tasks, seeds)
        per_seed = cells.mean(axis=0)  # (seeds,)
        low, high = bootstrap(differences)
        lines.append({
            "family": claim.family, "row": claim.row, "reference": claim.reference, "task": claim.task,
            "direction": claim.direction, "difference": float(per_seed.mean()),
            "per_seed": " / ".join(f"{d:+.3f}" for d in per_seed), "pairs": cells.size, "low": low,
            "high": high, "p": sign_flip_p(cells.ravel(), claim.direction), "status": claim.status,
            "statement": claim.statement,
        })  # fmt: skip
    frame = pd.DataFrame(lines)
    frame["p_holm"] = np.nan
    for _, index in frame.groupby("family", sort=False).groups.items():
        frame.loc[index, "p_holm"] = holm(frame.loc[index, "p"].tolist())
    frame["verdict"] = [claim_verdict(line) for line in frame.itertuples()]
    return frame


def claim_verdict(line: object) -> str:
    """`verdict` with the interval read on the claimed side: above 0 for `greater`, below for `less`."""
    above, below = line.low > 0, line.high < 0  # type: ignore[attr-defined]
    claimed, other = (above, below) if line.direction == "greater" else (below, above)  # type: ignore[attr-defined]
    return verdict(claimed, other, line.p_holm)  # type: ignore[attr-defined]


def accuracy_figure(found: Sequence[TaskRun]) -> Figure:
    """Exact match against instance length, a panel per task, the mean over seeds per encoding; one
    legend for every encoding of any panel."""
    tasks = sorted({r.task for r in found})
    colours = encoding_colours(sorted({r.encoding for r in found}))
    styles = shared_colour_styles(colours)
    columns = min(3, len(tasks))
    rows = math.ceil(len(tasks) / columns)
    fig = new_figure(5.0 * columns, 3.6 * rows, layout="constrained")
    legend: dict[str, Any] = {}
    for index, task in enumerate(tasks):
        ax = fig.add_subplot(rows, columns, index + 1)
        runs = [r for r in found if r.task == task]
        low, high = runs[0].train_lengths
        ax.axvspan(low - 0.5, high + 0.5, color="0.92")
        for encoding in sorted({r.encoding for r in runs}):
            mine = [r.by_length for r in runs if r.encoding == encoding]
            lengths = sorted(mine[0])
            mean = [np.mean([m[n] for m in mine]) for n in lengths]
            style = {"color": colours[encoding], "linestyle": styles[encoding], "linewidth": 1.2}
            (line,) = ax.plot(lengths, mean, **style)
            legend.setdefault(encoding, line)
        ax.set(title=task, xlabel="instance length n", ylabel="exact match", ylim=(-0.02, 1.02))
    names = sorted(legend)
    fig.legend([legend[n] for n in names], names, loc="outside right upper", fontsize=7)
    return fig


def mrr_lines(frame: pd.DataFrame) -> tuple[list[str], pd.DataFrame]:
    """The MRR tables (the paper's five beside its values; every encoding that ran every task)."""
    five = [e for e in PAPER_FIVE if e in set(frame["encoding"])]
    ours = mrr(frame, five)
    every = mrr(frame, complete_encodings(frame))
    table = pd.DataFrame({"mrr_paper_five": ours, "mrr_every_encoding": every})
    lines = markdown_table(
        [
            "encoding",
            "MRR here (the five)",
            "MRR, NoPE study",
            "MRR here (every encoding that ran every task)",
        ],
        [[e, f"{ours[e]:.3f}", f"{PAPER_MRR[e]:.3f}", f"{every.get(e, math.nan):.3f}"] for e in ours.index],
    )
    rest = [e for e in every.index if e not in ours.index]
    lines += [
        "",
        *markdown_table(
            ["encoding", "MRR (every encoding that ran every task)"], [[e, f"{every[e]:.3f}"] for e in rest]
        ),
    ]
    return lines, table


def claims_lines(verdicts: pd.DataFrame) -> list[str]:
    """The claims' tables, one per family with its Holm floor: each ordering, its difference per seed and
    overall, its pairs, interval, p and verdict."""
    lines = []
    for family, claims in verdicts.groupby("family", sort=False):
        leasts = [least_one_sided_p(n, n, paired=True) for n in claims["pairs"]]
        least, floor = min(leasts), least_holm_p(leasts)
        lines += [
            f"Family `{family}`: {len(claims)} claim(s); the least Holm p its pairs allow: {len(claims)} × "
            f"1/{round(1 / least)} = {floor:.4f}.",
            "",
            *markdown_table(CLAIMS_HEADER, [_claim_cells(line) for _, line in claims.iterrows()]),
            "",
        ]
    return lines


CLAIMS_HEADER = [
    "claim",
    "task",
    "row − reference",
    "per seed",
    "pairs",
    "95% interval",
    "p (one-sided)",
    "Holm",
    "verdict",
]


def _claim_cells(line: pd.Series) -> list[str]:
    sign = ">" if line["direction"] == "greater" else "<"
    interval = f"[{line['low']:+.3f}, {line['high']:+.3f}]"
    numbers = [f"{line['difference']:+.3f}", line["per_seed"], str(line["pairs"]), interval]
    tests = [f"{line['p']:.4f}", f"{line['p_holm']:.4f}", line["verdict"]]
    return [f"{line['row']} {sign} {line['reference']}", line["task"], *numbers, *tests]


def write_tasks_report(paths: Sequence[Path], out: Path, claims_path: Path | None) -> Path:
    runs = collect_runs(paths)
    found = task_runs(runs)
    frame = frame_of(found)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "tasks.csv", index=False)
    write_csv([r for r in runs if r.finished and TASK in r.config], out / "runs.csv")
    figure = save_figure(accuracy_figure(found), out / "tasks.png")
    mrr_text, mrr_table = mrr_lines(frame)
    mrr_table.to_csv(out / "mrr.csv", index_label="encoding")
    lines = [
        "# The algorithmic task suite",
        "",
        (__doc__ or "").split("\n\n")[2].strip(),
        "",
        f"{len(frame)} runs, tasks {', '.join(sorted(frame['task'].unique()))}.",
        "",
        "## Exact match past the training lengths (`task/exact_unseen`): mean over seeds (each seed)",
        "",
        *accuracy_lines(frame, "exact_unseen"),
        "",
        "## Exact match at the training lengths (`task/exact_seen`)",
        "",
        *accuracy_lines(frame, "exact_seen"),
        "",
        "## Mean reciprocal rank over tasks and seeds",
        "",
        *mrr_text,
        "",
        f"![exact match against instance length]({figure.name})",
        "",
    ]
    if claims_path is not None:
        verdicts = claim_verdicts(found, read_task_claims(claims_path, sorted(frame["task"].unique())))
        verdicts.to_csv(out / "claims_verdicts.csv", index=False)
        lines += ["## Preregistered orderings", "", *claims_lines(verdicts), ""]
    path = out / "tasks.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="posab tasks", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run/sweep directories, or report folders")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument(
        "--claims", type=Path, help="the suite's claims file (orderings stated before the runs)"
    )
    args = parser.parse_args(argv)
    try:
        path = write_tasks_report(args.paths, args.out, args.claims)
    except ReportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0
