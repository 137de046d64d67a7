"""RoPE scaling views (`posab.report.scaling`): a view shows what was measured under its scaling and
nothing of the unscaled run past the training length; the report draws and tabulates such a row."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from report_runs import finished_run

from posab.keys import PPL, format_key, parse_key
from posab.report.figures import needle_figure, position_loss_figure, ppl_vs_length_figure, shift_figure
from posab.report.grouping import group_rows
from posab.report.markdown import MISSING, study_table
from posab.report.records import RunRecord
from posab.report.scaling import UNSCALED, scaled_view, scaling_kinds

TRAIN_LEN = 64
KINDS = ("pi", "yarn")
UNSCALED_KEYS = [
    *(f"{m}/{n}" for n in (32, 64, 128) for m in ("loss", "ppl", "bpb", "loss_docmean", "ppl_windows")),
    *(f"{m}/128" for m in ("loss_tail", "ppl_tail", "loss_capped", "ppl_capped")),
    "needle/acc", "needle/acc@64", "needle/acc@128", "needle/acc@128/depth0.5", "needle/gain@128",
    "needle/digit_acc@128/d0", "needle/attn_mass@128",
    "shift/offset512/kl", "shift/prefix16/dloss", "shift/context16/dloss",
    "wikitext2:ppl/64", "wikitext2:ppl/128",
]  # fmt: skip
SCALED_METRICS = ("loss", "ppl", "bpb", "loss_tail", "ppl_tail", "ppl_windows")  # at 128, as the evaluator
MODEL_KEYS = ["params/total", "params/encoding", "val_loss", "train_loss", "tokens_per_s", "wall_time_s"]
OTHER_KEYS = ["time/ppl@128_s", "time/needle_s", "passkey_stage/steps"]


def scaled(text: str, kind: str) -> str:
    """The key `text` measured under `kind`: `ppl/128` -> `ppl@pi/128`."""
    key = parse_key(text)
    assert key is not None
    return format_key(replace(key, variant=kind))


def rope_run(seed: int = 0) -> RunRecord:
    """A RoPE run trained at 64, evaluated unscaled at 32..128 (and on wikitext2), under pi and yarn at 128;
    every value distinct, so a view's value says which key it came from."""
    values = itertools.count(1.0)
    metrics = {k: next(values) for k in [*MODEL_KEYS, *OTHER_KEYS, *UNSCALED_KEYS]}
    metrics |= {scaled(f"{m}/128", kind): next(values) for kind in KINDS for m in SCALED_METRICS}
    metrics |= {scaled("wikitext2:ppl/128", "pi"): next(values)}
    series = {f"position_loss/{n}": [next(values)] for n in (32, 64, 128)}
    series |= {f"position_loss@{kind}/128": [next(values)] for kind in KINDS}
    window_keys = ["loss/64", "loss/128", "loss_tail/128", "loss_capped/128"]
    window_keys += [scaled(k, kind) for kind in KINDS for k in ("loss/128", "loss_tail/128")]
    windows = {k: [next(values), next(values)] for k in window_keys}
    config = {"encoding.name": "rope", "train.seq_len": str(TRAIN_LEN)}
    run = finished_run(
        f"rope-{seed}", "rope", seed, "s", config, metrics, windows=windows, window_starts=[0, 9]
    )
    return replace(run, series=series)


def table_cells(lines: list[str]) -> dict[str, dict[str, str]]:
    """A Markdown table's cells by row label, then column header."""
    header, *body = [
        [c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("|")
    ]
    return {cells[0]: dict(zip(header, cells, strict=True)) for cells in body[1:]}  # body[0]: |---|


def evaluation_past_training(text: str) -> bool:
    """Whether the key is an evaluation result that the plain model's numbers cannot stand in for."""
    key = parse_key(text)
    return key is not None and not (key.family == PPL and key.length is not None and key.length <= TRAIN_LEN)


@pytest.mark.parametrize("kind", KINDS)
def test_a_scaled_view_holds_only_what_was_measured_under_its_scaling(kind: str) -> None:
    run = rope_run()
    view = scaled_view(run, kind)
    for name, original, shown in (
        ("metrics", run.metrics, view.metrics),
        ("series", run.series, view.series),
        ("windows", run.windows, view.windows),
    ):
        for text, value in shown.items():
            if evaluation_past_training(text):
                assert original.get(scaled(text, kind)) == value, (name, text)  # measured under the kind
                assert original.get(text) != value, (name, text)  # never the unscaled run's number
            else:
                assert original[text] == value, (name, text)
    assert not [k for k in view.metrics if k.startswith(("needle/", "shift/", "time/", "passkey_stage/"))]
    assert not [k for k in view.metrics if "capped" in k or "docmean/128" in k or "@" in k]
    assert [k for k in MODEL_KEYS if k not in view.metrics] == []
    assert view.metrics["ppl/64"] == run.metrics["ppl/64"] and view.metrics["ppl/32"] == run.metrics["ppl/32"]
    assert set(view.windows) == {"loss/64", "loss/128", "loss_tail/128"}
    assert set(view.series) == {"position_loss/32", "position_loss/64", "position_loss/128"}
    assert view.window_starts == run.window_starts
    assert ("wikitext2:ppl/128" in view.metrics) == (kind == "pi")  # measured on the corpus under pi only


def test_the_unscaled_view_is_the_run_without_its_scaled_keys() -> None:
    run = rope_run()
    view = scaled_view(run, UNSCALED)
    assert view.metrics == {k: v for k, v in run.metrics.items() if "@pi/" not in k and "@yarn/" not in k}
    assert set(view.series) == {"position_loss/32", "position_loss/64", "position_loss/128"}
    assert set(view.windows) == {"loss/64", "loss/128", "loss_tail/128", "loss_capped/128"}
    assert scaling_kinds(run) == list(KINDS)


def test_without_the_training_length_a_view_keeps_no_unscaled_evaluation() -> None:
    run = rope_run()
    run.config.pop("train.seq_len")
    view = scaled_view(run, "pi")
    assert all(parse_key(k) is None or scaled(k, "pi") in run.metrics for k in view.metrics)
    assert "ppl/64" not in view.metrics and view.metrics["ppl/128"] == run.metrics["ppl@pi/128"]


def test_a_scaling_row_shows_blank_cells_and_draws_no_needle() -> None:
    """The rope + pi row of a report: its table has its own ppl and tail and blanks where the scaling was not
    measured; the needle heatmap is not drawn for it; the other figures take it."""
    rows = {row.label: row for row in group_rows([rope_run(0), rope_run(1)])["s"]}
    assert set(rows) == {"rope", "rope + pi", "rope + yarn"}
    assert needle_figure("rope + pi", rows["rope + pi"]) is None
    assert needle_figure("rope", rows["rope"]) is not None
    for figure in (ppl_vs_length_figure, position_loss_figure, shift_figure):
        assert figure(rows) is not None, figure.__name__
    assert shift_figure({"rope + pi": rows["rope + pi"]}) is None
    table = table_cells(study_table(list(rows.values())))
    pi, rope = table["rope + pi"], table["rope"]
    assert pi["capped@128"] == MISSING and rope["capped@128"] != MISSING
    assert pi["needle acc"] == MISSING and rope["needle acc"] != MISSING
    assert pi["tail@128"] not in (MISSING, rope["tail@128"]) and pi["ppl@64"] == rope["ppl@64"]
