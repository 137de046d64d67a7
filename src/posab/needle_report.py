"""Retrieval summary of runs with a passkey stage: the needle by length beside the same runs' perplexity,
and the stage's key-loss and probe curves; one row per encoding and swept values, mean ± std over seeds.

    python scripts/needle_report.py outputs/multirun/SWEEP [DIR ...] --out results/needle_pilot

Each DIR is a run directory, a sweep, or a report folder written by `scripts/report.py` (its runs.csv holds
the stage's scalars and curves), so needle.md renders again from committed results and from the sweeps of
several sessions together. Rows are the report's (`posab.report.grouping`); RoPE's scaling views and rows
without a passkey stage (named on stderr) are left out.

Writes needle.md (per row: needle accuracy, retrieval gain and attention mass at each length, the stage's
key loss, probe accuracy and timing, and perplexity at each length measured before the stage; then the
per-digit accuracy), needle_by_length.png (accuracy, gain and perplexity against length, mean over seeds
with their range) and stage_curves.png (key loss and probe accuracy against stage step, one line per run).
The general report gives the heatmaps, runs.csv and configs of the same runs.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import ScalarFormatter

from posab.io import write_text
from posab.plots import new_figure, save_figure
from posab.report.cli import collect_runs
from posab.report.document import named_rows
from posab.report.grouping import Row, group_rows
from posab.report.markdown import markdown_table, mean_std
from posab.report.records import STAGE_KEY_LOSS, STAGE_LAST_START, STAGE_PROBES, ReportError
from posab.report.stats import aggregate
from posab.report.styles import line_styles

NEEDLE_LENGTH = re.compile(r"needle/acc@(\d+)")
DIGIT = re.compile(r"needle/digit_acc@\d+/d(\d+)")
STAGE_STEPS = "passkey_stage/steps"


def stage_rows(rows: Mapping[str, Row]) -> dict[str, Row]:
    """The rows whose runs all had the passkey stage, RoPE's scaling views left out; the others are named
    on stderr."""
    kept = {}
    for name, row in rows.items():
        if row.scaling:
            continue
        if all(STAGE_STEPS in run.metrics for run in row.runs):
            kept[name] = row
        else:
            print(f"left out {name!r}: not every run of it has a passkey stage", file=sys.stderr)
    return kept


def _numbers_in_keys(rows: Mapping[str, Row], pattern: re.Pattern[str]) -> list[int]:
    """The number in each metric key that matches `pattern` (its group 1), over every run, sorted, once."""
    keys = {k for row in rows.values() for run in row.runs for k in run.metrics}
    return sorted({int(m[1]) for k in keys if (m := pattern.fullmatch(k))})


def needle_lengths(rows: Mapping[str, Row]) -> list[int]:
    """Every length of the needle grid in these rows, sorted."""
    return _numbers_in_keys(rows, NEEDLE_LENGTH)


def digit_count(rows: Mapping[str, Row]) -> int:
    """Digits of the passkey: one more than the highest `needle/digit_acc@L/dK` any run has."""
    return max(_numbers_in_keys(rows, DIGIT), default=-1) + 1


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
    columns = [(f"needle/acc@{n}", ".2f") for n in lengths] + [(f"needle/gain@{n}", ".1f") for n in lengths]
    columns += [(f"needle/attn_mass@{n}", ".2f") for n in lengths]
    stage = [("passkey_stage/needle_loss", ".3f"), ("passkey_stage/time_s", ".0f"), ("wall_time_s", ".0f")]
    ppl = [(f"ppl/{n}", ".2f") for n in lengths]
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
    keys = [f"needle/digit_acc@{n}/d{d}" for n in lengths for d in digits]
    means = aggregate(rows, keys, ("mean",))
    return [
        [
            name,
            *(
                " ".join(f"{means.loc[name][(f'needle/digit_acc@{n}/d{d}', 'mean')]:.2f}" for d in digits)
                for n in lengths
            ),
        ]
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


def _length_panel(ax: Axes, rows: Mapping[str, Row], key: str, lengths: Sequence[int]) -> None:
    """Mean over seeds of `key.format(L)` against L, one line per row, its seeds' range as a band."""
    styles = line_styles(rows)
    stats = aggregate(rows, [key.format(n) for n in lengths], ("mean", "min", "max"))
    for name in rows:
        line = stats.loc[name]
        mean, low, high = ([line[(key.format(n), s)] for n in lengths] for s in ("mean", "min", "max"))
        ax.plot(lengths, mean, marker="o", label=name, **styles[name])
        ax.fill_between(lengths, low, high, color=styles[name]["color"], alpha=0.15, linewidth=0)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(lengths), [str(n) for n in lengths])
    ax.set_xlabel("input length (tokens)")


def plot_by_length(rows: Mapping[str, Row], path: Path) -> Path:
    lengths = needle_lengths(rows)
    fig = new_figure(15.0, 4.2)
    axes = fig.subplots(1, 3, gridspec_kw={"wspace": 0.3})
    panels = (
        ("needle/acc@{}", "passkey accuracy"),
        ("needle/gain@{}", "retrieval gain (nats)"),
        ("ppl/{}", "perplexity (before the stage)"),
    )
    for ax, (key, label) in zip(axes, panels, strict=True):
        _length_panel(ax, rows, key, lengths)
        ax.set_ylabel(label)
    axes[2].set_yscale("log")
    for axis in (axes[2].yaxis.set_major_formatter, axes[2].yaxis.set_minor_formatter):
        axis(ScalarFormatter())
    axes[2].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize="small")
    return save_figure(fig, path)


def plot_stage_curves(rows: Mapping[str, Row], path: Path) -> Path:
    fig = new_figure(13.0, 4.2)
    loss_ax, probe_ax = fig.subplots(1, 2)
    styles = line_styles(rows)
    for name, row in rows.items():
        for i, run in enumerate(row.runs):
            label = name if i == 0 else None  # one legend entry per row, every seed drawn
            if points := run.stage_curves.get(STAGE_KEY_LOSS):
                loss_ax.plot(*zip(*points, strict=True), label=label, **styles[name])
            if points := run.stage_curves.get(STAGE_PROBES):
                probe_ax.plot(*zip(*points, strict=True), marker=".", label=label, **styles[name])
    loss_ax.axhline(np.log(10), color="k", linestyle="--", label="chance (ln 10)")
    loss_ax.set_yscale("log")
    loss_ax.set_xlabel("stage step")
    loss_ax.set_ylabel("key loss (nats per digit)")
    probe_ax.set_xlabel("stage step")
    probe_ax.set_ylabel("probe accuracy at the last curriculum length")
    probe_ax.set_ylim(-0.03, 1.03)
    handles, labels = loss_ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    return save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
