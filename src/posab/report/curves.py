"""Training curves: the validation loss logged during training (`val/loss` in each run's metrics.jsonl)
against the step, one line per row, mean over seeds with a min..max band.

Rows that are an evaluation-time RoPE scaling of other runs (`rope + pi`) trained as those runs did and
are left out. Runs read back from a runs.csv written before the curves were kept have none.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from posab.report.grouping import Row
from posab.report.records import VAL_CURVE_KEY
from posab.report.stats import curve_band
from posab.report.styles import line_styles, report_figure, save_with_legend


def trained_rows(rows: Mapping[str, Row]) -> dict[str, Row]:
    """The rows with a validation-loss curve in some run, RoPE scaling views left out."""
    return {name: row for name, row in rows.items() if not row.scaling and any(r.val_curve for r in row.runs)}


def plot_training_curves(rows: Mapping[str, Row], path: Path) -> Path | None:
    """Validation loss against training step per row: mean over seeds, band = min..max over seeds."""
    curves = trained_rows(rows)
    if not curves:
        return None
    styles = line_styles(rows)
    fig, (ax,) = report_figure()
    for name, row in curves.items():
        band = curve_band([r.val_curve for r in row.runs if r.val_curve])
        ax.plot(band.index, band["mean"], label=name, **styles[name])
        ax.fill_between(band.index, band["min"], band["max"], alpha=0.2, color=styles[name]["color"])
    ax.set_xlabel("training step")
    ax.set_ylabel(f"validation loss (nats/token, {VAL_CURVE_KEY})")
    ax.set_title("Validation loss during training (mean over seeds, band: min..max)")
    return save_with_legend(fig, path, ax)
