"""A forest plot per claims family: each claim's difference Δ (row − reference, nats per token) with its 95%
interval, the side it claims shaded, its verdict and adjusted p beside it.

One small panel per claim, each on its own linear x scale that always holds 0, rather than one shared
axis: within one family the intervals span very different sizes (−1.2 beside −0.005 nats), so on a shared
linear axis the small ones shrink to a dot at 0, and on a symmetric-log axis an interval's width and its
distance from 0, what a verdict hangs on, can no longer be read off (and the linear threshold would have to
be chosen per family). On a linear scale of its own, where each interval lies against 0 is exact; the
numbers are written beside it, since the panels' scales differ.

`write_forest_plots(verdicts, folder)` takes the frame of `claims/verdicts.csv` (`posab.studies.verdicts`;
an optional `procedure` column, `holm` or `fixed-sequence`, holm where absent) and writes
`folder/forest_<family>.png` for each family.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from posab.plots import new_figure
from posab.report.stats import ALPHA, INDISTINGUISHABLE, OPPOSITE, ORDERED, SUGGESTIVE
from posab.report.styles import display_name, save, wrap
from posab.studies.claims import FIXED_SEQUENCE, HOLM

PROCEDURE_NAMES = {HOLM: "Holm", FIXED_SEQUENCE: "fixed-sequence"}
VERDICT_COLOURS = {ORDERED: "#1b7837", SUGGESTIVE: "#d6604d", OPPOSITE: "#762a83", INDISTINGUISHABLE: "0.4"}
CLAIMED_SHADE = {"color": "#a6dba0", "alpha": 0.35, "linewidth": 0}
UNSHARED = ("encoding", "experiment")  # selectors a label never lists as a side's own values
WIDTHS = (3.0, 3.6, 2.8)  # inches: the claim's label, its panel, its verdict
CLAIM_HEIGHT = 0.8  # inches per claim
HEADER_HEIGHT = 1.1  # inches for the title
LABEL_WRAP = 44  # characters per line of a claim's label
PAD = 0.12  # of an interval's span (with 0), either side of it


def write_forest_plots(verdicts: pd.DataFrame, folder: Path) -> list[Path]:
    """`forest_<family>.png` in `folder` for each family of `verdicts` (in the order they first appear);
    returns the paths written."""
    written = []
    for family, lines in verdicts.groupby("family", sort=False):
        path = save(forest_figure(str(family), lines), folder / f"forest_{family}.png")
        written += [path] if path is not None else []
    return written


def forest_figure(family: str, lines: pd.DataFrame) -> Figure:
    """One family's forest plot: a line per claim (label, panel, verdict), its title naming the family's
    status and procedure."""
    records = lines.to_dict("records")
    fig = new_figure(sum(WIDTHS), HEADER_HEIGHT + CLAIM_HEIGHT * len(records))
    height = fig.get_figheight()
    grid = fig.add_gridspec(len(records), 3, width_ratios=WIDTHS, hspace=0.9, wspace=0.05,
                            top=1 - 0.85 / height, bottom=0.45 / height)  # fmt: skip
    for i, line in enumerate(records):
        _text_cell(fig.add_subplot(grid[i, 0]), claim_label(line), 0.97, "right")
        _claim_panel(fig.add_subplot(grid[i, 1]), line, last=i == len(records) - 1)
        _text_cell(fig.add_subplot(grid[i, 2]), verdict_label(line), 0.04, "left")
    statuses = ", ".join(dict.fromkeys(str(s) for s in lines["status"]))
    procedure = PROCEDURE_NAMES[procedure_of(records[0])]
    fig.suptitle(
        f"Claims family {family}: {statuses}; {procedure} within the family, α {ALPHA:g}\n"
        "Δ = row − reference (nats/token), dot and bar: Δ and its 95% interval; shaded: the claimed "
        "side\neach claim on its own x scale",
        fontsize="medium",
    )
    return fig


def _text_cell(ax: Axes, text: str, x: float, align: str) -> None:
    """An axes holding one text, vertically centred, and nothing else."""
    ax.axis("off")
    ax.text(x, 0.5, text, ha=align, multialignment=align, va="center", fontsize="small",
            transform=ax.transAxes)  # fmt: skip


def _claim_panel(ax: Axes, line: Mapping[str, Any], last: bool) -> None:
    """One claim's Δ and interval on its own scale, 0 marked, the claimed side shaded."""
    difference, low, high = (float(line[k]) for k in ("difference", "low", "high"))
    limits = claim_limits(difference, low, high)
    ax.set_xlim(*limits)
    ax.set_ylim(-1.0, 1.0)
    ax.axvspan(*claimed_span(str(line["direction"]), limits), **CLAIMED_SHADE)
    ax.axvline(0.0, color="black", linewidth=1.0)
    colour = VERDICT_COLOURS.get(str(line["verdict"]), "black")
    ax.errorbar([difference], [0.0], xerr=[[difference - low], [high - difference]], fmt="o", color=colour,
                capsize=4, markersize=6, linewidth=2)  # fmt: skip
    ax.set_yticks([])
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
    ax.tick_params(axis="x", labelsize="small")
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    if last:
        ax.set_xlabel("Δ, nats/token (row − reference)")


def claim_limits(difference: float, low: float, high: float) -> tuple[float, float]:
    """The x range of a claim's panel: its interval and Δ, and 0, padded by PAD of their span either side
    (an interval of no width at 0 still gets a range)."""
    lo, hi = min(low, difference, 0.0), max(high, difference, 0.0)
    pad = PAD * (hi - lo) or 1e-3
    return lo - pad, hi + pad


def claimed_span(direction: str, limits: tuple[float, float]) -> tuple[float, float]:
    """The part of the x range on the claimed side of 0: below it for `less` (the row's loss lower than
    the reference's), above it for `greater`."""
    if direction == "less":
        return limits[0], 0.0
    if direction == "greater":
        return 0.0, limits[1]
    raise ValueError(f"a claim's direction is `less` or `greater`, not {direction!r}")


def procedure_of(line: Mapping[str, Any]) -> str:
    """The family's multiplicity procedure as the line names it (`procedure`), HOLM where it names none."""
    value = line.get("procedure")
    return HOLM if value is None or (isinstance(value, float) and math.isnan(value)) or not value else value


def verdict_label(line: Mapping[str, Any]) -> str:
    """The text beside a claim: its verdict and adjusted p against α, then Δ and its interval:
    "suggestive · Holm p 0.219 (α 0.05)\\nΔ −1.187 [−1.340, −1.042]"."""
    procedure = PROCEDURE_NAMES[procedure_of(line)]
    numbers = (float(line[k]) for k in ("difference", "low", "high"))
    delta, low, high = (f"{x:+.3f}".replace("-", "−") for x in numbers)
    p = float(line["p_holm"])
    return f"{line['verdict']} · {procedure} p {p:.3f} (α {ALPHA:g})\nΔ {delta} [{low}, {high}]"


def claim_label(line: Mapping[str, Any]) -> str:
    """The text before a claim: its id, the row against the reference (`comparison_label`) and the metric
    at its length (and corpus, where it names one), wrapped."""
    corpus = line.get("corpus")
    on = f" on {corpus}" if isinstance(corpus, str) and corpus else ""
    head = f"{line['claim']}: {comparison_label(str(line['row']), str(line['reference']))}"
    return wrap(head, LABEL_WRAP) + f"\n{line['metric']}/{int(line['length'])}{on}"


def comparison_label(row: str, reference: str) -> str:
    """The label "FoX vs RoPE" from a claim's two selectors (`key=value; key=value`): each side's
    encoding as the readings name it and the selector values it does not share with the other side (the
    experiment left out)."""
    mine, theirs = selectors(row), selectors(reference)
    return f"{_side(mine, theirs)} vs {_side(theirs, mine)}"


def selectors(text: str) -> dict[str, str]:
    """`encoding=fox; experiment=study_frontier` as a dict."""
    pairs = (part.split("=", 1) for part in text.split(";") if "=" in part)
    return {key.strip(): value.strip() for key, value in pairs}


def _side(mine: Mapping[str, str], other: Mapping[str, str]) -> str:
    """One side of a comparison: its encoding's name, then its own selector values in parentheses."""
    own = [f"{k.rsplit('.', 1)[-1]}={v}" for k, v in mine.items() if k not in UNSHARED and other.get(k) != v]
    name = display_name(mine.get("encoding", "any encoding"))
    return f"{name} ({', '.join(own)})" if own else name
