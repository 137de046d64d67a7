"""How the report's figures are laid out and each row is drawn, the same in every figure of a report.

Panels: a figure of more rows than a panel can show readably (MAX_SERIES) is split into panels of whole
encodings (`facets`): the encodings of one row together, then those of several rows, in the rows' order
(an encoding of more rows than that fills panels of its own). Each panel has its own title (the encodings
it holds, and the swept values all its rows share, which its legend entries then leave out) and its own
legend to its right; all panels share one y axis so that they compare.

Colours: an encoding's colour is its own, whatever other encodings exist: declared for the encodings of
conf/encoding/ (ENCODING_COLOURS), else a stable hash of its name into the palette (`stable_colour`), so
adding an encoding moves no other encoding's colour. Within a panel every row has its own colour: the first
variant of each encoding (study first, then the label without the encoding; usually "no swept value")
takes the encoding's colour; the encoding's other rows, and an encoding whose colour an earlier encoding of
the panel has (two hashes can meet), take the palette's colours no row of the panel has. The line style
follows the variant, as a second cue. A panel of more encodings than colours (the task suite's) tells
encodings of one colour apart by line style instead (`shared_colour_styles`).

Ticks: a log axis is labelled at enough round values to read it (`log_ticks`), lengths at the lengths
evaluated (`length_axis`).
"""

from __future__ import annotations

import hashlib
import math
import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, NullFormatter, NullLocator

from posab.plots import new_figure, save_figure
from posab.report.grouping import Row
from posab.report.records import natural_key

# tab10, Dark2, then the lighter half of tab20: 28 colours, each legible on white
PALETTE = [*colormaps["tab10"].colors, *colormaps["Dark2"].colors, *colormaps["tab20"].colors[1::2]]
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
MAX_SERIES = 8  # rows one panel draws at most: each keeps a colour of its own and a short legend
PANEL_COLUMNS = 2  # panels side by side; more panels go on further lines
PANEL_SIZE = (8.5, 4.2)  # inches per panel, its legend included
LEGEND_WRAP = 36  # characters per line of a legend entry; a longer row name goes on several lines
TITLE_WRAP = 70  # characters per line of a panel's title
MIN_LOG_TICKS = 4  # labelled ticks a log axis gets at least, where its range allows
SWEPT_VALUE = re.compile(r", (?=[\w.]+=)")  # between two swept values of a label, not inside one
LOG_MANTISSAS = ((1.0,), (1.0, 2.0, 5.0), tuple(float(m) for m in range(1, 10)))
ENCODING_NAMES = {  # how the readings write an encoding; any other encoding keeps its config name
    "alibi": "ALiBi",
    "cope": "CoPE",
    "dape_alibi": "DAPE-ALiBi",
    "dape_multiscale": "DAPE-multi-scale",
    "fire": "FIRE",
    "fox": "FoX",
    "kerple": "KERPLE",
    "multiscale": "multi-scale",
    "nope": "NoPE",
    "randomized_alibi": "randomized ALiBi",
    "randomized_learned": "randomized learned",
    "randomized_rope": "randomized RoPE",
    "randomized_sinusoidal": "randomized sinusoidal",
    "rnope_swa": "RNoPE-SWA",
    "rope": "RoPE",
    "stickbreaking": "stick-breaking",
    "swan": "SWAN",
    "t5": "T5",
    "xpos": "xPos",
}
ENCODING_COLOURS = {  # palette index per encoding of conf/encoding/; a new encoding may add itself here
    "alibi": 0,
    "cope": 1,
    "dape_alibi": 2,
    "dape_multiscale": 3,
    "fire": 4,
    "fox": 5,
    "hierarchical": 6,
    "kerple": 7,
    "learned": 8,
    "multiscale": 9,
    "nope": 10,
    "randomized_alibi": 11,
    "randomized_learned": 12,
    "randomized_rope": 13,
    "randomized_sinusoidal": 14,
    "rnope_swa": 15,
    "rope": 16,
    "sinusoidal": 17,
    "stickbreaking": 18,
    "swan": 19,
    "t5": 20,
    "xpos": 21,
}
SCALING_NAMES = {"pi": "PI", "ntk": "NTK", "yarn": "YaRN"}  # RoPE's evaluation-time scalings
SHORT_KEYS = {"train.lr": "lr", "encoding.lr_mult": "lr_mult"}  # a swept key as a short label names it


def stable_colour(encoding: str) -> tuple[float, ...]:
    """The encoding's own colour: declared (ENCODING_COLOURS), else its name's SHA-256 into the palette."""
    index = ENCODING_COLOURS.get(encoding)
    if index is None:
        index = int(hashlib.sha256(encoding.encode()).hexdigest(), 16) % len(PALETTE)
    return tuple(PALETTE[index])


def encoding_colours(encodings: Iterable[str]) -> dict[str, Any]:
    """A colour for each encoding, its own (`stable_colour`); of encodings that share one, a declared one
    keeps it, else the first by name, and each other takes the next palette colour none of them has, while
    one is left."""
    wanted = sorted(set(encodings), key=lambda name: (name not in ENCODING_COLOURS, natural_key(name)))
    own = {name: stable_colour(name) for name in wanted}
    spare = iter(c for c in map(tuple, PALETTE) if c not in own.values())
    colours: dict[str, Any] = {}
    for name in wanted:
        clash = own[name] in colours.values()
        colours[name] = next(spare, own[name]) if clash else own[name]
    return colours


def _variant_ranks(rows: Mapping[str, Row]) -> dict[str, int]:
    """Per row name, the place of its (study, variant) among its encoding's, sorted."""
    variants: dict[str, set[tuple[str, str]]] = {}
    for row in rows.values():
        variants.setdefault(row.encoding, set()).add((row.study, row.variant))
    order = {e: sorted(v, key=lambda sv: tuple(map(natural_key, sv))) for e, v in variants.items()}
    return {name: order[row.encoding].index((row.study, row.variant)) for name, row in rows.items()}


def line_styles(rows: Mapping[str, Row]) -> dict[str, dict[str, Any]]:
    """Per row name, the keyword arguments of its lines in a panel of these rows: a `color` no other row
    of them has (the encoding's own for its first variant) and a `linestyle` by variant rank."""
    ranks = _variant_ranks(rows)
    own = encoding_colours(row.encoding for row in rows.values())
    colours: dict[str, Any] = {}
    for name in sorted(rows, key=natural_key):  # an encoding's first variant: the encoding's colour
        if ranks[name] == 0 and own[rows[name].encoding] not in colours.values():
            colours[name] = own[rows[name].encoding]
    spare = iter(c for c in PALETTE if c not in colours.values())
    for name in sorted(rows, key=lambda n: (ranks[n], natural_key(n))):
        colours.setdefault(name, next(spare, "black"))
    return {
        name: {"color": colours[name], "linestyle": LINE_STYLES[ranks[name] % len(LINE_STYLES)]}
        for name in rows
    }


def shared_colour_styles(colours: Mapping[str, Any]) -> dict[str, Any]:
    """A line style per name, for a panel of more names than the palette has colours: solid, and the next
    style for each earlier name (sorted) of the same colour, so that no two share both."""
    drawn: dict[tuple[float, ...], int] = {}
    styles = {}
    for name in sorted(colours, key=natural_key):
        colour = tuple(colours[name])
        styles[name] = LINE_STYLES[drawn.get(colour, 0) % len(LINE_STYLES)]
        drawn[colour] = drawn.get(colour, 0) + 1
    return styles


def facets(rows: Mapping[str, Row], size: int = MAX_SERIES) -> list[dict[str, Row]]:
    """The rows in panels of at most `size` (all in one when they fit): the encodings of one row together
    (in panels of even sizes), then the others, whole encodings packed in order while they fit; an
    encoding of more rows than `size` fills panels of its own."""
    if len(rows) <= size:
        return [dict(rows)]
    by_encoding: dict[str, dict[str, Row]] = {}
    for name, row in rows.items():
        by_encoding.setdefault(row.encoding, {})[name] = row
    groups = list(by_encoding.values())
    singles = [group for group in groups if len(group) == 1]
    even = math.ceil(len(singles) / max(1, math.ceil(len(singles) / size)))  # 9 singles: 5 + 4, not 8 + 1
    return _pack(singles, even) + _pack([group for group in groups if len(group) > 1], size)


def _pack(groups: Sequence[dict[str, Row]], size: int) -> list[dict[str, Row]]:
    """Consecutive groups in panels of at most `size` rows; a group larger than that split in `size`."""
    panels: list[dict[str, Row]] = [{}]
    for group in groups:
        names = list(group)
        for chunk in (names[i : i + size] for i in range(0, len(names), size)):
            if panels[-1] and len(panels[-1]) + len(chunk) > size:
                panels.append({})
            panels[-1].update({name: group[name] for name in chunk})
    return [panel for panel in panels if panel]


def _swept_parts(row: Row) -> list[str]:
    """The swept values in the row's label ("data.anchors=false", ...), without its RoPE scaling."""
    swept = row.variant[: -len(row.scaling)].rstrip(" +") if row.scaling else row.variant
    return SWEPT_VALUE.split(swept) if swept else []


def shared_values(panel: Mapping[str, Row]) -> list[str]:
    """The swept values every row of a panel of several rows has (a panel's title states them once)."""
    parts = [_swept_parts(row) for row in panel.values()]
    return [p for p in parts[0] if all(p in other for other in parts[1:])] if len(parts) > 1 else []


def legend_entries(panel: Mapping[str, Row]) -> dict[str, str]:
    """Per row name, its legend entry in the panel: the name without the swept values every row of the
    panel shares (`shared_values`)."""
    shared = set(shared_values(panel))
    entries = {}
    for name, row in panel.items():
        kept = [part for part in _swept_parts(row) if part not in shared]
        label = ", ".join([row.encoding, *kept]) + (f" + {row.scaling}" if row.scaling else "")
        entries[name] = name.removesuffix(row.label) + label  # the study's prefix, where names have one
    return entries


def display_name(encoding: str) -> str:
    """The encoding as the readings write it (ENCODING_NAMES), else its config name."""
    return ENCODING_NAMES.get(encoding, encoding)


def short_value(key: str, value: str) -> str:
    """One swept value, short: `train.lr=0.003` -> "lr 3e-3", `encoding.lr_mult=10` -> "lr_mult 10", any
    other key without its group (`data.anchors=false` -> "anchors=false")."""
    if key not in SHORT_KEYS:
        return f"{key.rsplit('.', 1)[-1]}={value}"
    try:
        number = float(value)
    except ValueError:
        return f"{SHORT_KEYS[key]} {value}"
    mantissa, exponent = f"{number:.2e}".split("e")
    rate = f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}" if number < 0.01 else f"{number:g}"
    return f"{SHORT_KEYS[key]} {rate}"


def short_label(name: str, row: Row) -> str:
    """A row's name for a reader: its encoding's display name and, in parentheses, its swept values short
    (`short_value`: the SHORT_KEYS first, `encoding.lr_mult` at 1 left out), then its RoPE scaling: "FoX
    (lr 3e-3)", "RoPE + YaRN (lr 6e-3)"; a study's prefix on `name` is kept."""
    parts = sorted(
        (part.split("=", 1) for part in _swept_parts(row) if "=" in part),
        key=lambda kv: list(SHORT_KEYS).index(kv[0]) if kv[0] in SHORT_KEYS else len(SHORT_KEYS),
    )
    values = [short_value(k, v) for k, v in parts if not (k == "encoding.lr_mult" and float(v) == 1.0)]
    scaling = f" + {SCALING_NAMES.get(row.scaling, row.scaling)}" if row.scaling else ""
    swept = f" ({', '.join(values)})" if values else ""
    return name.removesuffix(row.label) + display_name(row.encoding) + scaling + swept


def facet_title(panel: Mapping[str, Row], title: str, panels: int) -> str:
    """A panel's title: `title` itself when it is the figure's only panel, else the encodings it holds;
    then the swept values all its rows share."""
    head = title if panels == 1 else ", ".join(dict.fromkeys(row.encoding for row in panel.values()))
    shared = shared_values(panel)
    note = "\n" + wrap("every row: " + ", ".join(shared), TITLE_WRAP) if shared else ""
    return wrap(head, TITLE_WRAP) + note


def panel_grid(
    panels: int, size: tuple[float, float] = PANEL_SIZE, kinds: Sequence[str] | None = None
) -> tuple[Figure, list[Axes]]:
    """A figure of `panels` axes, PANEL_COLUMNS to a line, each `size` inches with room for its legend;
    constrained layout. The axes share their y axis: all of them, or, given each panel's kind (`kinds`),
    those of one kind (perplexity panels with each other, difference panels with each other)."""
    ncols = min(panels, PANEL_COLUMNS)
    nrows = math.ceil(panels / ncols)
    fig = new_figure(size[0] * ncols, size[1] * nrows, layout="constrained")
    grid = fig.add_gridspec(nrows, ncols)
    axes = [fig.add_subplot(grid[i // ncols, i % ncols]) for i in range(panels)]
    kinds = kinds or [""] * panels
    first: dict[str, Axes] = {}
    for ax, kind in zip(axes, kinds, strict=True):
        if first.setdefault(kind, ax) is not ax:
            ax.sharey(first[kind])
    return fig, axes


def wrap(text: str, width: int = LEGEND_WRAP) -> str:
    """`text` on lines of at most `width` characters where its words allow."""
    return textwrap.fill(text, width, break_long_words=False, break_on_hyphens=False)


def legend_right(ax: Axes, **kwargs: Any) -> None:
    """The axes' legend outside it, to its right, its entries wrapped to LEGEND_WRAP characters."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, [wrap(label) for label in labels], loc="upper left", bbox_to_anchor=(1.02, 1.0),
                  fontsize="small", handlelength=2.5, **kwargs)  # fmt: skip


def log_ticks(low: float, high: float) -> list[float]:
    """Round values in [low, high] for a log axis: the decades, else 1-2-5, else every digit, the first
    that gives MIN_LOG_TICKS; else evenly spaced round values (a narrow range)."""
    decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
    for mantissas in LOG_MANTISSAS:
        ticks = [m * 10.0**e for e in decades for m in mantissas if low <= m * 10.0**e <= high]
        if len(ticks) >= MIN_LOG_TICKS:
            return ticks
    linear = MaxNLocator(nbins=8, steps=[1, 2, 2.5, 5, 10]).tick_values(low, high)
    return [float(t) for t in linear if low <= t <= high]


def label_log_axis(axis: Axis) -> None:
    """Label a log axis at `log_ticks` over its view interval (the ticks shared with its siblings)."""
    low, high = sorted(axis.get_view_interval())
    ticks = log_ticks(low, high)
    axis.set_ticks(ticks, [f"{t:g}" for t in ticks])
    axis.set_minor_formatter(NullFormatter())


def length_axis(ax: Axes, lengths: Sequence[int]) -> None:
    """A log2 x axis with a labelled tick at each length, no minor ticks."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(lengths), [str(n) for n in lengths])
    ax.xaxis.set_minor_locator(NullLocator())


def save(fig: Figure | None, path: Path) -> Path | None:
    """Write the figure as a PNG at `path`; None (and no file) for no figure."""
    return None if fig is None else save_figure(fig, path)


def seed_style(seed: int) -> dict[str, Any]:
    """How a seed's line is drawn where a panel draws one line per seed of a row: a colour and a line
    style by seed, so that a seed's line on top of another's (both at 0) leaves the other visible."""
    return {"color": PALETTE[seed % len(PALETTE)], "linestyle": LINE_STYLES[seed % 4]}
