"""Training curves: the validation loss logged during training (`val/loss` in each run's metrics.jsonl)
against the step, one line per row, mean over seeds with a min..max band; panels as `styles.facets`.

Rows that are an evaluation-time RoPE scaling of other runs (`rope + pi`) trained as those runs did and
are left out. Runs read back from a runs.csv written before the curves were kept have none.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from posab.report.grouping import Row
from posab.report.records import VAL_CURVE_KEY
from posab.report.stats import curve_band
from posab.report.styles import (
    facet_title,
    facets,
    legend_entries,
    legend_right,
    line_styles,
    panel_grid,
    save,
)

TITLE = "Validation loss during training (mean over seeds, band: min..max)"


def trained_rows(rows: Mapping[str, Row]) -> dict[str, Row]:
    """The rows with a validation-loss curve in some run, RoPE scaling views left out."""
    return {name: row for name, row in rows.items() if not row.scaling and any(r.val_curve for r in row.runs)}


def training_curves_figure(rows: Mapping[str, Row]) -> Figure | None:
    """Validation loss against training step per row: mean over seeds, band = min..max over seeds."""
    curves = trained_rows(rows)
    if not curves:
        return None
    panels = facets(curves)
    fig, axes = panel_grid(len(panels))
    for ax, panel in zip(axes, panels, strict=True):
        _curves_panel(ax, panel)
        ax.set_title(facet_title(panel, TITLE, len(panels)))
    if len(panels) > 1:
        fig.suptitle(TITLE)
    return fig


def _curves_panel(ax: Axes, rows: Mapping[str, Row]) -> None:
    """One panel: each row's mean curve and band, the axes' labels, the legend."""
    styles, entries = line_styles(rows), legend_entries(rows)
    for name, row in rows.items():
        band = curve_band([r.val_curve for r in row.runs if r.val_curve])
        ax.plot(band.index, band["mean"], label=entries[name], **styles[name])
        ax.fill_between(band.index, band["min"], band["max"], alpha=0.2, color=styles[name]["color"])
    ax.set_xlabel("training step")
    ax.set_ylabel(f"validation loss (nats/token, {VAL_CURVE_KEY})")
    legend_right(ax)


def plot_training_curves(rows: Mapping[str, Row], path: Path) -> Path | None:
    """`training_curves_figure` as a PNG at `path`."""
    return save(training_curves_figure(rows), path)
