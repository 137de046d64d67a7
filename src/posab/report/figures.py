"""Figures of the evaluations: perplexity against length, loss by position, shift, one needle heatmap per
row. Each `*_figure` takes the rows by the name its legend shows and returns the Figure, or None when no
run has the results it draws; each `plot_*` writes it as a PNG and returns its path (or None).

Figures of many rows are split into panels of whole encodings (`styles.facets`), each with its legend; the
shift figure is a table of values, so that rows at 0 or equal to each other stay visible; a needle heatmap
draws each seed beside the mean when the seeds disagree."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure

from posab.keys import key_lengths, metric_key, needle_cells, shift_sizes
from posab.plots import needle_panel, new_figure
from posab.report.flat import FLAT_RATIO, flat_count
from posab.report.grouping import Row
from posab.report.records import SEQ_LEN_KEY, RunRecord
from posab.report.stats import PAIRED_REFERENCES, aggregate, reference_rows
from posab.report.styles import (
    MAX_SERIES,
    PANEL_COLUMNS,
    TITLE_WRAP,
    encoding_colours,
    facet_title,
    facets,
    label_log_axis,
    legend_entries,
    legend_right,
    length_axis,
    line_styles,
    panel_grid,
    save,
    short_label,
    wrap,
)
from posab.results import bin_centres

MARKED = {"marker": "o", "markersize": 4}  # lines through a few evaluated points


def _runs(rows: Mapping[str, Row]) -> list[RunRecord]:
    return [r for row in rows.values() for r in row.runs]


def _metric_keys(runs: Iterable[RunRecord]) -> set[str]:
    """Every metric key of these runs, once (read with `posab.keys`)."""
    return {k for r in runs for k in r.metrics}


def _means(rows: Mapping[str, Row], keys: list[str]) -> pd.DataFrame:
    """Mean over the seeds of each row (index: row name) for each key (columns); NaN where no run has it."""
    return aggregate(rows, keys, ("mean",)).droplevel(1, axis=1)


SEED_MARK = {"linestyle": "none", "marker": "o", "markersize": 3.5, "fillstyle": "none", "alpha": 0.8}
PPL_TITLE = (
    "Perplexity vs evaluation length (line: mean over seeds; circles: each seed; grey, marked ref: the "
    f"references, in every panel). Flat: the tail within {FLAT_RATIO:.2f}× the perplexity at the training "
    "length in every seed; flat rows are drawn as their ln perplexity minus a baseline's (nats/token)"
)
SUPTITLE_WRAP = 90  # characters per line of the figure's title, per column of panels
BROKEN_TITLE = "perplexity of the rows not flat in every seed"
FLAT_TITLE = "rows flat in every seed: Δ ln perplexity"
REFERENCES_TITLE = "perplexity of the references"
YARN = "yarn"  # RoPE's scaling view drawn as a reference
MAX_LINES = 12  # lines one panel of the perplexity figure draws at most, its references included
REFERENCE_LINE = {"markersize": 4, "linewidth": 2.0}
REFERENCE_STYLES = tuple(  # a reference's line, in the order they are given (then RoPE + YaRN)
    {"color": colour, "linestyle": style, "marker": marker, **REFERENCE_LINE}
    for colour, style, marker in (
        ("black", "-", "s"),
        ("0.45", "--", "^"),
        ("0.65", "-.", "D"),
        ("0.3", ":", "v"),
        ("0.55", (0, (8, 2)), "P"),
    )
)
DIFFERENCE_PAD = 0.1  # of the span of a difference panel's values, either side of them
MIN_DIFFERENCE_SPAN = 0.02  # nats/token a difference panel's y range spans at least
ROW_HEIGHT = (0.12, 0.15)  # inches per row of a dot chart or table: a margin, and per line of its name
ROW_LABEL_WRAP = 75  # characters per line of a row's name on a y axis
CHAR_WIDTH = 0.055  # inches per character of a y tick label ("small" font), to size the figure around it


def _train_lengths(ax: Axes, rows: Mapping[str, Row]) -> str:
    """A vertical dashed line at each training length (`train.seq_len`) of the rows; what it is, for the
    x label ("" for none)."""
    lengths = sorted({int(r.config[SEQ_LEN_KEY]) for r in _runs(rows) if SEQ_LEN_KEY in r.config})
    for n in lengths:
        ax.axvline(n, color="grey", linestyle="--", linewidth=1)
    return f"; dashed: training length {', '.join(map(str, lengths))}" if lengths else ""


def _seed_values(row: Row, keys: Sequence[str]) -> list[list[float]]:
    """Each run's value of each key, NaN where it has none."""
    return [[run.metrics.get(k, math.nan) for k in keys] for run in row.runs]


def _row_labels(ax: Axes, rows: Mapping[str, Row]) -> None:
    """One y tick per row, named, top to bottom in the rows' order."""
    ax.set_yticks(range(len(rows)), [wrap(name, ROW_LABEL_WRAP) for name in rows], fontsize="small")
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_ylabel("row")


def _label_width(rows: Mapping[str, Row]) -> float:
    """Inches the rows' wrapped names take as y tick labels."""
    return CHAR_WIDTH * min(ROW_LABEL_WRAP, max(len(name) for name in rows))


def _rows_height(rows: Mapping[str, Row]) -> float:
    """Inches the rows take, one above the other, each as high as the longest wrapped name needs."""
    lines = max(wrap(name, ROW_LABEL_WRAP).count("\n") + 1 for name in rows)
    return len(rows) * (ROW_HEIGHT[0] + ROW_HEIGHT[1] * lines)


def ppl_vs_length_figure(
    rows: Mapping[str, Row], references: Sequence[str] = PAIRED_REFERENCES
) -> Figure | None:
    """Perplexity against evaluation length, every panel beside the references.

    Study by study (`length_panels`): the rows that break past the training length in some seed in
    perplexity panels (log scale), and the rows flat in every seed (`flat.flat_count`) in difference panels
    (linear, nats: their mean ln perplexity minus a baseline's at each length), where the 0.05 nats that
    separate them stay visible. The `references` rows the study has (`stats.reference_rows`) and RoPE's YaRN
    view (`ppl@yarn/L`) are drawn in grey in every panel of their study; a line per row through its mean
    over seeds, a circle per seed; legends name a row by its encoding and tuned rate (`short_label`). A dot
    chart when only one length was evaluated."""
    lengths = key_lengths(_metric_keys(_runs(rows)), "ppl")
    if not lengths:
        return None
    if len(lengths) == 1:
        return _ppl_at_one_length(rows, lengths[0])
    panels = length_panels(rows, references, lengths[-1])
    fig, axes = panel_grid(len(panels), kinds=[panel.kind for panel in panels])
    limits = _difference_limits([p for p in panels if p.baseline], lengths)
    for ax, panel in zip(axes, panels, strict=True):
        if panel.baseline:
            _difference_panel(ax, panel, lengths, limits)
        else:
            _ppl_panel(ax, panel, lengths)
    perplexity = [ax for ax, panel in zip(axes, panels, strict=True) if not panel.baseline]
    if perplexity:
        label_log_axis(perplexity[0].yaxis)
    fig.suptitle(wrap(PPL_TITLE, SUPTITLE_WRAP * min(len(panels), PANEL_COLUMNS)))
    return fig


@dataclass(frozen=True)
class LengthPanel:
    """One panel of `ppl_vs_length_figure`: its rows, the reference rows drawn beside them, and for a
    difference panel the name (among the references) of the row every line is a difference to."""

    title: str
    rows: dict[str, Row]
    references: dict[str, Row]
    baseline: str = ""  # "": a perplexity panel

    @property
    def kind(self) -> str:
        """What the panel's y axis shows (panels of one kind share it)."""
        return "difference" if self.baseline else "perplexity"


def length_panels(rows: Mapping[str, Row], references: Sequence[str], longest: int) -> list[LengthPanel]:
    """The panels of `ppl_vs_length_figure`, study by study: the rows not flat in every seed in panels of
    whole encodings (`facets`; a panel of the references alone where the study has no other row), then
    the flat rows against the baseline (`_baseline`), each panel with room for its references."""
    studies: dict[str, dict[str, Row]] = {}
    for name, row in rows.items():
        studies.setdefault(row.study, {})[name] = row
    panels = []
    for study, named in studies.items():
        prefix = f"{study}: " if len(studies) > 1 else ""
        refs = reference_lines(named, references)
        others = {name: row for name, row in named.items() if name not in refs}
        flat = {name: row for name, row in others.items() if _flat(row)}
        if len(flat) == 1 and not any(_flat(row) for row in refs.values()):
            flat = {}  # one flat row and no flat reference: nothing to draw it against
        broken = {name: row for name, row in others.items() if name not in flat}
        if broken or not flat:
            title = (BROKEN_TITLE if flat else "perplexity") if broken else REFERENCES_TITLE
            panels += [LengthPanel(prefix + title, p, refs) for p in facets(broken, _room(refs))]
        panels += _flat_panels(prefix, flat, refs, longest) if flat else []
    return panels


def _flat_panels(prefix: str, flat: dict[str, Row], refs: dict[str, Row], longest: int) -> list[LengthPanel]:
    """The difference panels of a study's flat rows (two or more, or one beside a flat reference): against
    the baseline (`_baseline`), which a flat row then leaves for the references, as their zero line."""
    candidates = {**{name: row for name, row in refs.items() if _flat(row)}, **flat}
    baseline = _baseline(candidates, refs, longest)
    refs = {**refs, baseline: candidates[baseline]}
    rows = {name: row for name, row in flat.items() if name != baseline}
    title = f"{prefix}{FLAT_TITLE}, against {short_label(baseline, refs[baseline])}"
    return [LengthPanel(title, panel, refs, baseline) for panel in facets(rows, _room(refs))]


def _baseline(candidates: Mapping[str, Row], refs: Mapping[str, Row], longest: int) -> str:
    """The name of the row the flat rows are drawn against: of the flat references, else of the flat rows
    (`candidates` holds both), the one of lowest mean perplexity at the `longest` length."""
    pool = [name for name in candidates if name in refs] or list(candidates)
    key = metric_key("ppl", longest)
    means = _means({name: candidates[name] for name in pool}, [key])[key]
    return str(means.fillna(math.inf).idxmin())


def reference_lines(named: Mapping[str, Row], references: Sequence[str]) -> dict[str, Row]:
    """One study's reference rows by name: each of `references` it has (`stats.reference_rows`), then
    RoPE's YaRN view (of a reference, else of the study's one RoPE row) where its runs have one."""
    found = reference_rows(list(named.values()), references)
    bases = [*found, *reference_rows(list(named.values()), ["rope"])]
    yarn = [row for base in bases for row in named.values() if row.label == f"{base.label} + {YARN}"]
    names = {id(row): name for name, row in named.items()}
    return {names[id(row)]: row for row in [*found, *yarn[:1]]}


def _flat(row: Row) -> bool:
    """Whether every run of the row that can be judged is flat past its training length (`flat_count`)."""
    count = flat_count(row)
    return count is not None and 0 < count.n == count.k


def _room(refs: Mapping[str, Row]) -> int:
    """Rows a panel holds beside these references: MAX_LINES lines in all, at most MAX_SERIES rows."""
    return max(1, min(MAX_SERIES, MAX_LINES - len(refs)))


def _line_styles(panel: LengthPanel) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Each line's keyword arguments and legend entry: a row's as `line_styles` (circles), a reference's
    grey (REFERENCE_STYLES) and marked "ref"."""
    styles = {name: {**MARKED, **style} for name, style in line_styles(panel.rows).items()}
    entries = {name: short_label(name, row) for name, row in panel.rows.items()}
    for i, (name, row) in enumerate(panel.references.items()):
        styles[name] = REFERENCE_STYLES[i % len(REFERENCE_STYLES)]
        entries[name] = f"ref: {short_label(name, row)}" + (": Δ = 0" if name == panel.baseline else "")
    return styles, entries


def _lines(panel: LengthPanel) -> dict[str, Row]:
    """The panel's rows then its references, the order their lines are drawn and listed."""
    return {**panel.rows, **panel.references}


def _ppl_panel(ax: Axes, panel: LengthPanel, lengths: Sequence[int]) -> None:
    """A perplexity panel: a line per row and reference, its seeds' values as circles, its legend."""
    keys = [metric_key("ppl", n) for n in lengths]
    lines = _lines(panel)
    means = _means(lines, keys)
    styles, entries = _line_styles(panel)
    for name, row in lines.items():
        seeds = _seed_values(row, keys) if len(row.runs) > 1 else []
        _draw(ax, lengths, means.loc[name].to_numpy(dtype=float), seeds, styles[name], entries[name])
    note = _train_lengths(ax, lines)
    ax.set_yscale("log")
    length_axis(ax, lengths)
    ax.set_xlabel(f"evaluation length L (tokens{note})")
    ax.set_ylabel("perplexity (log scale)")
    ax.set_title(wrap(panel.title, TITLE_WRAP))
    legend_right(ax)


def _draw(
    ax: Axes, lengths: Sequence[int], mean: np.ndarray, seeds: Iterable, style: dict[str, Any], label: str
) -> None:
    """A line through the mean where it has values, and a circle per seed in its colour."""
    has = ~np.isnan(mean)
    ax.plot(np.asarray(lengths)[has], mean[has], label=label, **style)
    for values in seeds:
        ax.plot(lengths, values, color=style["color"], **SEED_MARK)


def _seed_logs(row: Row, keys: Sequence[str]) -> pd.DataFrame:
    """ln perplexity (the mean loss, nats per token) of each run (index: its seed) at each key (columns)."""
    return pd.DataFrame(np.log(np.asarray(_seed_values(row, keys), float)), index=[r.seed for r in row.runs])


def differences(row: Row, baseline: Row, keys: Sequence[str]) -> tuple[np.ndarray, pd.DataFrame]:
    """The row's mean ln perplexity minus the baseline's at each key (nats per token), and each run's: its
    ln perplexity minus the baseline's run of its seed (seed-matched), or the baseline's mean where the
    baseline has no run of that seed."""
    mine, theirs = _seed_logs(row, keys), _seed_logs(baseline, keys)
    mean = mine.mean().to_numpy() - theirs.mean().to_numpy()
    paired = theirs.reindex(mine.index).fillna(theirs.mean())
    return mean, mine - paired


def _difference_limits(panels: Sequence[LengthPanel], lengths: Sequence[int]) -> tuple[float, float]:
    """The y range the difference panels share: 0 and every value (means and seeds) of their rows and of
    their flat references, padded (DIFFERENCE_PAD of the span, the span at least MIN_DIFFERENCE_SPAN); a
    reference that breaks leaves it (its legend entry says from where)."""
    keys = [metric_key("ppl", n) for n in lengths]
    values = [0.0]
    for panel in panels:
        scaled = {**panel.rows, **{n: r for n, r in panel.references.items() if _flat(r)}}
        for row in scaled.values():
            mean, seeds = differences(row, panel.references[panel.baseline], keys)
            values += [*mean[np.isfinite(mean)], *seeds.stack().dropna()]
    low, high = min(values), max(values)
    pad = max(DIFFERENCE_PAD * (high - low), (MIN_DIFFERENCE_SPAN - (high - low)) / 2)
    return low - pad, high + pad


def _difference_panel(
    ax: Axes, panel: LengthPanel, lengths: Sequence[int], limits: tuple[float, float]
) -> None:
    """A difference panel: each row's and reference's mean ln perplexity minus the baseline's (the zero
    line), each seed's against the baseline's run of that seed as circles, within `limits`."""
    keys = [metric_key("ppl", n) for n in lengths]
    styles, entries = _line_styles(panel)
    base = panel.references[panel.baseline]
    for name, row in _lines(panel).items():
        mean, seeds = differences(row, base, keys)
        drawn = seeds.to_numpy() if len(row.runs) > 1 and name in panel.rows else []
        _draw(ax, lengths, mean, drawn, styles[name], entries[name] + _off_scale(mean, lengths, limits))
    note = _train_lengths(ax, _lines(panel))
    length_axis(ax, lengths)
    ax.set_ylim(*limits)
    ax.set_xlabel(f"evaluation length L (tokens{note})")
    ax.set_ylabel("Δ ln perplexity (nats/token)")
    ax.set_title(wrap(panel.title, TITLE_WRAP))
    legend_right(ax)


def _off_scale(mean: np.ndarray, lengths: Sequence[int], limits: tuple[float, float]) -> str:
    """A legend entry's note for a line that leaves the panel: from which length on ("" for none)."""
    low, high = limits
    outside = [n for n, x in zip(lengths, mean, strict=True) if np.isfinite(x) and not low <= x <= high]
    return f", off the panel from L = {outside[0]}" if outside else ""


def _ppl_at_one_length(rows: Mapping[str, Row], length: int) -> Figure:
    """Perplexity at the one evaluated length, a line per row: a dot at the mean over seeds, a bar per
    seed, in the encoding's colour."""
    key = metric_key("ppl", length)
    means = _means(rows, [key])[key]
    colours = encoding_colours(row.encoding for row in rows.values())
    fig = new_figure(6.0 + _label_width(rows), 1.5 + _rows_height(rows), layout="constrained")
    ax = fig.add_subplot()
    for i, (name, row) in enumerate(rows.items()):
        seeds = [values[0] for values in _seed_values(row, [key])]
        style = {"color": colours[row.encoding], "linestyle": "none"}
        ax.plot(seeds, [i] * len(seeds), marker="|", markersize=10, **style)
        ax.plot([means[name]], [i], marker="o", **style)
    _row_labels(ax, rows)
    ax.grid(axis="y", color="0.9")
    ax.set_xscale("log")
    label_log_axis(ax.xaxis)
    ax.set_xlabel(f"perplexity at L = {length} (log scale)")
    title = f"Perplexity at the one evaluated length, L = {length} (dot: mean over seeds; bar: each seed)"
    ax.set_title(wrap(title, 70))
    return fig


def _longest_series(row: Row) -> tuple[int, np.ndarray] | None:
    """The row's longest evaluated length with a loss-by-position series and its mean over the seeds;
    None for none, and for a RoPE scaling view without one past the training length (up to it, the
    view's series are the unscaled model's)."""
    lengths = key_lengths([k for r in row.runs for k in r.series], "position_loss")
    trained = [int(r.config[SEQ_LEN_KEY]) for r in row.runs if SEQ_LEN_KEY in r.config]
    if not lengths or (row.scaling and lengths[-1] <= max(trained, default=0)):
        return None
    key = metric_key("position_loss", lengths[-1])
    return lengths[-1], np.mean(np.asarray([r.series[key] for r in row.runs if key in r.series]), axis=0)


def position_loss_figure(rows: Mapping[str, Row]) -> Figure | None:
    """Per-position loss at each row's longest evaluated length, mean over seeds, panels as `facets`."""
    curves = {name: curve for name, row in rows.items() if (curve := _longest_series(row)) is not None}
    if not curves:
        return None
    lengths = sorted({n for n, _ in curves.values()})
    at = f", L = {lengths[0]}" if len(lengths) == 1 else ""
    title = f"Loss by position at the longest length{at} (mean over seeds)"
    panels = facets({name: rows[name] for name in curves})
    fig, axes = panel_grid(len(panels))
    for ax, panel in zip(axes, panels, strict=True):
        styles, entries = line_styles(panel), legend_entries(panel)
        for name in panel:
            n, mean = curves[name]
            label = entries[name] if at else f"{entries[name]} (L={n})"
            ax.plot(bin_centres(n, len(mean)), mean, label=label, **styles[name])
        note = _train_lengths(ax, panel)
        ax.set_xlabel(f"position in the window (tokens, bin centres{note})")
        ax.set_ylabel("mean loss (nats/token)")
        ax.set_title(facet_title(panel, title, len(panels)))
        legend_right(ax)
    if len(panels) > 1:
        fig.suptitle(title)
    return fig


NEEDLE_SPREAD = 0.5  # a row's seeds disagree when one cell's accuracies span this much: each seed is drawn
STAGE_FINAL_LOSS = "passkey_stage/needle_loss"  # the stage's final key loss, nats per digit (chance: ln 10)


def needle_figure(name: str, row: Row) -> Figure | None:
    """Passkey accuracy heatmap (depth × length) from the per-cell scalars: the mean over the seeds that
    measured the needle (a later seed may be the language model alone), and each seed beside it (with its
    stage's final key loss) when the seeds disagree (`NEEDLE_SPREAD`)."""
    cells = needle_cells(_metric_keys(row.runs))
    if not cells:
        return None
    lengths = sorted({n for n, _ in cells})
    depths = sorted({d for _, d in cells})
    keys = [metric_key("acc", n, depth=d) for n in lengths for d in depths]
    row = replace(row, runs=[r for r in row.runs if any(k in r.metrics for k in keys)])
    shape = (len(lengths), len(depths))
    seeds = np.asarray(_seed_values(row, keys)).reshape(-1, *shape)
    mean = _means({name: row}, keys).loc[name].to_numpy(dtype=float).reshape(shape)
    n = len(row.runs)
    panels = [(f"mean of {n} seeds" if n > 1 else f"one seed (seed {row.runs[0].seed})", mean)]
    if _seeds_disagree(seeds):
        panels += [(_seed_title(run), grid) for run, grid in zip(row.runs, seeds, strict=True)]
    size = (1.5 + (1.2 + 0.6 * len(lengths)) * len(panels), 2.2 + 0.45 * len(depths))
    fig = new_figure(*size, layout="constrained")
    axes = list(fig.subplots(1, len(panels), squeeze=False)[0])
    grid = {"lengths": lengths, "depths": [float(d) for d in depths]}
    for ax, (title, acc) in zip(axes, panels, strict=True):
        image = needle_panel(ax, {**grid, "acc": acc}, title)
    fig.colorbar(image, ax=axes, label="passkey accuracy")
    note = "\nthe seeds disagree: each beside their mean (key loss: the stage's final, chance: ln 10 = 2.30)"
    fig.suptitle(wrap(f"Passkey accuracy: {name}", int(size[0] * 9)) + (note if len(panels) > 1 else ""))
    return fig


def _seeds_disagree(seeds: np.ndarray) -> bool:
    """Whether some cell's accuracies over the seeds (seeds × cells) span NEEDLE_SPREAD or more."""
    by_cell = pd.DataFrame(seeds.reshape(len(seeds), -1))
    return len(seeds) > 1 and bool((by_cell.max() - by_cell.min()).max() >= NEEDLE_SPREAD)


def _seed_title(run: RunRecord) -> str:
    """The panel title of one seed: its number and its stage's final key loss where it has one."""
    loss = run.metrics.get(STAGE_FINAL_LOSS)
    return f"seed {run.seed}" + ("" if loss is None else f"\nkey loss {loss:.2f}")


SHIFT_PANELS = (  # (shift kind, metric, colour-bar label, title)
    ("offset", "kl", "KL(p_ref ‖ p_shift), nats (log scale)", "Position offset k: KL"),
    ("prefix", "dloss", "Δloss, nats/token", "Prefix of k tokens: Δloss"),
)
SHIFT_CELL_WIDTH = 0.75  # inches per column (k) of a shift table
COLOUR_BAR_WIDTH = 1.3  # inches a colour bar and its label take
SHIFT_PREFIX = "shift/"
MIN_TABLE_HEIGHT = 3.5  # inches a shift table takes at least, however few its rows
SHIFT_PAD = 0.12  # inches between a colour bar's label and the next table
TABLE_OVER_LABELS = 1.5  # the first shift table is this many times as wide as the names and colour bar
NO_COLOUR = "0.85"  # a table cell without a colour: exactly 0 (or below) on a log scale, or no value


def shift_figure(rows: Mapping[str, Row]) -> Figure | None:
    """The offset KL and the prefix Δloss of each row at each k, mean over seeds, as tables of values
    coloured by value (KL on a log scale, 0 in grey): rows at 0, or equal to others, stay visible."""
    ks = [shift_sizes(_metric_keys(_runs(rows)), kind, metric) for kind, metric, *_ in SHIFT_PANELS]
    if not any(ks):
        return None
    shown = [(panel, k_values) for panel, k_values in zip(SHIFT_PANELS, ks, strict=True) if k_values]
    rows = {name: row for name, row in rows.items() if _has_shift(row)}
    widths = _shift_widths(rows, [len(k_values) for _, k_values in shown])
    fig = new_figure(sum(widths), 1.8 + max(MIN_TABLE_HEIGHT, _rows_height(rows)), layout="constrained")
    fig.get_layout_engine().set(w_pad=SHIFT_PAD)
    axes = fig.subplots(1, len(shown), sharey=True, squeeze=False, width_ratios=widths)[0]
    for ax, (panel, k_values) in zip(axes, shown, strict=True):
        _shift_table(fig, ax, rows, panel, k_values)
    _row_labels(axes[0], rows)
    fig.suptitle("Shift stability (mean over seeds; grey: exactly 0)")
    return fig


def _shift_widths(rows: Mapping[str, Row], columns: Sequence[int]) -> list[float]:
    """Inches of each shift table with its colour bar; the first also holds the rows' names beside it and
    is made wider than they and its colour bar together (TABLE_OVER_LABELS), so that the table keeps more
    than half of its share of the figure."""
    widths = [SHIFT_CELL_WIDTH * n + COLOUR_BAR_WIDTH for n in columns]
    labels = _label_width(rows)
    table = max(SHIFT_CELL_WIDTH * columns[0], TABLE_OVER_LABELS * (labels + COLOUR_BAR_WIDTH))
    widths[0] = labels + table + COLOUR_BAR_WIDTH
    return widths


def _has_shift(row: Row) -> bool:
    """Whether a run of the row has a shift result (RoPE's scaling views have none)."""
    return any(key.startswith(SHIFT_PREFIX) for run in row.runs for key in run.metrics)


def _shift_table(
    fig: Figure, ax: Axes, rows: Mapping[str, Row], panel: tuple[str, str, str, str], k_values: list[int]
) -> None:
    """One table of the shift figure: the mean of `shift/<kind>k/<metric>` per row (lines) and k
    (columns), each value written in its cell, a colour bar beside it."""
    kind, metric, label, title = panel
    values = _means(rows, [metric_key(metric, shift=kind, k=k) for k in k_values]).to_numpy(dtype=float)
    norm = _shift_norm(metric, values)
    coloured = np.ma.masked_invalid(np.where(values > 0, values, np.nan) if metric == "kl" else values)
    cmap = colormaps["viridis"].with_extremes(bad=NO_COLOUR)
    image = ax.imshow(coloured, norm=norm, cmap=cmap, aspect="auto")
    blank = np.ma.getmaskarray(coloured)
    for (i, j), value in np.ndenumerate(values):
        dark = not blank[i, j] and float(norm(value)) < 0.5
        ax.text(j, i, _shift_text(metric, value), ha="center", va="center", fontsize="small",
                color="white" if dark else "black")  # fmt: skip
    fig.colorbar(image, ax=ax, label=label)
    ax.set_xticks(range(len(k_values)), [str(k) for k in k_values])
    ax.set_xlabel(f"{kind} k (tokens)")
    ax.set_title(wrap(title, 20))


def _shift_norm(metric: str, values: np.ndarray) -> Normalize:
    """The colour scale of a shift table: KL logarithmic over its positive values, Δloss linear from 0
    (or its lowest value) to its highest."""
    finite = values[np.isfinite(values)]
    if metric == "kl":
        positive = finite[finite > 0]
        return LogNorm(positive.min(), positive.max()) if positive.size else Normalize(0.0, 1.0)
    return Normalize(min(0.0, finite.min()), finite.max()) if finite.size else Normalize(0.0, 1.0)


def _shift_text(metric: str, value: float) -> str:
    """A table cell: "–" for no value, "0" for exactly 0, KL in scientific notation, Δloss to 3 decimals."""
    if math.isnan(value):
        return "–"
    if value == 0.0:
        return "0"
    return f"{value:.1e}" if metric == "kl" else f"{value:.3f}"


def plot_ppl_vs_length(
    rows: Mapping[str, Row], path: Path, references: Sequence[str] = PAIRED_REFERENCES
) -> Path | None:
    """`ppl_vs_length_figure` as a PNG at `path`."""
    return save(ppl_vs_length_figure(rows, references), path)


def plot_position_loss(rows: Mapping[str, Row], path: Path) -> Path | None:
    """`position_loss_figure` as a PNG at `path`."""
    return save(position_loss_figure(rows), path)


def plot_shift(rows: Mapping[str, Row], path: Path) -> Path | None:
    """`shift_figure` as a PNG at `path`."""
    return save(shift_figure(rows), path)


def plot_needle(name: str, row: Row, path: Path) -> Path | None:
    """`needle_figure` as a PNG at `path`."""
    return save(needle_figure(name, row), path)
