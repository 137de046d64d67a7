"""Every figure kind of the reports, rendered from a study of many rows, is readable at the size it is
saved, as measured from matplotlib's own geometry after a draw (Agg):

- every axes that holds data has a title, an x label and a y label (its own, or that of an axes it shares
  its y axis with);
- no legend covers the plotting area of any axes, and every legend lies inside the figure (it takes its
  room from the layout, not beyond the saved image's edge); a legend holds at most MAX_LEGEND_ENTRIES;
- each axes keeps at least MIN_AREA_SHARE of the area of its grid cell (its share of the figure: the
  figure divided by the grid's width and height ratios) and MIN_SIDE_SHARE of its cell's width and of its
  height: a legend or labels do not squeeze it to a strip;
- no title (of an axes, or the figure's) overlaps another title or any plotting area;
- a log axis has at least MIN_LOG_LABELS labelled ticks in its range;
- no line is drawn through fewer than two points (a single evaluated length is no line plot).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.transforms import Bbox
from report_runs import finished_run

from posab.plots import new_figure
from posab.report.curves import training_curves_figure
from posab.report.document import named_rows
from posab.report.figures import needle_figure, position_loss_figure, ppl_vs_length_figure, shift_figure
from posab.report.grouping import Row, group_rows
from posab.report.records import STAGE_KEY_LOSS, STAGE_PROBES, RunRecord
from posab.report.styles import short_label, short_value
from posab.studies.needle import by_length_figure, stage_curves_figure, stage_rows
from posab.studies.tuning import picks, points, tuning_figure

MIN_AREA_SHARE = 0.4
MIN_SIDE_SHARE = 0.5
MIN_LOG_LABELS = 3
MAX_LEGEND_ENTRIES = 12

ENCODINGS = tuple("alibi fire hierarchical kerple learned multiscale nope rope sinusoidal t5".split())
RELATIVE = {"alibi", "fire", "hierarchical", "kerple", "multiscale", "nope", "rope", "t5"}  # KL exactly 0
STAGED = {*((e, "0.003") for e in ("alibi", "hierarchical", "multiscale", "nope", "rope", "sinusoidal")),
          ("alibi", "0.001")}  # (encoding, lr) with a passkey stage: 9 rows  # fmt: skip
RATES = ("0.001", "0.003", "0.006")
LENGTHS = (512, 1024, 2048, 4096)
DEPTHS = (0.0, 0.5, 1.0)
SEEDS = (0, 1, 2)
BROKEN = ("sinusoidal", "0.003", 2)  # this seed's perplexity beyond the training length is 3 times its peers'
FAILED = ("hierarchical", "0.003", "true", 1)  # this seed's passkey stage stays at chance


def ppl(i: int, j: int, seed: int, length: int, scaled: float = 1.0) -> float:
    growth = (length / 512) ** (0.15 * (i % 5) / scaled)
    return (5.0 + 0.3 * i + 0.1 * j) * growth * (1.0 + 0.02 * seed)


def needle_metrics(encoding: str, failed: bool, seed: int) -> dict[str, float]:
    """The passkey stage's scalars and needle grid of a run (all 0 and a chance key loss when failed)."""
    metrics: dict[str, float] = {
        "passkey_stage/steps": 10.0,
        "passkey_stage/needle_loss": 2.3 if failed else 0.01,
    }
    for n in LENGTHS:
        acc = 0.0 if failed else max(0.0, 1.0 - 0.2 * LENGTHS.index(n))
        metrics |= {f"needle/acc@{n}/depth{d}": acc for d in DEPTHS}
        metrics |= {f"needle/acc@{n}": acc, f"needle/gain@{n}": 40.0 * acc + seed}
    return metrics


def run(i: int, encoding: str, j: int, lr: str, seed: int, anchors: str | None) -> RunRecord:
    """One synthetic finished run with every result a report figure draws."""
    metrics = {f"ppl/{n}": ppl(i, j, seed, n) * (3.0 if (encoding, lr, seed) == BROKEN and n > 512 else 1.0)
               for n in LENGTHS}  # fmt: skip
    if encoding == "rope":
        metrics |= {
            f"ppl@{kind}/{n}": ppl(i, j, seed, n, s)
            for kind, s in (("pi", 2.0), ("ntk", 4.0))
            for n in LENGTHS
        }
    kl = 0.0 if encoding in RELATIVE else 1e-3
    metrics |= {f"shift/offset{k}/kl": kl * k for k in (1, 64, 512)}
    metrics |= {f"shift/prefix{k}/dloss": 0.01 * i + 1e-4 * k for k in (64, 128, 256)}
    metrics["val_loss"] = 2.0 - 0.05 * i + 0.1 * abs(j - 1)
    config = {"train.lr": lr, "train.seq_len": "512", "encoding.lr_mult": "1.0"}
    config |= {"data.anchors": anchors} if anchors else {}
    fields: dict = {"val_curve": [(s, 2.5 - 0.1 * i - 0.001 * s + 0.01 * seed) for s in (100, 200, 300, 400)]}
    if (encoding, lr) in STAGED:
        failed = (encoding, lr, anchors, seed) == FAILED
        metrics |= needle_metrics(encoding, failed, seed)
        fields["stage_curves"] = {
            STAGE_KEY_LOSS: [(-10, 5.0), (0, 2.3), (10, 2.3 if failed else 0.001)],
            STAGE_PROBES: [(5, 0.0), (10, 0.0 if failed else 1.0)],
        }
    name = f"{encoding}-{lr}-{anchors}-{seed}"
    record = finished_run(name, encoding, seed, "many", config, metrics, **fields)
    record.series = {"position_loss/4096": list(np.linspace(2.0, 2.0 + 0.1 * i, 16))}
    return record


@pytest.fixture(scope="module")
def runs() -> list[RunRecord]:
    """10 encodings x 3 learning rates (x data.anchors for two of them) x 3 seeds: 108 runs, 42 rows."""
    found = []
    for i, encoding in enumerate(ENCODINGS):
        anchors = ("true", "false") if encoding in {"hierarchical", "multiscale"} else (None,)
        for j, lr in enumerate(RATES):
            found += [run(i, encoding, j, lr, seed, a) for a in anchors for seed in SEEDS]
    return found


@pytest.fixture(scope="module")
def rows(runs: list[RunRecord]) -> dict[str, Row]:
    return named_rows(group_rows(runs))


def data_axes(fig: Figure) -> list[Axes]:
    """The axes that draw data: not colour bars, not empty."""
    return [
        ax
        for ax in fig.axes
        if getattr(ax, "_colorbar", None) is None and (ax.lines or ax.images or ax.collections)
    ]


def legends(fig: Figure) -> list[Legend]:
    return [*fig.legends, *(legend for ax in fig.axes if (legend := ax.get_legend()) is not None)]


def overlap(a: Bbox, b: Bbox) -> float:
    """Pixels shared by two boxes."""
    both = Bbox.intersection(a, b)
    return 0.0 if both is None else max(both.width, 0.0) * max(both.height, 0.0)


def cell(fig: Figure, ax: Axes) -> Bbox:
    """The axes' share of the figure: its grid cell by the grid's width and height ratios (pixels)."""
    spec = ax.get_subplotspec()
    assert spec is not None, "an axes outside any grid"
    grid = spec.get_gridspec()
    widths, heights = np.asarray(grid.get_width_ratios(), float), np.asarray(grid.get_height_ratios(), float)
    x0, x1 = widths[: spec.colspan.start].sum(), widths[: spec.colspan.stop].sum()
    y0, y1 = heights[: spec.rowspan.start].sum(), heights[: spec.rowspan.stop].sum()
    w, h = fig.bbox.width, fig.bbox.height
    return Bbox.from_extents(w * x0 / widths.sum(), h * y0 / heights.sum(), w * x1 / widths.sum(),
                             h * y1 / heights.sum())  # fmt: skip


def titles(fig: Figure, axes: list[Axes]) -> Iterator[tuple[str, Bbox]]:
    """Each axes' title and the figure's texts (its title), with their boxes."""
    renderer = fig.canvas.get_renderer()
    for text in [*(ax.title for ax in axes), *fig.texts]:
        if text.get_text():
            yield text.get_text(), text.get_window_extent(renderer)


def check_readable(fig: Figure | None) -> None:
    """Every rule of the module's docstring, for one figure."""
    assert fig is not None
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    axes = data_axes(fig)
    assert axes
    areas = [ax.get_window_extent(renderer) for ax in axes]
    for ax, area in zip(axes, areas, strict=True):
        assert ax.get_title(), f"an axes without a title: {ax.get_xlabel()!r}"
        assert ax.get_xlabel(), ax.get_title()
        siblings = ax.get_shared_y_axes().get_siblings(ax)
        assert any(other.get_ylabel() for other in siblings), ax.get_title()
        share = cell(fig, ax)
        assert area.width * area.height >= MIN_AREA_SHARE * share.width * share.height, "share of the area"
        assert area.width >= MIN_SIDE_SHARE * share.width, f"share of the width: {ax.get_title()}"
        assert area.height >= MIN_SIDE_SHARE * share.height, f"share of the height: {ax.get_title()}"
        check_ticks_and_lines(ax)
    for legend in legends(fig):
        box = legend.get_window_extent(renderer)
        assert len(legend.get_texts()) <= MAX_LEGEND_ENTRIES
        assert all(overlap(box, area) < 1.0 for area in areas), "a legend covers a plotting area"
        assert overlap(box, fig.bbox) >= box.width * box.height - 1.0, "a legend beyond the figure's edge"
    found = list(titles(fig, axes))
    for i, (text, box) in enumerate(found):
        assert all(overlap(box, area) < 1.0 for area in areas), f"title {text!r} covers a plotting area"
        assert all(overlap(box, other) < 1.0 for _, other in found[i + 1 :]), f"title {text!r} overlaps"


def check_ticks_and_lines(ax: Axes) -> None:
    """A log axis: MIN_LOG_LABELS labelled ticks; every drawn line: two points or more."""
    for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
        if scale == "log":
            low, high = sorted(axis.get_view_interval())
            shown = [t for t, at in zip(axis.get_majorticklabels(), axis.get_majorticklocs(), strict=True)
                     if t.get_text() and low <= at <= high]  # fmt: skip
            assert len(shown) >= MIN_LOG_LABELS, (ax.get_title(), [t.get_text() for t in shown])
    for line in ax.lines:
        if line.get_linestyle() not in ("None", "none", ""):
            assert np.isfinite(np.asarray(line.get_xdata(), float)).sum() >= 2, ax.get_title()


def legend_colours(fig: Figure) -> list[list[str]]:
    return [[str(h.get_color()) for h in legend.legend_handles] for legend in legends(fig)]


def test_the_study_has_many_rows(rows: dict[str, Row]) -> None:
    assert len(rows) == 42 and sum(len(row.runs) for row in rows.values()) == 126  # rope's views share runs


@pytest.mark.parametrize(
    "draw", [ppl_vs_length_figure, position_loss_figure, shift_figure, training_curves_figure],
    ids=["ppl_vs_length", "position_loss", "shift", "training_curves"],
)  # fmt: skip
def test_each_report_figure_is_readable(rows: dict[str, Row], draw) -> None:
    fig = draw(rows)
    check_readable(fig)
    for colours in legend_colours(fig):
        assert len(set(colours)) == len(colours), "two rows of one panel share a colour"


def test_each_seed_of_a_row_is_marked_where_the_seeds_disagree(rows: dict[str, Row]) -> None:
    """The broken seed's perplexity at 4096 is drawn, beside its row's mean (the other seeds' scale)."""
    fig = ppl_vs_length_figure(rows)
    assert fig is not None
    drawn = {round(float(y), 6) for ax in fig.axes for line in ax.lines for y in np.asarray(line.get_ydata())}
    encoding, lr, seed = BROKEN
    broken = next(r for r in rows[f"{encoding}, train.lr={lr}"].runs if r.seed == seed).metrics["ppl/4096"]
    assert round(broken, 6) in drawn


def test_one_evaluated_length_is_a_dot_chart_not_a_line(runs: list[RunRecord]) -> None:
    """A study evaluated at one length only (the tuning's): a dot per row and a mark per seed."""
    short = [replace(r, metrics={"ppl/512": r.metrics["ppl/512"]}, series={}) for r in runs]
    fig = ppl_vs_length_figure(named_rows(group_rows(short)))
    check_readable(fig)
    assert fig is not None and all(line.get_linestyle() == "None" for line in fig.axes[0].lines)


def test_a_needle_heatmap_draws_each_seed_where_they_disagree(rows: dict[str, Row]) -> None:
    encoding, lr, anchors, seed = FAILED
    failed = f"{encoding}, data.anchors={anchors}, train.lr={lr}"
    fig = needle_figure(failed, rows[failed])
    check_readable(fig)
    assert fig is not None
    heads = [ax.get_title().split("\n")[0] for ax in data_axes(fig)]
    assert heads == ["mean of 3 seeds", *(f"seed {s}" for s in SEEDS)]
    assert "key loss 2.30" in data_axes(fig)[1 + seed].get_title()
    agreed = needle_figure("alibi, train.lr=0.003", rows["alibi, train.lr=0.003"])
    check_readable(agreed)
    assert agreed is not None and [ax.get_title() for ax in data_axes(agreed)] == ["mean of 3 seeds"]
    row = rows[failed]  # a later seed run as the language model alone: no panel, not counted
    lm_only = replace(row.runs[0], name="lm-only", seed=9, metrics={"ppl/512": 5.0})
    fig = needle_figure(failed, replace(row, runs=[*row.runs, lm_only]))
    assert fig is not None
    assert [ax.get_title().split("\n")[0] for ax in data_axes(fig)] == heads


def test_rows_at_zero_stay_visible_in_the_shift_table(rows: dict[str, Row]) -> None:
    fig = shift_figure(rows)
    assert fig is not None
    kl = data_axes(fig)[0]
    measured = [row for row in rows.values() if not row.scaling]  # RoPE's scaling views measure no shift
    texts = [t.get_text() for t in kl.texts]
    assert len(texts) == 3 * len(measured)
    assert texts.count("0") == 3 * sum(row.encoding in RELATIVE for row in measured)


@pytest.mark.parametrize("draw", [by_length_figure, stage_curves_figure], ids=["by_length", "stage_curves"])
def test_each_needle_report_figure_is_readable(rows: dict[str, Row], draw) -> None:
    staged = stage_rows(rows)
    assert len(staged) > 8  # more rows than one panel holds
    fig = draw(staged)
    check_readable(fig)
    for colours in legend_colours(fig):
        assert len(set(colours)) == len(colours)


def test_the_tuning_figure_is_readable(runs: list[RunRecord]) -> None:
    frame = points(runs)
    check_readable(tuning_figure(frame, picks(frame)))


@pytest.mark.filterwarnings("ignore:constrained_layout not applied")
def test_the_checks_fail_the_figures_as_they_were(rows: dict[str, Row]) -> None:
    """Before: every row in one axes of 10 x 4.5 inches, its legend of full names beside it."""
    fig = new_figure(10.0, 4.5, layout="constrained")
    ax = fig.add_subplot()
    for name in rows:
        ax.plot(LENGTHS, [1.0, 2.0, 3.0, 4.0], label=name)
    ax.set(title="Perplexity vs evaluation length", xlabel="L", ylabel="perplexity")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    with pytest.raises(AssertionError, match="legend|share"):
        check_readable(fig)


def with_yarn(run: RunRecord) -> RunRecord:
    """A RoPE run of the fixture also evaluated under YaRN (`ppl@yarn/L`), which breaks less than PI."""
    if run.encoding != "rope":
        return run
    i, j = ENCODINGS.index("rope"), RATES.index(run.config["train.lr"])
    return replace(run, metrics=run.metrics | {f"ppl@yarn/{n}": ppl(i, j, run.seed, n, 2.5) for n in LENGTHS})


def legend_texts(ax: Axes) -> list[str]:
    legend = ax.get_legend()
    return [] if legend is None else [t.get_text().replace("\n", " ") for t in legend.get_texts()]


def test_the_perplexity_figure_draws_the_references_in_every_panel(runs: list[RunRecord]) -> None:
    """The references (and RoPE's YaRN view) in every panel, legends by encoding and rate, the rows that
    break in perplexity panels, the flat rows in a difference panel where 0.05 nats is visible."""
    rows = named_rows(group_rows([with_yarn(r) for r in runs]))
    fig = ppl_vs_length_figure(rows, ["rope, train.lr=0.003", "alibi, train.lr=0.001"])
    check_readable(fig)
    assert fig is not None
    axes = data_axes(fig)
    refs = ("ref: RoPE (lr 3e-3)", "ref: ALiBi (lr 1e-3)", "ref: RoPE + YaRN (lr 3e-3)")
    for ax in axes:
        assert all(any(text.startswith(ref) for text in legend_texts(ax)) for ref in refs), ax.get_title()
        assert not any("train.lr=" in text for text in legend_texts(ax))
    difference = [ax for ax in axes if ax.get_yscale() == "linear"]
    perplexity = [ax for ax in axes if ax.get_yscale() == "log"]
    assert difference and perplexity
    flat = {text for ax in difference for text in legend_texts(ax) if not text.startswith("ref: ")}
    broken = {text for ax in perplexity for text in legend_texts(ax) if not text.startswith("ref: ")}
    assert {"multi-scale (lr 3e-3, anchors=true)", "ALiBi (lr 3e-3)"} <= flat  # growth 1: flat
    assert {"FIRE (lr 1e-3)", "RoPE + PI (lr 3e-3)"} <= broken and not flat & broken
    assert len(flat) + len(broken) == len(rows) - len(refs)  # every other row once
    ax = difference[0]
    assert "ref: ALiBi (lr 1e-3): Δ = 0" in legend_texts(ax)  # the flat reference of lowest perplexity
    assert any(np.all(np.asarray(line.get_ydata(), float) == 0.0) and len(line.get_ydata()) == 4
               for line in ax.lines)  # fmt: skip
    low, high = ax.transData.transform([(512, y) for y in (0.0, 0.05)])[:, 1]
    assert high - low >= 20.0, "0.05 nats spans fewer than 20 pixels"


def test_a_row_is_named_by_its_encoding_and_rate() -> None:
    assert short_value("train.lr", "0.003") == "lr 3e-3"
    assert short_value("train.lr", "0.0015") == "lr 1.5e-3"
    assert short_value("encoding.lr_mult", "10") == "lr_mult 10"
    assert short_value("data.anchors", "false") == "anchors=false"
    row = Row("s", "multiscale, encoding.lr_mult=10, train.lr=0.003", "multiscale", "", [])
    assert short_label(row.label, row) == "multi-scale (lr 3e-3, lr_mult 10)"
    yarn = Row("s", "rope, encoding.lr_mult=1.0, train.lr=0.006 + yarn", "rope", "yarn", [])
    assert short_label(f"main: {yarn.label}", yarn) == "main: RoPE + YaRN (lr 6e-3)"
