"""Figures of the evaluations: perplexity against length, loss by position, shift, one needle heatmap per
row. Each takes the rows by the name its legend shows and returns the PNG's path, or None when no run has
the results it draws."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.ticker import FormatStrFormatter, NullFormatter

from posab.plots import needle_heatmap, save_figure
from posab.report.grouping import Row
from posab.report.records import SEQ_LEN_KEY, SERIES_PREFIX, RunRecord
from posab.report.stats import BAND_STATISTICS, aggregate
from posab.report.styles import line_styles, report_figure, save_with_legend
from posab.results import bin_centres

MARKED = {"marker": "o", "markersize": 4}  # lines through a few evaluated points
NEEDLE_CELL = re.compile(r"needle/acc@(\d+)/depth(.+)")


def _runs(rows: Mapping[str, Row]) -> list[RunRecord]:
    return [r for row in rows.values() for r in row.runs]


def _keys_matching(runs: Iterable[RunRecord], pattern: str) -> list[int]:
    """The integer captured by `pattern` in any metric key of these runs, sorted."""
    regex = re.compile(pattern)
    return sorted({int(m.group(1)) for r in runs for k in r.metrics if (m := regex.fullmatch(k))})


def _means(rows: Mapping[str, Row], keys: list[str]) -> pd.DataFrame:
    """Mean over the seeds of each row (index: row name) for each key (columns); NaN where no run has it."""
    return aggregate(rows, keys, ("mean",)).droplevel(1, axis=1)


def _train_lengths(ax: Axes, rows: Mapping[str, Row]) -> None:
    """A vertical dashed line at each training length (`train.seq_len`) of the rows."""
    lengths = {int(r.config[SEQ_LEN_KEY]) for r in _runs(rows) if SEQ_LEN_KEY in r.config}
    for n in sorted(lengths):
        ax.axvline(n, color="grey", linestyle="--", linewidth=1, label=f"training length {n}")


def plot_ppl_vs_length(rows: Mapping[str, Row], path: Path) -> Path | None:
    """Perplexity against evaluation length: mean over seeds, band = min..max over seeds."""
    lengths = _keys_matching(_runs(rows), r"ppl/(\d+)")
    if not lengths:
        return None
    keys = [f"ppl/{n}" for n in lengths]
    band = aggregate(rows, keys, BAND_STATISTICS)
    styles = line_styles(rows)
    fig, (ax,) = report_figure()
    for name in rows:
        row_band = band.loc[name].unstack().reindex(keys).dropna(subset=["mean"])
        x = [int(key.removeprefix("ppl/")) for key in row_band.index]
        ax.plot(x, row_band["mean"], label=name, **MARKED, **styles[name])
        ax.fill_between(x, row_band["min"], row_band["max"], alpha=0.2, color=styles[name]["color"])
    _train_lengths(ax, rows)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
    ax.set_xlabel("evaluation length L (tokens, log2 scale)")
    ax.set_ylabel("perplexity (log scale)")
    ax.set_title("Perplexity vs evaluation length (mean over seeds, band: min..max)")
    return save_with_legend(fig, path, ax)


def plot_position_loss(rows: Mapping[str, Row], path: Path) -> Path | None:
    """Per-position loss at each row's longest evaluated length, mean over seeds."""
    if not any(r.series for r in _runs(rows)):
        return None
    styles = line_styles(rows)
    fig, (ax,) = report_figure()
    for name, row in rows.items():
        lengths = sorted({int(k.removeprefix(SERIES_PREFIX)) for r in row.runs for k in r.series})
        if not lengths:
            continue
        key = f"{SERIES_PREFIX}{lengths[-1]}"
        mean = np.mean(np.asarray([r.series[key] for r in row.runs if key in r.series]), axis=0)
        ax.plot(bin_centres(lengths[-1], len(mean)), mean, label=f"{name} (L={lengths[-1]})", **styles[name])
    _train_lengths(ax, rows)
    ax.set_xlabel("position in the window (tokens, bin centres)")
    ax.set_ylabel("mean loss (nats/token)")
    ax.set_title("Loss by position at the longest evaluated length (mean over seeds)")
    return save_with_legend(fig, path, ax)


def plot_needle(name: str, row: Row, path: Path) -> Path | None:
    """Passkey accuracy heatmap (depth × length), mean over seeds, from the per-cell scalars."""
    cells = {(int(m[1]), m[2]) for r in row.runs for k in r.metrics if (m := NEEDLE_CELL.fullmatch(k))}
    if not cells:
        return None
    lengths = sorted({n for n, _ in cells})
    depths = sorted({d for _, d in cells}, key=float)
    keys = [f"needle/acc@{n}/depth{d}" for n in lengths for d in depths]
    acc = _means({name: row}, keys).loc[name].to_numpy().reshape(len(lengths), len(depths))
    grid = {"lengths": lengths, "depths": [float(d) for d in depths], "acc": acc}
    title = f"Passkey accuracy: {name} (mean over {len(row.runs)} seeds)"
    return save_figure(needle_heatmap(grid, title), path)


SHIFT_PANELS = (  # (shift kind, metric, y label, title)
    ("offset", "kl", "KL(p_ref ‖ p_shift) (symlog)", "Position offset k: KL"),
    ("prefix", "dloss", "Δloss, nats/token", "Prefix of k tokens: Δloss"),
)


def plot_shift(rows: Mapping[str, Row], path: Path) -> Path | None:
    """Offset KL against offset k and prefix Δloss against prefix length k, one line per row."""
    ks = [_keys_matching(_runs(rows), rf"shift/{kind}(\d+)/{metric}") for kind, metric, *_ in SHIFT_PANELS]
    if not any(ks):
        return None
    styles = line_styles(rows)
    fig, axes = report_figure(ncols=2, width=14)
    for ax, panel, k_values in zip(axes, SHIFT_PANELS, ks, strict=True):
        _shift_panel(ax, rows, styles, panel, k_values)
    axes[0].set_yscale("symlog", linthresh=1e-8)
    return save_with_legend(fig, path, axes[1])


def _shift_panel(
    ax: Axes,
    rows: Mapping[str, Row],
    styles: dict[str, dict[str, Any]],
    panel: tuple[str, str, str, str],
    k_values: list[int],
) -> None:
    """One panel of the shift figure: the mean of `shift/<kind>k/<metric>` against k, a line per row."""
    kind, metric, ylabel, title = panel
    if k_values:
        means = _means(rows, [f"shift/{kind}{k}/{metric}" for k in k_values])
        for name in rows:
            ax.plot(range(len(k_values)), means.loc[name], label=name, **MARKED, **styles[name])
    ax.set_xticks(range(len(k_values)), [str(k) for k in k_values])
    ax.set_xlabel(f"{kind} k (tokens)")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title} (mean over seeds)")
    ax.axhline(0.0, color="grey", linewidth=0.8)
