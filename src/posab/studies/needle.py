"""Retrieval summary of runs with a passkey stage: the needle by length beside the same runs' perplexity,
and the stage's key-loss and probe curves; one row per encoding and swept values, mean ± std over seeds.

    posab needle-report outputs/multirun/SWEEP [DIR ...] --out results/needle_pilot

Each DIR is a run directory, a sweep, or a report folder written by `posab report` (its runs.csv holds
the stage's scalars and curves), so needle.md renders again from committed results and from the sweeps of
several sessions together. Rows are the report's (`posab.report.grouping`); RoPE's scaling views and rows
without a passkey stage (named on stderr) are left out.

Writes needle.md (per row: needle accuracy, retrieval gain and attention mass at each length, the stage's
key loss, probe accuracy and timing, and perplexity at each length measured before the stage; then the
per-digit accuracy), needle_by_length.png (accuracy, gain and perplexity against length, mean over seeds
and each seed's value; a line of three panels per panel of rows, `posab.report.styles.facets`) and
stage_curves.png (per row, its key loss and probe accuracy against stage step, one line per seed).
The general report gives the heatmaps, runs.csv and configs of the same runs.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from posab.io import write_text
from posab.keys import key_lengths, metric_key, needle_digits
from posab.plots import new_figure, save_figure
from posab.report.cli import collect_runs
from posab.report.document import named_rows
from posab.report.grouping import Row, group_rows
from posab.report.markdown import markdown_table, mean_std
from posab.report.records import STAGE_KEY_LOSS, STAGE_LAST_START, STAGE_PROBES, ReportError
from posab.report.stats import aggregate
from posab.report.styles import (
    facet_title,
    facets,
    label_log_axis,
    legend_entries,
    legend_right,
    length_axis,
    line_styles,
    seed_style,
    shared_values,
    wrap,
)

STAGE_STEPS = "passkey_stage/steps"


def stage_rows(rows: Mapping[str, Row]) -> dict[str, Row]:
    """Each row's runs that had the passkey stage, RoPE's scaling views left out; a row without such runs
    is left out, and one with some (a grid's later seeds ran the language model alone) keeps those: both
    are named on stderr."""
    kept = {}
    for name, row in rows.items():
        staged = [run for run in row.runs if STAGE_STEPS in run.metrics]
        if row.scaling:
            continue
        if not staged:
            print(f"left out {name!r}: no run of it has a passkey stage", file=sys.stderr)
            continue
        if len(staged) < len(row.runs):
            print(f"{name!r}: {len(staged)} of its {len(row.runs)} runs had the stage", file=sys.stderr)
        kept[name] = replace(row, runs=staged)
    return kept


def _metric_keys(rows: Mapping[str, Row]) -> set[str]:
    """Every metric key of every run of these rows, once (read with `posab.keys`)."""
    return {k for row in rows.values() for run in row.runs for k in run.metrics}


def needle_lengths(rows: Mapping[str, Row]) -> list[int]:
    """Every length of the needle grid in these rows (`needle/acc@L`), sorted."""
    return key_lengths(_metric_keys(rows), "acc")


def digit_count(rows: Mapping[str, Row]) -> int:
    """Digits of the passkey: one more than the highest `needle/digit_acc[@L]/dK` any run has."""
    return max(needle_digits(_metric_keys(rows)), default=-1) + 1


def probe_range(row: Row) -> str:
    """min–max of the probe accuracy over the probes each run took at its stage's last length, all runs."""
    values = [
        acc
        for run in row.runs
        for step, acc in run.stage_curves.get(STAGE_PROBES, [])
        if step > run.metrics.get(STAGE_LAST_START, 0.0)
    ]
    return f"{min(values):.2f}–{max(values):.2f}" if values else "–"


def table_rows(rows: Mapping[str, Row], lengths: Sequence[int]) -> list[list[str]]:
    """One line per row: (column key, format) cells as mean ± std over its seeds, the probe range inserted."""
    shown = (("acc", ".2f"), ("gain", ".1f"), ("attn_mass", ".2f"))  # each at every length
    columns = [(metric_key(metric, n), fmt) for metric, fmt in shown for n in lengths]
    stage = [("passkey_stage/needle_loss", ".3f"), ("passkey_stage/time_s", ".0f"), ("wall_time_s", ".0f")]
    ppl = [(metric_key("ppl", n), ".2f") for n in lengths]
    stats = aggregate(rows, [k for k, _ in (*columns, *stage, *ppl)])

    def cells(name: str, keys: Sequence[tuple[str, str]]) -> list[str]:
        n, line = len(rows[name].runs), stats.loc[name]
        return [mean_std(line[k, "mean"], line[k, "std"], int(line[k, "count"]), fmt, n) for k, fmt in keys]

    return [
        [
            name,
            str(len(row.runs)),
            *cells(name, columns),
            cells(name, stage[:1])[0],
            probe_range(row),
            *cells(name, stage[1:]),
            *cells(name, ppl),
        ]
        for name, row in rows.items()
    ]


def digit_rows(rows: Mapping[str, Row], lengths: Sequence[int]) -> list[list[str]]:
    """Accuracy of each key digit (teacher-forced argmax) at each length, mean over seeds."""
    digits = range(digit_count(rows))
    by_length = [[metric_key("digit_acc", n, digit=d) for d in digits] for n in lengths]
    means = aggregate(rows, [key for keys in by_length for key in keys], ("mean",))
    return [
        [name, *(" ".join(f"{means.loc[name][(key, 'mean')]:.2f}" for key in keys) for keys in by_length)]
        for name in rows
    ]


def curricula(rows: Mapping[str, Row]) -> str:
    """The stages as run: total steps and the step the last length starts at, each distinct one once."""
    seen = {
        f"{run.metrics[STAGE_STEPS]:.0f} steps, the last length from step "
        f"{run.metrics.get(STAGE_LAST_START, 0):.0f}"
        for row in rows.values()
        for run in row.runs
    }
    return "; ".join(sorted(seen))


def needle_markdown(rows: Mapping[str, Row]) -> str:
    lengths = needle_lengths(rows)
    header = ["row", "seeds n", *(f"acc@{n}" for n in lengths), *(f"gain@{n}" for n in lengths)]
    header += [*(f"attn@{n}" for n in lengths), "stage key loss", "probe acc at last length"]
    header += ["stage s", "wall s"]
    header += [f"ppl@{n}" for n in lengths]
    legend = (
        f"Stage: {curricula(rows)} (the lengths and steps of each run: configs/, `passkey.lengths`, "
        "`passkey.steps`). Every cell is mean ± sample std (ddof=1) over the row's seeds, `(n=k)` when only "
        "k runs have it. acc@L: greedy passkey accuracy at input length L, mean over depths and trials "
        "(`needle/acc@L`); gain@L: log p(key | the needle holds it) − log p(key | the needle holds another "
        "key), nats (`needle/gain@L`, 0 = the needle is not read); attn@L: attention mass of the key "
        "positions on the needle's key, for the head that puts the most there (`needle/attn_mass@L`); "
        "stage key loss: nats per key digit over the stage's last logged steps (ln 10 = 2.30 is chance); "
        "probe acc: min–max of the greedy accuracy on the fixed probe examples at the stage's last length, "
        "over the probes every run of the row took while its stage trained at that length (stability from "
        "checkpoint to checkpoint); stage s / wall s: stage and whole-run seconds; ppl@L: perplexity of the "
        "language model before the stage (`ppl/L`)."
    )
    lines = [
        "# Needle in a haystack after the passkey stage",
        "",
        legend,
        "",
        *markdown_table(header, table_rows(rows, lengths)),
        "",
    ]
    if digit_count(rows):
        lines += [
            f"## Accuracy of each key digit (d0 … d{digit_count(rows) - 1}) at each length, mean over seeds",
            "",
            *markdown_table(["row", *(f"{n}" for n in lengths)], digit_rows(rows, lengths)),
            "",
        ]
    return "\n".join(lines)


BY_LENGTH_PANELS = (  # (metric, at each length `metric_key(metric, L)`; y label; panel title)
    ("acc", "passkey accuracy", "Passkey accuracy (mean over depths)"),
    ("gain", "retrieval gain (nats)", "Retrieval gain"),
    ("ppl", "perplexity (log scale)", "Perplexity before the stage"),
)
BY_LENGTH_SIZE = (17.0, 3.8)  # inches: the figure's width, the height of each line of panels
STAGE_PANEL = (3.9, 3.2)  # inches per panel of the stage curves
STAGE_PAIRS = 2  # rows side by side in the stage curves (two panels each)
SEED_MARK = {"linestyle": "none", "marker": "o", "markersize": 3.5, "fillstyle": "none", "alpha": 0.8}


def _length_panel(ax: Axes, rows: Mapping[str, Row], metric: str, lengths: Sequence[int]) -> None:
    """Mean over seeds of `metric` at each length L against L, one line per row, a circle per seed, its
    legend entries as the panel's (`legend_entries`)."""
    keys = [metric_key(metric, n) for n in lengths]
    means = aggregate(rows, keys, ("mean",))
    styles, entries = line_styles(rows), legend_entries(rows)
    for name, row in rows.items():
        ax.plot(lengths, [means.loc[name][(k, "mean")] for k in keys], marker="o", label=entries[name],
                **styles[name])  # fmt: skip
        for run in row.runs if len(row.runs) > 1 else []:
            values = [run.metrics.get(k, np.nan) for k in keys]
            ax.plot(lengths, values, color=styles[name]["color"], **SEED_MARK)
    length_axis(ax, lengths)
    ax.set_xlabel("input length (tokens)")


def by_length_figure(rows: Mapping[str, Row]) -> Figure:
    """Passkey accuracy, retrieval gain and perplexity against input length, a line of three panels per
    facet of the rows (`facets`), each panel titled, the y axes shared down each column."""
    lengths = needle_lengths(rows)
    panels = facets(rows)
    fig = new_figure(BY_LENGTH_SIZE[0], BY_LENGTH_SIZE[1] * len(panels), layout="constrained")
    axes = fig.subplots(len(panels), len(BY_LENGTH_PANELS), squeeze=False, sharey="col")
    for line, panel in zip(axes, panels, strict=True):
        for ax, (metric, ylabel, title) in zip(line, BY_LENGTH_PANELS, strict=True):
            _length_panel(ax, panel, metric, lengths)
            ax.set_ylabel(ylabel)
            ax.set_title(title if len(panels) == 1 else f"{title}\n{facet_title(panel, '', len(panels))}")
        line[2].set_yscale("log")
        legend_right(line[-1])
    label_log_axis(axes[0, 2].yaxis)
    shared = shared_values(rows) if len(panels) == 1 else []
    note = f"; every row: {', '.join(shared)}" if shared else ""
    fig.suptitle(f"Retrieval after the passkey stage by input length (line: mean over seeds; circles: each "
                 f"seed){note}")  # fmt: skip
    return fig


def plot_by_length(rows: Mapping[str, Row], path: Path) -> Path:
    """`by_length_figure` as a PNG at `path`."""
    return save_figure(by_length_figure(rows), path)


def stage_curves_figure(rows: Mapping[str, Row]) -> Figure:
    """Per row, two panels: the stage's key loss and its probe accuracy against the stage step, a line
    per seed (coloured by seed, the same in every panel), STAGE_PAIRS rows side by side."""
    pairs = min(len(rows), STAGE_PAIRS)
    lines = math.ceil(len(rows) / pairs)
    fig = new_figure(2 * pairs * STAGE_PANEL[0] + 1.2, lines * STAGE_PANEL[1], layout="constrained")
    grid = fig.add_gridspec(lines, 2 * pairs)
    axes = []
    for i, (name, row) in enumerate(rows.items()):
        line, column = divmod(i, pairs)
        loss_ax, probe_ax = (fig.add_subplot(grid[line, 2 * column + j]) for j in (0, 1))
        _stage_pair(loss_ax, probe_ax, name, row)
        axes.append((loss_ax, probe_ax))
    for loss_ax, probe_ax in axes[1:]:
        loss_ax.sharey(axes[0][0])
        probe_ax.sharey(axes[0][1])
    label_log_axis(axes[0][0].yaxis)
    handles = [Line2D([], [], label=f"seed {s}", **seed_style(s)) for s in _seeds(rows)]
    handles.append(Line2D([], [], color="k", linestyle="--", label="chance (ln 10)"))
    fig.legend(handles=handles, loc="outside right upper", fontsize="small")
    fig.suptitle("The passkey stage per row: key loss and probe accuracy, a line per seed")
    return fig


def _seeds(rows: Mapping[str, Row]) -> list[int]:
    """Every seed of the rows' runs, sorted (a run without one counts as 0)."""
    return sorted({run.seed or 0 for row in rows.values() for run in row.runs})


def _stage_pair(loss_ax: Axes, probe_ax: Axes, name: str, row: Row) -> None:
    """One row's key loss (log scale, chance dashed) and probe accuracy, a line per seed, both titled."""
    for run in row.runs:
        style = seed_style(run.seed or 0)
        if points := run.stage_curves.get(STAGE_KEY_LOSS):
            loss_ax.plot(*zip(*points, strict=True), linewidth=1, **style)
        if points := run.stage_curves.get(STAGE_PROBES):
            probe_ax.plot(*zip(*points, strict=True), marker=".", linewidth=1, **style)
    loss_ax.axhline(np.log(10), color="k", linestyle="--", linewidth=1)
    loss_ax.set_yscale("log")
    loss_ax.set_xlabel("step (< 0: language-model training)")
    loss_ax.set_ylabel("key loss (nats per digit)")
    probe_ax.set_xlabel("stage step")
    probe_ax.set_ylabel("probe accuracy")
    probe_ax.set_ylim(-0.03, 1.03)
    for ax, what in ((loss_ax, "key loss"), (probe_ax, "probe accuracy at the last length")):
        ax.set_title(f"{wrap(name, 44)}\n{what}", fontsize="medium")


def plot_stage_curves(rows: Mapping[str, Row], path: Path) -> Path:
    """`stage_curves_figure` as a PNG at `path`."""
    return save_figure(stage_curves_figure(rows), path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="posab needle-report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("paths", nargs="+", type=Path, help="run directories, sweeps or report folders")
    parser.add_argument("--out", type=Path, required=True, help="folder for needle.md and the plots")
    args = parser.parse_args(argv)
    try:
        rows = stage_rows(named_rows(group_rows(collect_runs(args.paths))))
    except ReportError as err:
        parser.exit(2, f"error: {err}\n")
    if not rows:
        parser.exit(2, "error: no finished run with a passkey stage\n")
    args.out.mkdir(parents=True, exist_ok=True)
    write_text(args.out / "needle.md", needle_markdown(rows))
    plot_by_length(rows, args.out / "needle_by_length.png")
    plot_stage_curves(rows, args.out / "stage_curves.png")
    print(f"wrote {args.out / 'needle.md'}, needle_by_length.png, stage_curves.png")
    return 0
