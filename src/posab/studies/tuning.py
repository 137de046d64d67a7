"""Equal tuning of a study (the reference study's part 2): each encoding's learning rate and, for an encoding
with parameters, the multiplier of its own group's learning rate, picked on the validation loss.

    posab tuning outputs/multirun/SWEEP [DIR ...] --out results/NAME

Reads the runs as `scripts/report.py` does. Each finished run is one point (form, `train.lr`,
`encoding.lr_mult`) scored by its final validation loss (`val_loss`: `train.val_windows` fixed windows of the
valid split, the same for every run), or, for a task family that every rate learns (`FAMILY_CRITERIA`), by the
geometric mean of the validation losses logged over the run (`val/loss` in metrics.jsonl). A task suite's runs
(`data.task.name`) make one point per (form, lr, lr_mult): the mean of the scores (losses on answer tokens of
the valid split's fixed examples) over the tasks the encoding was tuned on. A form is the encoding and those
of its options (`encoding.*`, lr_mult aside) that differ between its runs and from its yaml's default: RoPE at
`encoding.rotary_dim=8` is tuned apart from RoPE (issue 58's variants), which keeps its name. Per form: the lr
with the lowest score among the runs at lr_mult 1, then the lr_mult with the lowest score among the runs at
that lr. A pick at the edge of the grid searched is flagged, with the rate one log-spaced step past it that
extends the grid (issue 58): the best rate may lie beyond it; a pick from one rate alone is flagged too (it
searched nothing). `--family NAME` picks on one task family's runs alone (`Task.family`: sequence, arithmetic,
recall, state), so that each family is tuned on its own tasks (issue 58). Writes tuning.md (every point, the
picks), picks.csv and tuning.png (loss against lr per encoding); the picks are printed as the Hydra grid lines
of a study that runs each encoding at them."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from posab.data.tasks import TASKS
from posab.plots import new_figure, save_figure
from posab.report.cli import collect_runs
from posab.report.grouping import label_keys, swept_keys
from posab.report.markdown import markdown_table
from posab.report.records import ReportError, RunRecord
from posab.report.rundirs import encoding_defaults
from posab.report.styles import encoding_colours, legend_right

LR, MULT, SCORE, TASK = "train.lr", "encoding.lr_mult", "val_loss", "data.task.name"
FINAL, CURVE = "final", "curve"  # a run's score: its final val_loss, or the geometric mean of its val/loss
CRITERIA = {FINAL: "final validation loss", CURVE: "geometric mean of the validation losses over the run"}
# Issue 58's state family (flip-flop, 4,000 steps) is learned at every rate: NoPE ends at 6.0e-8 nats at
# 2.5e-4 and 2.1e-9 at 5e-4 (results/tasks/tuning_state, part 1), where one seed orders rates by float32
# noise. So it is picked on the whole validation curve (every 250 steps), which still separates a rate that
# learns fast and stays learned from one that gets there late or spikes; stated before its remaining 43 runs.
FAMILY_CRITERIA = {"state": CURVE}
LOSS_FLOOR = 1e-12  # nats: a logged loss of exactly 0 (float32 rounding of -log p at p ~ 1) counts as this


@dataclass(frozen=True)
class Pick:
    encoding: str
    options: str  # its form's options as overrides, "encoding.rotary_dim=8"; "" for the encoding as it is
    lr: float
    lr_mult: float
    score: float  # the loss it was picked on (`criterion`), the mean over its tasks
    criterion: str  # FINAL or CURVE
    edge: bool  # the picked lr is the smallest or largest of the grid searched (or its only rate)

    @property
    def form(self) -> str:
        """The encoding and its form's options: "rope, encoding.rotary_dim=8", "rope"."""
        return form_name(self.encoding, self.options)


def form_name(encoding: str, options: str) -> str:
    return ", ".join(part for part in (encoding, options) if part)


def form_overrides(runs: Sequence[RunRecord]) -> dict[str, list[str]]:
    """Per run (by name), its form's options as overrides: the `encoding.*` keys (lr_mult aside: it is
    tuned) that differ between runs of its encoding, where the run's value is not its yaml's default."""
    keys = [k for k in swept_keys(runs) if k.startswith("encoding.") and k != MULT]
    shown = label_keys(runs, keys)
    forms = {}
    for run in runs:
        default = encoding_defaults(run.encoding)
        options = [k for k in shown.get(run.encoding, []) if k in run.config]
        forms[run.name] = [f"{k}={run.config[k]}" for k in options if run.config[k] != default.get(k)]
    return forms


def run_score(run: RunRecord, criterion: str) -> float:
    """The run's final val_loss (NaN without one), or the geometric mean of its logged validation curve."""
    if criterion == FINAL:
        return run.metrics.get(SCORE, math.nan)
    if not run.val_curve:
        raise ReportError(f"{run.name}: no validation curve (metrics.jsonl `val/loss`) for {CRITERIA[CURVE]}")
    logs = [math.log(max(loss, LOSS_FLOOR)) for _, loss in run.val_curve]
    return math.exp(sum(logs) / len(logs))


def points(runs: Sequence[RunRecord], criterion: str = FINAL) -> pd.DataFrame:
    """One line per point (form, lr, lr_mult (1 when the run has none)): its score (`run_score`), its mean
    over the tasks (`data.task.name`) the form was tuned on, for a task suite's runs (`over_tasks`)."""
    finished = [r for r in runs if r.finished and LR in r.config]
    forms = form_overrides(finished)
    lines = [
        {
            "form": form_name(r.encoding, ", ".join(forms[r.name])),
            "encoding": r.encoding,
            "options": ", ".join(forms[r.name]),
            "task": r.config.get(TASK),
            "lr": float(r.config[LR]),
            "lr_mult": float(r.config.get(MULT, 1.0)),
            "score": run_score(r, criterion),
        }
        for r in finished
    ]
    if not lines:
        raise ReportError(f"no finished runs with `{LR}` in their config")
    return over_tasks(pd.DataFrame(lines))


def over_tasks(frame: pd.DataFrame) -> pd.DataFrame:
    """Each (form, lr, lr_mult) once, its score the mean over the form's tasks (NaN, so never picked,
    where a task's run is missing); the frame as it is when no run is a task's."""
    if frame["task"].isna().all():
        return frame.drop(columns="task")
    tasks = frame.groupby("form")["task"].transform("nunique")
    frame = frame.assign(tasks=tasks)
    grouped = frame.groupby(["form", "encoding", "options", "lr", "lr_mult"], sort=False)
    merged = grouped.agg(score=("score", "mean"), found=("task", "nunique"), tasks=("tasks", "first"))
    merged.loc[merged["found"] < merged["tasks"], "score"] = math.nan
    return merged.reset_index().drop(columns=["found", "tasks"])


def picks(frame: pd.DataFrame, criterion: str = FINAL) -> list[Pick]:
    """Each form's best lr at lr_mult 1, then its best lr_mult at that lr (lowest score)."""
    chosen = []
    for form, runs in frame.groupby("form", sort=False):
        base = runs[runs["lr_mult"] == 1.0].dropna(subset=["score"])
        if base.empty:
            raise ReportError(f"{form}: no finished run at encoding.lr_mult=1 with a score")
        lr = float(base.loc[base["score"].idxmin(), "lr"])
        at_lr = runs[runs["lr"] == lr].dropna(subset=["score"])
        best = at_lr.loc[at_lr["score"].idxmin()]
        grid = sorted(base["lr"].unique())
        edge = lr in (grid[0], grid[-1])  # one rate alone is both edges: no search, never interior
        name, options = str(runs["encoding"].iloc[0]), str(runs["options"].iloc[0])
        lr_mult, score = float(best["lr_mult"]), float(best["score"])
        chosen.append(Pick(name, options, lr, lr_mult, score, criterion, edge))
    return chosen


def tuning_lines(frame: pd.DataFrame, chosen: Sequence[Pick]) -> list[str]:
    """The Markdown table: each form's score (3 significant digits: copy's losses reach 1e-7) at every (lr,
    lr_mult) searched, its picks."""
    columns = sorted({(lr, mult) for lr, mult in zip(frame["lr"], frame["lr_mult"], strict=True)})
    header = ["form", *(f"lr {lr:g}" + (f" × {mult:g}" if mult != 1 else "") for lr, mult in columns)]
    header += ["picked lr", "picked lr_mult", "score"]
    body = []
    for pick in chosen:
        runs = frame[frame["form"] == pick.form]
        cells = []
        for lr, mult in columns:
            hit = runs[(runs["lr"] == lr) & (runs["lr_mult"] == mult)]["score"]
            cells.append(f"{hit.min():.3g}" if len(hit) else "—")
        lr = f"{pick.lr:g}" + (" (edge)" if pick.edge else "")
        body.append([pick.form, *cells, lr, f"{pick.lr_mult:g}", f"{pick.score:.3g}"])
    return markdown_table(header, body)


def grid_lines(chosen: Sequence[Pick], seeds: str = "0,1,2") -> list[str]:
    """Hydra `grids` entries that run each form at its picks."""
    lines = []
    for pick in chosen:
        lines += [f"- seed: {seeds}", f"  encoding: {pick.encoding}"]
        lines += [f"  {option.replace('=', ': ', 1)}" for option in pick.options.split(", ") if option]
        lines.append(f"  {LR}: {pick.lr:g}")
        if pick.lr_mult != 1:
            lines.append(f"  {MULT}: {pick.lr_mult:g}")
    return lines


def extension(frame: pd.DataFrame, pick: Pick) -> list[float]:
    """For a pick at an edge of its grid, the rate one log-spaced step past it (the grid's mean ratio
    between neighbours), so that the extended grid has a rate beyond the pick on both sides (issue 58);
    nothing for an interior pick."""
    grid = sorted(frame.loc[(frame["form"] == pick.form) & (frame["lr_mult"] == 1.0), "lr"].unique())
    if not pick.edge or len(grid) < 2:
        return []
    ratio = (grid[-1] / grid[0]) ** (1 / (len(grid) - 1))
    return [float(f"{pick.lr / ratio:.3g}")] if pick.lr == grid[0] else [float(f"{pick.lr * ratio:.3g}")]


def extension_lines(frame: pd.DataFrame, chosen: Sequence[Pick]) -> list[str]:
    """The picks still at an edge, flagged, each with the rate that extends its grid past it."""
    flagged = [(pick, extension(frame, pick)) for pick in chosen if pick.edge]
    if not flagged:
        return ["Every pick is interior to its grid."]
    lines = [
        f"{len(flagged)} of {len(chosen)} picks sit at an edge of the grid searched: the best rate may lie "
        "beyond it. Extend the grid (log-spaced) with:",
        "",
    ]
    lines += [f"- {p.form}: picked {p.lr:g}; {remedy(rates)}" for p, rates in flagged]
    return lines


def remedy(rates: Sequence[float]) -> str:
    """What extends an edge pick's grid: the rates to add, or none where only one rate was searched."""
    return f"add {', '.join(f'{r:g}' for r in rates)}" if rates else "one rate searched, so no grid to extend"


def tuning_figure(frame: pd.DataFrame, chosen: Sequence[Pick], criterion: str = FINAL) -> Figure:
    """The score (`criterion`) against lr (log scale), a line per form at lr_mult 1; runs at another lr_mult
    as open squares; each form's pick circled."""
    colours = encoding_colours(frame["form"])
    fig = new_figure(10.0, 4.5, layout="constrained")
    ax = fig.add_subplot()
    for pick in chosen:
        runs = frame[frame["form"] == pick.form].sort_values("lr")
        base = runs[runs["lr_mult"] == 1.0]
        colour = colours[pick.form]
        ax.plot(base["lr"], base["score"], color=colour, marker="o", markersize=4, label=pick.form)
        other = runs[runs["lr_mult"] != 1.0]
        ax.plot(other["lr"], other["score"], color=colour, marker="s", fillstyle="none", linestyle="none")
        ax.plot(
            [pick.lr],
            [pick.score],
            color=colour,
            marker="o",
            markersize=11,
            fillstyle="none",
            linestyle="none",
        )
    legend_only = {"color": "grey", "fillstyle": "none", "linestyle": "none"}
    ax.plot([], [], marker="s", label="encoding.lr_mult ≠ 1", **legend_only)
    ax.plot([], [], marker="o", markersize=11, label="pick", **legend_only)
    ax.set_xscale("log")
    rates = sorted(frame["lr"].unique())
    ax.set_xticks(rates, [f"{lr:g}" for lr in rates])
    ax.minorticks_off()
    ax.set_xlabel("train.lr")
    ax.set_ylabel(f"{CRITERIA[criterion]} (nats/token)")
    ax.set_title(f"Equal tuning: {CRITERIA[criterion]} against learning rate")
    legend_right(ax)
    return fig


def plot_tuning(frame: pd.DataFrame, chosen: Sequence[Pick], path: Path, criterion: str = FINAL) -> Path:
    """`tuning_figure` as a PNG at `path`."""
    return save_figure(tuning_figure(frame, chosen, criterion), path)


def family_runs(runs: Sequence[RunRecord], family: str | None) -> list[RunRecord]:
    """The runs of the tasks of one task family (`Task.family`), or every run without a family."""
    if family is None:
        return list(runs)
    tasks = {name for name, task in TASKS.items() if task.family == family}
    if not tasks:
        families = sorted({task.family for task in TASKS.values()})
        raise ReportError(f"--family {family!r}: no task has it; families: {', '.join(families)}")
    return [r for r in runs if r.config.get(TASK) in tasks]


def write_tuning(paths: Sequence[Path], out: Path, family: str | None = None) -> tuple[Path, list[Pick]]:
    criterion = FAMILY_CRITERIA.get(family or "", FINAL)
    frame = points(family_runs(collect_runs(paths), family), criterion)
    chosen = picks(frame, criterion)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{"form": p.form, **vars(p)} for p in chosen]).to_csv(out / "picks.csv", index=False)
    figure = plot_tuning(frame, chosen, out / "tuning.png", criterion)
    lines = [
        "# Tuning: each encoding's learning rate and encoding lr_mult",
        "",
        (__doc__ or "").split("\n\n")[2].strip(),
        "",
        f"Score: the {CRITERIA[criterion]}" + (f" (`--family {family}`)." if family else "."),
        "",
        *tuning_lines(frame, chosen),
        "",
        *extension_lines(frame, chosen),
        "",
        f"![{CRITERIA[criterion]} against learning rate]({figure.name})",
        "",
        "The picks as the grids of a study (seeds 0, 1, 2):",
        "",
        "```yaml",
        *grid_lines(chosen),
        "```",
        "",
    ]
    path = out / "tuning.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path, chosen


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="posab tuning", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run/sweep directories, or report folders")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument(
        "--family",
        help="a task suite's runs: pick on one task family's tasks alone (issue 58: sequence, ...)",
    )
    args = parser.parse_args(argv)
    try:
        path, chosen = write_tuning(args.paths, args.out, args.family)
    except ReportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("\n".join(grid_lines(chosen)))
    print(path)
    return 0
