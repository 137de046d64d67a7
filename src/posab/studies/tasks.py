"""The algorithmic task suite's report (issue 44): exact match past the training lengths per task and
encoding, the NoPE study's aggregate, and the preregistered orderings tested seed by seed.

    posab tasks outputs/multirun/SWEEP [DIR ...] --out results/tasks [--claims results/tasks/claims.csv]
        [--budgets results/tasks/pilot/budgets.csv]

Reads the runs as `posab report` does (run folders, sweeps or a runs.csv), keeps the finished runs of a
task (`data.task.name`), and writes into `--out`: tasks.md, tasks.csv (one line per run), mrr.csv,
claims_verdicts.csv (with `--claims`), tasks.png (accuracy against instance length, a panel per task, the
mean over seeds per encoding, the training lengths shaded), tasks_heatmap.png and the errors' tables
(`posab.studies.task_errors`) and runs.csv. With `--claims`, `--write FILE
...` rewrites the block between TASK_BEGIN and TASK_END in each file (results/README.md, the suite's
README) with the claims' tables, so that no sentence there gives an ordering another verdict than its test.
With `--budgets`, a task that no reference of the pilot learned within its cap leaves the MRR and the claims
(a `mean` covers the other tasks; a claim on it is refused), and the report names it with its reason; a
`mean` claim is refused until the runs hold every task the pilot keeps (a grid folded part by part).

- Accuracy: `task/exact_unseen`, the mean over the test lengths past `data.task.train_lengths` of exact
  match (`posab.evaluate.task`), per run; a cell is the mean over seeds, then each seed's value.
- The aggregate, as the NoPE study's (`plot_aggregate_final.ipynb` of McGill-NLP/length-generalization):
  for every (task, seed) the encodings are ranked by accuracy, and each encoding's mean reciprocal rank
  (MRR) is the mean of 1 / rank over them. Ties take the mean of the ranks they span (the reference's
  pandas `rank(method="first")` breaks them by row order, which at this scale, where many encodings score
  0, would rank by the order of the table). Computed among the five encodings the paper ranks, beside its
  values, and among every encoding that ran every task.
- Orderings: a claims file (columns `family, row, reference, task, direction, status, registered,
  statement`: encodings, a task or `mean` over the tasks both ran, `greater` or `less`; optionally `fit`,
  issue 58: a (task, seed) pair counts only where both runs reach that exact match at the training lengths,
  and the table says how many pairs each claim lost so) states each ordering before its runs. The pairs are
  the (task, seed) cells the claim covers: the two encodings' runs of one task and seed saw the same
  training examples in the same order and are scored on the same test examples, and runs of different cells
  are separate trainings. Each pair's difference is the mean over the unseen lengths; the one-sided sign-
  flip test over the pairs (`posab.report.resampling`: under the null the two runs of a cell are
  exchangeable) gives p, Holm-adjusted within the family; a 95% percentile bootstrap interval of the mean
  difference over tasks resamples the seeds and, within each task, the test lengths (every run is scored on
  the same examples at each length). Verdicts as the study's claims (`posab.report.stats.verdict`). A claim
  on one task has 3 pairs at 3 seeds, whose least p is 1/8; a claim on the `mean` of six tasks has 18, so
  its least p is far below α (each family's floor is stated). The per-seed column gives the mean over tasks
  at each seed.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from posab.io import write_text
from posab.keys import key_lengths, metric_key
from posab.plots import new_figure, save_figure
from posab.report.budgets import kept_tasks, read_budgets, unlearned_tasks
from posab.report.cli import collect_runs
from posab.report.markdown import markdown_table
from posab.report.records import ReportError, RunRecord
from posab.report.resampling import (
    EXACT_SPLITS,
    PERMUTATIONS,
    holm,
    least_holm_p,
    least_one_sided_p,
    sign_flip_p,
)
from posab.report.runs_csv import write_csv
from posab.report.stats import ALPHA
from posab.report.styles import encoding_colours, shared_colour_styles
from posab.studies.claims import STATUSES, claims_file_lines
from posab.studies.readings import add_write_argument, replace_block
from posab.studies.task_errors import PAPER_FIVE, TASK, TRAIN_LENGTHS, error_lines, heatmap_figure, task_of
from posab.studies.verdicts import claim_verdict

UNSEEN, SEEN = metric_key("exact_unseen"), metric_key("exact_seen")
# the reference's printed MRR over its 17 dataset-splits, no scratchpad (plot_aggregate_final.ipynb)
PAPER_MRR = {"nope": 0.687, "t5": 0.549, "alibi": 0.502, "rope": 0.330, "sinusoidal": 0.215}
MEAN = "mean"  # a claim over the mean of the tasks both encodings ran
TASK_BEGIN = "<!-- task claims: generated by `posab tasks --claims`; edit the claims file, not this block -->"
TASK_END = "<!-- task claims: end -->"
CLAIMS_LEGEND = (
    "pairs: the (task, seed) cells both encodings ran: one task's two runs of one seed saw the same training "
    "examples in the same order and are scored on the same test examples; each pair's difference is the mean "
    "over the unseen lengths",
    f"p: the one-sided sign-flip test over the pairs, in the claim's stated direction (exact up to "
    f"{EXACT_SPLITS} pairs, else {PERMUTATIONS:,} random sign assignments); Holm: adjusted within the "
    "family; 95% interval: the percentile bootstrap of the mean difference (seeds, and lengths within each "
    "task, resampled)",
    f"verdict: `ordered` when the interval excludes 0 on the claimed side and Holm < {ALPHA}; `suggestive` "
    "when one of the two holds; `opposite` when the interval excludes 0 on the other side; else "
    "`indistinguishable`. A `post-hoc` claim (chosen after its runs were seen) is at most `suggestive`",
)
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
            TaskRun(run.encoding, task_of(run), run.seed, run.metrics[UNSEEN], seen, by_length, (low, high))
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
    fit: float | None = (
        None  # a (task, seed) pair counts only where both runs reach this at the training lengths
    )


def read_task_claims(
    path: Path, tasks: Sequence[str], left_out: Mapping[str, str] | None = None
) -> list[TaskClaim]:
    """The claims of a task claims file; a missing column or a value out of its set names its line, and a
    claim on a task `left_out` of the aggregate (the pilot's rule: task -> why) is refused with the reason."""
    left_out = left_out or {}
    claims = []
    for number, line in claims_file_lines(path, "task claims file", CLAIM_COLUMNS, ("fit",)):
        where = f"task claims file {path}, line {number}"
        if line["task"] in left_out:
            raise ReportError(
                f"{where}: task {line['task']!r} is left out of the suite ({left_out[line['task']]})"
            )
        if line["task"] not in (*tasks, MEAN):
            raise ReportError(f"{where}: task {line['task']!r}; valid: {', '.join([*tasks, MEAN])}")
        if line["direction"] not in ("greater", "less"):
            raise ReportError(f"{where}: direction {line['direction']!r}; valid: greater, less")
        if line["status"] not in STATUSES:
            raise ReportError(f"{where}: status {line['status']!r}; valid: {', '.join(STATUSES)}")
        claims.append(
            TaskClaim(**{c: line[c] for c in CLAIM_COLUMNS}, fit=fit_of(line.get("fit", ""), where))
        )
    return claims


def fit_of(text: str, where: str) -> float | None:
    """A claim's `fit` (empty: none): the exact match at the training lengths both runs of a pair need."""
    if not str(text).strip():
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise ReportError(f"{where}: fit {text!r}; valid: empty, or an exact match in [0, 1] (e.g. 0.9)")
    return value


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


def fitting_seeds(found: Sequence[TaskRun], claim: TaskClaim) -> dict[str, np.ndarray]:
    """Per covered task, a (seeds,) mask over `common_seeds`: True where both runs reach the claim's `fit`
    at the training lengths (every seed without one)."""
    runs = {(r.encoding, r.task, r.seed): r for r in found}
    tasks = covered_tasks(found, claim)
    seeds = common_seeds(found, claim, tasks)
    return {
        task: np.array(
            [
                claim.fit is None
                or min(runs[(e, task, s)].seen for e in (claim.row, claim.reference)) >= claim.fit
                for s in seeds
            ]
        )  # fmt: skip
        for task in tasks
    }


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


def check_coverage(found: Sequence[TaskRun], claim: TaskClaim, suite: Sequence[str]) -> None:
    """A `mean` claim is over the suite's kept tasks (`suite`: the pilot's, with `--budgets`); a grid that
    has not yet run one of them for both encodings (a part landed, not the whole) cannot test it."""
    if claim.task != MEAN:
        return
    missing = sorted(set(suite) - set(covered_tasks(found, claim)))
    if missing:
        raise ReportError(
            f"claim {claim.row} vs {claim.reference} on mean: it covers the suite's kept tasks "
            f"({', '.join(sorted(suite))}); no runs of both on {', '.join(missing)} yet: fold the parts "
            "without --claims until the grid has them"
        )


def claim_verdicts(
    found: Sequence[TaskRun], claims: Sequence[TaskClaim], suite: Sequence[str] = ()
) -> pd.DataFrame:
    """Each claim's difference, per-seed differences, its (task, seed) pairs (those where both runs fit,
    for a claim that states `fit`; `pairs_lost` the others), one-sided p over them, Holm within its
    family, interval and verdict. A `mean` claim needs runs on every task of `suite` (`check_coverage`)."""
    lines = []
    for claim in claims:
        check_coverage(found, claim, suite)
        differences, kept = paired_lengths(found, claim), fitting_seeds(found, claim)
        lines.append(claim_line(claim, differences, kept))
    frame = pd.DataFrame(lines)
    frame["p_holm"] = holm_by_family(frame)
    frame["verdict"] = [claim_verdict(line) for _, line in frame.iterrows()]
    return frame


def holm_by_family(frame: pd.DataFrame) -> pd.Series:
    """Each claim's `p` adjusted by Holm within its `family` (the lines of one family, in any order)."""
    adjusted = pd.Series(np.nan, index=frame.index)
    for _, index in frame.groupby("family", sort=False).groups.items():
        adjusted.loc[index] = holm(frame.loc[index, "p"].tolist())
    return adjusted


def claim_line(claim: TaskClaim, differences: dict[str, np.ndarray], kept: dict[str, np.ndarray]) -> dict:
    """One claim's line from its (task, seed) cells: every cell, or those `kept` (both runs fit)."""
    cells = np.stack([values.mean(axis=1) for values in differences.values()])  # (tasks, seeds)
    mask = np.stack([kept[task] for task in differences])  # (tasks, seeds)
    if mask.all():
        per_seed, (low, high) = cells.mean(axis=0), bootstrap(differences)
        texts = [f"{d:+.3f}" for d in per_seed]
    else:
        counted = np.where(mask, cells, np.nan)
        per_seed = np.nanmean(counted, axis=0) if mask.any() else np.full(cells.shape[1], np.nan)
        low, high = bootstrap_cells({t: v[kept[t]] for t, v in differences.items() if kept[t].any()})
        texts = ["–" if np.isnan(d) else f"{d:+.3f}" for d in per_seed]
    values = cells[mask]  # the pairs counted, in (task, seed) order
    difference = float(values.mean()) if values.size else math.nan
    return {
        "family": claim.family, "row": claim.row, "reference": claim.reference, "task": claim.task,
        "direction": claim.direction, "difference": float(np.mean(per_seed)) if mask.all() else difference,
        "per_seed": " / ".join(texts), "pairs": int(values.size), "low": low, "high": high,
        "p": sign_flip_p(values, claim.direction) if values.size else 1.0, "status": claim.status,
        "registered": claim.registered, "statement": claim.statement,
        "fit": math.nan if claim.fit is None else claim.fit, "pairs_lost": int((~mask).sum()),
    }  # fmt: skip


def bootstrap_cells(differences: dict[str, np.ndarray]) -> tuple[float, float]:
    """`bootstrap` where the tasks kept different seeds: each task's seeds resampled on their own, and its
    lengths within it; (nan, nan) without a cell."""
    if not differences:
        return math.nan, math.nan
    rng = np.random.default_rng(0)
    means = []
    for values in differences.values():
        seeds, lengths = values.shape
        rows = rng.integers(0, seeds, size=(DRAWS, seeds))  # (draws, seeds)
        columns = rng.integers(0, lengths, size=(DRAWS, lengths))  # (draws, lengths)
        means.append(values[rows[:, :, None], columns[:, None, :]].mean(axis=(1, 2)))
    low, high = np.percentile(np.mean(means, axis=0), [2.5, 97.5])
    return float(low), float(high)


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
            *claims_table(claims),
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


def claims_table(claims: pd.DataFrame) -> list[str]:
    """A family's table; with the pairs each claim lost to its `fit` rule where the family states one."""
    rows = [_claim_cells(line) for _, line in claims.iterrows()]
    fits = pd.to_numeric(claims["fit"], errors="coerce") if "fit" in claims else pd.Series(dtype=float)
    if fits.isna().all():  # no fit rule (an empty cell of a claims_verdicts.csv read as text, too)
        return markdown_table(CLAIMS_HEADER, rows)
    lost = [
        f"{int(line['pairs_lost'])} (fit {fit:g})"
        for (_, line), fit in zip(claims.iterrows(), fits, strict=True)
    ]
    header = [*CLAIMS_HEADER[:5], "pairs lost", *CLAIMS_HEADER[5:]]
    return markdown_table(
        header, [[*row[:5], extra, *row[5:]] for row, extra in zip(rows, lost, strict=True)]
    )


def _claim_cells(line: pd.Series) -> list[str]:
    sign = ">" if line["direction"] == "greater" else "<"
    interval = f"[{line['low']:+.3f}, {line['high']:+.3f}]"
    numbers = [f"{line['difference']:+.3f}", line["per_seed"], str(line["pairs"]), interval]
    tests = [f"{line['p']:.4f}", f"{line['p_holm']:.4f}", line["verdict"]]
    return [f"{line['row']} {sign} {line['reference']}", line["task"], *numbers, *tests]


def claims_block(verdicts: pd.DataFrame) -> list[str]:
    """The claims' tables and their legend: the block `--write` puts between TASK_BEGIN and TASK_END."""
    registered = verdicts.drop_duplicates("family")[["family", "status", "registered"]]
    heads = [
        f"Family `{f}` ({status}; registered: {when})." for f, status, when in registered.itertuples(False)
    ]
    return [*heads, "", *claims_lines(verdicts), "Legend:", "", *(f"- {item}" for item in CLAIMS_LEGEND)]


def tested_claims(
    found: Sequence[TaskRun],
    tasks: Sequence[str],
    claims_path: Path,
    readings: Sequence[Path],
    left_out: Mapping[str, str],
    suite: Sequence[str] = (),
) -> tuple[pd.DataFrame, dict[Path, str]]:
    """The claims' verdicts, and each reading's text with its claims block rewritten (not yet written). The
    tasks `left_out` (task -> why) leave the claims as they leave the MRR: a `mean` covers the others, and
    needs every task of `suite` (the pilot's kept tasks)."""
    kept = [r for r in found if r.task not in left_out]
    verdicts = claim_verdicts(kept, read_task_claims(claims_path, tasks, left_out), suite)
    block = claims_block(verdicts)
    texts = {
        p: replace_block(p.read_text(encoding="utf-8"), block, str(p), TASK_BEGIN, TASK_END) for p in readings
    }
    return verdicts, texts


def report_lines(frame: pd.DataFrame, mrr_text: Sequence[str], figure: str) -> list[str]:
    """tasks.md without its claims: the accuracy tables, the MRR and the figure."""
    return [
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
        f"![exact match against instance length]({figure})",
        "",
    ]


def write_tasks_report(
    paths: Sequence[Path],
    out: Path,
    claims_path: Path | None,
    readings: Sequence[Path] = (),
    budgets_path: Path | None = None,
) -> Path:
    """Every file of the report into `out`; with `readings`, their claims blocks rewritten. Everything is
    computed, and each reading checked for its block, before anything is written."""
    if readings and claims_path is None:
        raise ReportError("--write needs --claims: the block it rewrites holds the claims' verdicts")
    runs = collect_runs(paths)
    found = task_runs(runs)
    frame = frame_of(found)
    tasks = sorted(frame["task"].unique())
    left_out, suite = {}, []
    if budgets_path:
        budgets = read_budgets(budgets_path, tasks)
        left_out, suite = unlearned_tasks(budgets, tasks), kept_tasks(budgets)
    verdicts, texts = (
        tested_claims(found, tasks, claims_path, readings, left_out, suite) if claims_path else (None, {})
    )
    mrr_text, mrr_table = mrr_lines(frame[~frame["task"].isin(left_out)])
    if left_out:
        reasons = [f"{task}: {why}" for task, why in left_out.items()]
        mrr_text = [*mrr_text, "", f"Left out of the aggregate and the claims: {'; '.join(reasons)}."]
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "tasks.csv", index=False)
    write_csv([r for r in runs if r.finished and TASK in r.config], out / "runs.csv")
    mrr_table.to_csv(out / "mrr.csv", index_label="encoding")
    figure = save_figure(accuracy_figure(found), out / "tasks.png")
    lines = report_lines(frame, mrr_text, figure.name)
    heatmap = heatmap_figure(runs)
    if heatmap is not None:
        lines += [
            f"![exact match per encoding and length]({save_figure(heatmap, out / 'tasks_heatmap.png').name})",
            "",
        ]
    lines += error_lines(runs)
    if verdicts is not None:
        verdicts.to_csv(out / "claims_verdicts.csv", index=False)
        lines += ["## Preregistered orderings", "", *claims_lines(verdicts), ""]
    path = out / "tasks.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    for reading, text in texts.items():
        write_text(reading, text)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="posab tasks", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run/sweep directories, or report folders")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument(
        "--claims", type=Path, help="the suite's claims file (orderings stated before the runs)"
    )
    add_write_argument(
        parser,
        "with --claims: Markdown files whose task claims block to rewrite (README.md, "
        "results/tasks/README.md)",
    )
    parser.add_argument(
        "--budgets",
        type=Path,
        help="the pilot's budgets.csv (`posab task-budgets`): tasks no reference learned leave the aggregate",
    )
    args = parser.parse_args(argv)
    try:
        path = write_tasks_report(args.paths, args.out, args.claims, args.write, args.budgets)
    except (ReportError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0
