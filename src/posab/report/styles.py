"""How each row is drawn: one colour per encoding, one line style per variant (the swept values other than
the encoding, and the RoPE scaling), the same in every figure of a report; the legend outside the axes.

Colours follow the encodings with a config file (`conf/encoding/*.yaml`, sorted), then any other encoding,
so that an encoding keeps its colour from one report to the next. The variants of an encoding are sorted
(study first, then the label without the encoding); the first, usually "no swept value", is solid.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from posab.errors import ConfigError
from posab.paths import encoding_names
from posab.plots import new_figure, save_figure
from posab.report.grouping import Row
from posab.report.records import natural_key

PALETTE = [*colormaps["tab10"].colors, *colormaps["Dark2"].colors]
LINE_STYLES: list[Any] = [
    "-",
    "--",
    ":",
    "-.",
    (0, (8, 2)),
    (0, (4, 1, 1, 1, 1, 1)),
    (0, (1, 3)),
    (0, (6, 2, 1, 2, 1, 2)),
]


def encoding_colours(encodings: Iterable[str]) -> dict[str, Any]:
    """A colour for each encoding: its place among the configured encodings, the others after them."""
    try:
        known = encoding_names()
    except ConfigError:  # a report rendered from runs.csv away from the checkout
        known = []
    wanted = set(encodings)
    order = [*known, *sorted(wanted - set(known), key=natural_key)]
    return {name: PALETTE[order.index(name) % len(PALETTE)] for name in wanted}


def line_styles(rows: Mapping[str, Row]) -> dict[str, dict[str, Any]]:
    """Per row name, the keyword arguments of its lines: `color` by encoding, `linestyle` by variant: the
    variants of each encoding in order (study, then label) take LINE_STYLES in turn, so that the four most
    distinct styles serve the encodings with up to four rows, and equal variant lists get equal styles."""
    colours = encoding_colours(row.encoding for row in rows.values())
    variants: dict[str, list[tuple[str, str]]] = {}
    for row in rows.values():
        variants.setdefault(row.encoding, []).append((row.study, row.variant))
    rank = {
        (encoding, variant): i
        for encoding, found in variants.items()
        for i, variant in enumerate(sorted(set(found), key=lambda v: tuple(map(natural_key, v))))
    }
    return {
        name: {
            "color": colours[row.encoding],
            "linestyle": LINE_STYLES[rank[row.encoding, (row.study, row.variant)] % len(LINE_STYLES)],
        }
        for name, row in rows.items()
    }


def report_figure(ncols: int = 1, width: float = 10.0) -> tuple[Figure, list[Axes]]:
    """A figure of `ncols` axes side by side, laid out to leave room for a legend on the right."""
    fig = new_figure(width, 4.5, layout="constrained")
    return fig, list(fig.subplots(1, ncols, squeeze=False)[0])


def save_with_legend(fig: Figure, path: Path, legend_ax: Axes) -> Path:
    """Legend to the right of `legend_ax`, outside the axes, then write the PNG."""
    legend_ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0), handlelength=4)
    return save_figure(fig, path)
