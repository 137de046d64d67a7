"""A claim across model sizes (issue 58's ladder, conf/experiment/tasks_ladder.yaml): "exact match past the
training lengths rises with model size", for one encoding on one task, tested as a trend, not as pairs.

Paired by seed, three seeds give a least one-sided p of 1/8 whatever the sizes show: no such claim could be
`ordered`. A trend over every run of every size can: the Jonckheere-Terpstra statistic (Jonckheere, 1954,
Biometrika 41; Terpstra, 1952) J = the number of (smaller size, larger size) run pairs whose larger-size run
scored higher, a tie counting 1/2, and its exact permutation p: the share of all assignments of the pooled
runs' values to the sizes (group sizes kept) whose J is at least the observed one (every assignment while
there are at most 200,000; else 20,000 drawn, (k + 1) / (20,001)). Three sizes of three runs have 1,680
assignments: a least p of 1/1,680 when no two runs tie. Ties raise it (every run at 0: p = 1).

Claims file (CSV, one claim a line): family, row (the encoding), task, sizes (model configs of conf/model,
smallest first, separated by spaces), direction (`increasing` or `decreasing`), status, registered,
statement, and optionally fit (a run counts only where its exact match at the training lengths reaches it;
the verdict says how many runs that dropped). A family is tested by Holm. The interval: the mean at the
largest size minus the mean at the smallest, 2.5th and 97.5th percentiles of 10,000 bootstrap draws of the
runs within each size. Verdicts as the other claims' (`posab.report.stats.verdict`).

    posab size-trend RUNS_OR_REPORTS ... --out DIR [--claims results/tasks/claims_ladder.csv]
    posab size-trend --plan results/tasks/claims_ladder.csv --seeds 3     # before the ladder runs

Every run writes the ladder's table and figure into DIR: `ladder.csv` and `ladder.md` (per encoding, task
and model size, by parameters: runs, exact match at the training lengths and past them, mean and sd over
seeds) and `ladder.png` (a panel per task: exact match past the training lengths against parameters, log
scale, a line per encoding through its means, each run a dot; the NoPE study's five drawn solid, the
others dashed); with `--claims` also `size_trend_verdicts.csv` and `size_trend.md`.

The plan exits 2, naming the family, when a family cannot reach α at the planned runs; it also gives the
runs the fit rule may drop (in the worst place) with the family still able to.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from omegaconf import OmegaConf

from posab.paths import conf_dir
from posab.plots import new_figure, save_figure
from posab.report.cli import collect_runs
from posab.report.markdown import markdown_table
from posab.report.records import ReportError, RunRecord
from posab.report.stats import ALPHA, verdict
from posab.studies.claims import POST_HOC, STATUSES, claims_file_lines
from posab.studies.power import alpha_level, positive_count
from posab.studies.tasks import SEEN, UNSEEN, fit_of, holm_by_family

CLAIM_COLUMNS = ("family", "row", "task", "sizes", "direction", "status", "registered", "statement")
DIRECTIONS = ("increasing", "decreasing")
EXACT_LIMIT, DRAWS, BOOTSTRAP_DRAWS = 200_000, 20_000, 10_000
SIZE_KEYS = ("d_model", "n_layers", "n_heads")  # what tells one model config from another


@dataclass(frozen=True)
class SizeClaim:
    family: str
    row: str
    task: str
    sizes: tuple[str, ...]
    direction: str
    status: str
    registered: str
    statement: str
    fit: float | None = None


def jonckheere(groups: Sequence[np.ndarray]) -> float:
    """J: over every pair of groups a < b, the pairs (x in a, y in b) with y > x, a tie counting 1/2."""
    total = 0.0
    for a, b in itertools.combinations(groups, 2):
        difference = b[None, :] - a[:, None]  # (len a, len b)
        total += float((difference > 0).sum() + 0.5 * (difference == 0).sum())
    return total


def assignments(counts: Sequence[int]) -> int:
    """The ways to assign sum(counts) runs to groups of these sizes: the multinomial coefficient."""
    return math.factorial(sum(counts)) // math.prod(math.factorial(c) for c in counts)


def trend_p(groups: Sequence[np.ndarray], direction: str = "increasing") -> float:
    """The one-sided permutation p of J in `direction` (module docstring)."""
    ordered = list(groups) if direction == "increasing" else list(groups)[::-1]
    observed = jonckheere(ordered)
    pooled = np.concatenate(ordered)
    counts = [len(g) for g in ordered]
    if assignments(counts) <= EXACT_LIMIT:
        found = [jonckheere(split(pooled, order)) for order in exact_orders(counts)]
        return float(np.mean(np.asarray(found) >= observed - 1e-9))
    rng = np.random.default_rng(0)
    draws = [jonckheere(split(rng.permutation(pooled), None, counts)) for _ in range(DRAWS)]
    return (1 + int((np.asarray(draws) >= observed - 1e-9).sum())) / (DRAWS + 1)


def exact_orders(counts: Sequence[int]) -> list[list[np.ndarray]]:
    """Every assignment of indices 0 .. sum(counts) - 1 to groups of `counts` (index arrays per group)."""
    if len(counts) == 1:
        return [[np.arange(counts[0])]]
    orders = []
    every = range(sum(counts))
    for first in itertools.combinations(every, counts[0]):
        rest = [i for i in every if i not in first]
        for tail in exact_orders(counts[1:]):
            orders.append([np.asarray(first), *(np.asarray(rest)[t] for t in tail)])
    return orders


def split(pooled: np.ndarray, order: list[np.ndarray] | None, counts: Sequence[int] = ()) -> list[np.ndarray]:
    """The pooled values in groups: by index arrays (`order`), or consecutive runs of `counts`."""
    if order is not None:
        return [pooled[index] for index in order]
    return np.split(pooled, np.cumsum(counts)[:-1])


def interval(groups: Sequence[np.ndarray], direction: str) -> tuple[float, float, float]:
    """The largest size's mean minus the smallest's (in `direction`'s sense: decreasing flips it) and its
    bootstrap interval (module docstring)."""
    sign = 1.0 if direction == "increasing" else -1.0
    first, last = groups[0], groups[-1]
    rng = np.random.default_rng(0)
    draws = [
        rng.choice(last, len(last)).mean() - rng.choice(first, len(first)).mean()
        for _ in range(BOOTSTRAP_DRAWS)
    ]
    low, high = np.percentile(draws, [2.5, 97.5])
    return sign * float(last.mean() - first.mean()), *sorted((sign * float(low), sign * float(high)))


def read_size_claims(path: Path) -> list[SizeClaim]:
    """The claims of a size-trend claims file; a missing column or a value out of its set names its line."""
    claims = []
    for number, line in claims_file_lines(path, "size-trend claims file", CLAIM_COLUMNS, ("fit",)):
        where = f"size-trend claims file {path}, line {number}"
        sizes = tuple(line["sizes"].split())
        if len(sizes) < 2 or len(set(sizes)) < len(sizes):
            raise ReportError(
                f"{where}: sizes {line['sizes']!r}; give two or more model configs, smallest first"
            )
        for size in sizes:
            model_shape(size, where)
        if line["direction"] not in DIRECTIONS:
            raise ReportError(f"{where}: direction {line['direction']!r}; valid: {', '.join(DIRECTIONS)}")
        if line["status"] not in STATUSES:
            raise ReportError(f"{where}: status {line['status']!r}; valid: {', '.join(STATUSES)}")
        fields = {c: line[c] for c in CLAIM_COLUMNS if c != "sizes"}
        claims.append(SizeClaim(**fields, sizes=sizes, fit=fit_of(line.get("fit", ""), where)))
    return claims


def model_shape(size: str, where: str = "") -> tuple[str, ...]:
    """The (d_model, n_layers, n_heads) of conf/model/SIZE.yaml, as text (as a run's config holds them)."""
    path = conf_dir() / "model" / f"{size}.yaml"
    if not path.is_file():
        valid = ", ".join(sorted(p.stem for p in path.parent.glob("*.yaml")))
        raise ReportError(f"{where}: model size {size!r} is no conf/model config; valid: {valid}")
    model = OmegaConf.load(path)
    return tuple(str(model[k]) for k in SIZE_KEYS)


def size_groups(runs: Sequence[RunRecord], claim: SizeClaim) -> tuple[list[np.ndarray], int]:
    """Per size (the claim's order): the exact match at unseen lengths of the claim's encoding on its task,
    one value per finished run that fits; and the runs the fit rule dropped."""
    shapes = {model_shape(size): size for size in claim.sizes}
    values: dict[str, list[float]] = {size: [] for size in claim.sizes}
    dropped = 0
    for run in runs:
        shape = tuple(run.config.get(f"model.{k}", "") for k in SIZE_KEYS)
        if not (run.finished and run.encoding == claim.row and shape in shapes and UNSEEN in run.metrics):
            continue
        if run.config.get("data.task.name") != claim.task:
            continue
        if claim.fit is not None and not run.metrics.get(SEEN, math.nan) >= claim.fit:
            dropped += 1
            continue
        values[shapes[shape]].append(float(run.metrics[UNSEEN]))
    return [np.asarray(values[size]) for size in claim.sizes], dropped


def claim_lines(runs: Sequence[RunRecord], claims: Sequence[SizeClaim]) -> pd.DataFrame:
    """One line per claim: runs per size, mean per size, J, p, Holm within its family, interval, verdict."""
    lines = []
    for claim in claims:
        groups, dropped = size_groups(runs, claim)
        if any(len(g) == 0 for g in groups):
            raise ReportError(
                f"claim {claim.family} ({claim.row} on {claim.task}): no counted run at size(s) "
                f"{', '.join(s for s, g in zip(claim.sizes, groups, strict=True) if not len(g))}"
            )
        difference, low, high = interval(groups, claim.direction)
        lines.append(
            {
                "family": claim.family, "row": claim.row, "task": claim.task, "sizes": " ".join(claim.sizes),
                "direction": claim.direction, "runs": " / ".join(str(len(g)) for g in groups),
                "means": " / ".join(f"{g.mean():.3f}" for g in groups), "runs_lost": dropped,
                "j": jonckheere(groups if claim.direction == "increasing" else groups[::-1]),
                "difference": difference, "low": low, "high": high, "p": trend_p(groups, claim.direction),
                "status": claim.status, "registered": claim.registered, "statement": claim.statement,
            }
        )  # fmt: skip
    frame = pd.DataFrame(lines)
    frame["p_holm"] = holm_by_family(frame)
    frame["verdict"] = [line_verdict(line) for _, line in frame.iterrows()]
    return frame


def line_verdict(line: pd.Series) -> str:
    """`verdict` on the claimed side (the interval is already signed that way); a post-hoc claim is at most
    suggestive."""
    found = verdict(line["low"] > 0, line["high"] < 0, float(line["p_holm"]))
    return "suggestive" if found == "ordered" and line["status"] == POST_HOC else found


def least_p(counts: Sequence[int]) -> float:
    """The least p J's test can give at these runs per size (no ties): 1 / assignments, or 1 / 20,001 once
    it samples; a size without a run leaves the trend over the others (1 with fewer than two sizes)."""
    kept = [c for c in counts if c > 0]
    if len(kept) < 2:
        return 1.0
    ways = assignments(kept)
    return 1 / ways if ways <= EXACT_LIMIT else 1 / (DRAWS + 1)


def may_lose(sizes: int, seeds: int, claims: int, alpha: float) -> int:
    """The most runs the fit rule can drop, wherever it drops them, with the family's least Holm p < α."""
    lost = 0
    while lost < sizes * seeds:
        worst = max(
            least_p(counts)
            for counts in itertools.product(range(seeds + 1), repeat=sizes)
            if sum(counts) == sizes * seeds - lost - 1
        )
        if claims * worst >= alpha:
            return lost
        lost += 1
    return lost


def plan_lines(claims: Sequence[SizeClaim], seeds: int, alpha: float) -> tuple[list[str], list[str]]:
    """The plan per family (its least Holm p at `seeds` runs per size), and the refusals."""
    header = ["family", "claims", "runs per size", "least p", "least Holm p", "reaches α", "may lose"]
    rows, refused = [], []
    families: dict[str, list[SizeClaim]] = {}
    for claim in claims:
        families.setdefault(claim.family, []).append(claim)
    for family, found in families.items():
        sizes = min(len(c.sizes) for c in found)
        least = least_p([seeds] * sizes)
        adjusted = min(1.0, len(found) * least)
        spare = may_lose(sizes, seeds, len(found), alpha) if adjusted < alpha else 0
        reaches = "yes" if adjusted < alpha else "no"
        rows.append(
            [family, str(len(found)), str(seeds), f"{least:.3g}", f"{adjusted:.3g}", reaches, str(spare)]
        )
        if adjusted >= alpha:
            refused.append(
                f"family {family}: {len(found)} claims at {seeds} runs per size: least Holm p "
                f"{adjusted:.3g} >= {alpha:g}; add seeds or sizes"
            )
    return markdown_table(header, rows), refused


NOPE_STUDY = ("nope", "t5", "alibi", "rope", "sinusoidal")  # drawn solid in the figure


def ladder_frame(runs: Sequence[RunRecord]) -> pd.DataFrame:
    """Per (encoding, task, parameters): runs, exact match seen and unseen (mean, sd over the runs)."""
    lines = [
        {
            "encoding": run.encoding,
            "task": run.config.get("data.task.name", ""),
            "params": int(run.metrics["params/total"]),
            "seen": run.metrics.get(SEEN, math.nan),
            "unseen": run.metrics[UNSEEN],
        }
        for run in runs
        if run.finished and UNSEEN in run.metrics and "params/total" in run.metrics
    ]
    if not lines:
        raise ReportError(f"no finished task run with `{UNSEEN}` and `params/total` in its results")
    frame = pd.DataFrame(lines)
    grouped = frame.groupby(["encoding", "task", "params"])
    table = grouped.agg(
        runs=("unseen", "size"),
        seen=("seen", "mean"),
        seen_sd=("seen", "std"),
        unseen=("unseen", "mean"),
        unseen_sd=("unseen", "std"),
    )
    return table.reset_index().sort_values(["task", "encoding", "params"], ignore_index=True)


def ladder_figure(runs: Sequence[RunRecord], table: pd.DataFrame) -> Figure:
    """A panel per task: unseen exact match against parameters (module docstring)."""
    tasks = sorted(table["task"].unique())
    fig = new_figure(4.5 * len(tasks), 3.8)
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    for ax, task in zip(axes, tasks, strict=True):
        for index, (encoding, rows) in enumerate(table[table["task"] == task].groupby("encoding")):
            style = "-" if encoding in NOPE_STUDY else "--"
            line = ax.plot(
                rows["params"], rows["unseen"], style, marker="o", label=encoding, color=f"C{index}"
            )
            dots = [
                (r.metrics["params/total"], r.metrics[UNSEEN])
                for r in runs
                if r.finished and r.encoding == encoding and r.config.get("data.task.name") == task
                and UNSEEN in r.metrics and "params/total" in r.metrics
            ]  # fmt: skip
            ax.scatter(*zip(*dots, strict=True), s=10, alpha=0.5, color=line[0].get_color())
        ax.set(xscale="log", xlabel="parameters", ylabel="exact match past the training lengths", title=task)
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=7)
    return fig


def write_ladder(runs: Sequence[RunRecord], out: Path) -> Path:
    """ladder.csv, ladder.md and ladder.png in `out` (module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    table = ladder_frame(runs)
    table.to_csv(out / "ladder.csv", index=False)
    cells = [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in line] for line in table.values]
    lines = [
        "# Exact match by model size (`posab size-trend`)",
        "",
        *markdown_table(list(table.columns), cells),
    ]
    (out / "ladder.md").write_text("\n".join([*lines, ""]), encoding="utf-8")
    save_figure(ladder_figure(runs, table), out / "ladder.png")
    return out / "ladder.md"


def write_verdicts(frame: pd.DataFrame, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "size_trend_verdicts.csv", index=False)
    columns = [
        "family",
        "row",
        "task",
        "sizes",
        "runs",
        "means",
        "runs_lost",
        "j",
        "difference",
        "low",
        "high",
    ]
    columns += ["p", "p_holm", "verdict"]
    cells = [[f"{v:.4g}" if isinstance(v, float) else str(v) for v in line] for line in frame[columns].values]
    lines = ["# Claims across model sizes (`posab size-trend`)", "", *markdown_table(columns, cells), ""]
    path = out / "size_trend.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="posab size-trend", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, help="run/sweep directories, or report folders")
    parser.add_argument("--claims", type=Path, help="the size-trend claims file")
    parser.add_argument("--plan", type=Path, help="plan this claims file instead (with --seeds)")
    parser.add_argument("--seeds", type=positive_count, help="runs per size the ladder plans (--plan)")
    parser.add_argument("--alpha", type=alpha_level, default=ALPHA, help=f"the level (default {ALPHA})")
    parser.add_argument("--out", type=Path, help="output folder (the verdicts)")
    args = parser.parse_args(argv)
    try:
        if args.plan is not None:
            if args.seeds is None:
                parser.error("--plan needs --seeds")
            lines, refused = plan_lines(read_size_claims(args.plan), args.seeds, args.alpha)
            print("\n".join(lines))
            for line in refused:
                print(f"error: {line}", file=sys.stderr)
            return 2 if refused else 0
        if args.out is None or not args.paths:
            parser.error("give RUNS ... and --out (or --plan FILE --seeds N)")
        runs = collect_runs(args.paths)
        print(write_ladder(runs, args.out))
        if args.claims is not None:
            print(write_verdicts(claim_lines(runs, read_size_claims(args.claims)), args.out))
    except (ReportError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
