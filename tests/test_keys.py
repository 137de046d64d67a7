"""The metric-key grammar (`posab.keys`): round trips for every family, the committed runs.csv's columns,
the keys outside it, and the helpers the evaluators, the summary and the report read keys with."""

from __future__ import annotations

import csv

import pytest

from conftest import ROOT
from posab.keys import (
    NEEDLE_METRICS,
    PPL_METRICS,
    SHIFT_KINDS,
    SHIFT_METRICS,
    MetricKey,
    Metrics,
    format_key,
    key_corpora,
    key_lengths,
    key_variants,
    metric_key,
    needle_cells,
    needle_digits,
    parse_key,
    shift_sizes,
)
from posab.report.records import WINDOWS_PREFIX

RUNS_CSV = ROOT / "results" / "study" / "main" / "runs.csv"
PPL_KEYS = [
    MetricKey(metric, length, variant=variant, corpus=corpus)
    for metric in PPL_METRICS
    for length, variant, corpus in ((512, None, None), (4096, "yarn", None), (1024, None, "wikitext2"))
]
NEEDLE_KEYS = [
    *(MetricKey(metric) for metric in ("acc", "logprob", "gain")),
    *(MetricKey(metric, 2048) for metric in NEEDLE_METRICS if metric != "digit_acc"),
    *(MetricKey(metric, 512, depth=depth) for metric in ("acc", "gain") for depth in (0.0, 0.25, 1.0)),
    MetricKey("digit_acc", digit=3),
    MetricKey("digit_acc", 1024, digit=0),
    MetricKey("acc", 4096, variant="pi"),
    MetricKey("acc", 512, depth=0.5, corpus="c-2"),
]
SHIFT_KEYS = [
    *(MetricKey(metric, shift=kind, k=64) for kind in SHIFT_KINDS for metric in SHIFT_METRICS),
    MetricKey("kl", shift="offset", k=0, variant="ntk"),
    MetricKey("dloss", shift="context", k=256, corpus="wikitext2"),
]
WRITTEN = [  # today's strings, as results.json and runs.csv hold them
    ("loss/512", MetricKey("loss", 512)),
    ("ppl@yarn/4096", MetricKey("ppl", 4096, variant="yarn")),
    ("bpb@ntk/2048", MetricKey("bpb", 2048, variant="ntk")),
    ("position_loss@pi/4096", MetricKey("position_loss", 4096, variant="pi")),
    ("needle/acc", MetricKey("acc")),
    ("needle/gain@4096", MetricKey("gain", 4096)),
    ("needle/acc@4096/depth0.25", MetricKey("acc", 4096, depth=0.25)),
    ("needle/digit_acc/d4", MetricKey("digit_acc", digit=4)),
    ("needle/digit_acc@512/d0", MetricKey("digit_acc", 512, digit=0)),
    ("shift/offset512/kl", MetricKey("kl", shift="offset", k=512)),
    ("shift/prefix64/dloss", MetricKey("dloss", shift="prefix", k=64)),
    ("shift/context128/top1_agree", MetricKey("top1_agree", shift="context", k=128)),
    ("wikitext2:ppl/512", MetricKey("ppl", 512, corpus="wikitext2")),
]
OUTSIDE = [
    "time/ppl@512_s",
    "time/needle_s",
    "params/total",
    "params/learned/rows_trained",
    "passkey_stage/steps",
    "val_loss",
    "train/needle_loss",
    "needle/grid",
    "needle/attention",
    "curve:passkey_stage/key_loss",
    "ppl/0512",  # not the written form
    "needle/acc@512/depth0.50",
    "needle/acc@512/depth.5",
    "ppl/L",
    "perplexity/512",  # no such metric
    "needle/digit_acc@512",  # a digit accuracy names its digit
    "needle/attn_mass@512/depth0.5",  # no per-cell attention
    "needle/acc/depth0.5",  # a cell has a length
    "shift/lateral64/kl",
    "shift/offset64",
    "9corpus:ppl/512",
]


@pytest.mark.parametrize("key", PPL_KEYS + NEEDLE_KEYS + SHIFT_KEYS, ids=format_key)
def test_every_key_survives_a_round_trip(key: MetricKey) -> None:
    assert parse_key(format_key(key)) == key


@pytest.mark.parametrize(("text", "key"), WRITTEN, ids=[t for t, _ in WRITTEN])
def test_todays_strings_are_the_written_form(text: str, key: MetricKey) -> None:
    assert format_key(key) == text and parse_key(text) == key


def test_every_metric_column_of_the_committed_study_round_trips() -> None:
    """Every column of results/study/main/runs.csv that names a metric parses and is written back as it
    was, the per-window columns (`windows:KEY`) included; the others are outside the grammar."""
    with RUNS_CSV.open() as f:
        header = next(csv.reader(f))
    columns = [c.removeprefix(WINDOWS_PREFIX) for c in header]
    keys = [c for c in columns if parse_key(c) is not None]
    assert len(keys) > 200
    assert all(format_key(k) == c for c in keys if (k := parse_key(c)) is not None)
    families = (*PPL_METRICS, "needle/", "shift/")
    assert not [c for c in columns if c.startswith(families) and parse_key(c) is None]


@pytest.mark.parametrize("text", OUTSIDE)
def test_keys_outside_the_grammar_parse_to_none(text: str) -> None:
    assert parse_key(text) is None


@pytest.mark.parametrize(
    "fields",
    [
        {"metric": "ppl"},  # no length
        {"metric": "nonsense", "length": 512},
        {"metric": "ppl", "length": 512, "depth": 0.5},
        {"metric": "kl", "shift": "offset"},  # no k
        {"metric": "kl", "shift": "sideways", "k": 1},
        {"metric": "acc", "depth": 0.5},
        {"metric": "digit_acc", "length": 512},
        {"metric": "ppl", "length": 512, "variant": "a/b"},
        {"metric": "ppl", "length": 512, "corpus": "a:b"},
        {"metric": "ppl", "length": 512.0},
    ],
)
def test_a_key_outside_the_grammar_cannot_be_built(fields: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        MetricKey(**fields)  # type: ignore[arg-type]


def test_metric_key_writes_every_family() -> None:
    assert metric_key("ppl", 4096, variant="yarn") == "ppl@yarn/4096"
    assert metric_key("acc", 512, depth=0) == "needle/acc@512/depth0.0"
    assert metric_key("digit_acc", 512, digit=2) == "needle/digit_acc@512/d2"
    assert metric_key("kl", shift="offset", k=512) == "shift/offset512/kl"
    assert MetricKey("acc").family == "needle" and MetricKey("dloss", shift="prefix", k=1).family == "shift"


def test_the_helpers_select_by_metric_variant_and_corpus() -> None:
    keys = [
        "ppl/1024", "ppl/512", "ppl@pi/2048", "wikitext2:ppl/256", "ppl_tail/2048", "time/ppl@512_s",
        "needle/acc@512", "needle/acc@512/depth0.5", "needle/acc@1024/depth0.0", "needle/acc@512/depth0.0",
        "needle/digit_acc/d0", "needle/digit_acc@512/d4", "shift/offset64/kl", "shift/offset1/kl",
        "shift/prefix8/kl", "ntk_run:ppl@ntk/2048", "ppl@yarn/4096", "ppl@pi/4096",
    ]  # fmt: skip
    assert key_lengths(keys, "ppl") == [512, 1024]
    assert key_lengths(keys, "ppl", variant="pi") == [2048, 4096]
    assert key_lengths(keys, "ppl", corpus="wikitext2") == [256]
    assert key_lengths(keys, "acc") == [512]  # the one-length keys, not the cells
    assert needle_cells(keys) == [(512, 0.0), (512, 0.5), (1024, 0.0)]
    assert needle_digits(keys) == [0, 4]
    assert shift_sizes(keys, "offset", "kl") == [1, 64]
    assert key_variants(keys) == ["pi", "ntk", "yarn"]


AUDIT_WRITTEN = [  # the extrapolation audit's strings, as results.json and runs.csv hold them
    ("audit/bias_jump", MetricKey("bias_jump")),
    ("audit/bias_jump/head3", MetricKey("bias_jump", head=3)),
    ("audit/bias_end/head0", MetricKey("bias_end", head=0)),
    ("audit/bias_max_beyond/head1", MetricKey("bias_max_beyond", head=1)),
    ("audit/novelty_outside@4096", MetricKey("novelty_outside", 4096)),
    ("audit/novelty_nearest_mean@512", MetricKey("novelty_nearest_mean", 512)),
    ("audit/entropy@2048", MetricKey("entropy", 2048)),
    ("audit/distance@4096/layer3/head0", MetricKey("distance", 4096, layer=3, head=0)),
]


@pytest.mark.parametrize(("text", "key"), AUDIT_WRITTEN)
def test_audit_keys_round_trip(text: str, key: MetricKey) -> None:
    assert parse_key(text) == key and format_key(key) == text and key.family == "audit"


@pytest.mark.parametrize(
    "text",
    [
        "audit/bias_end",  # a per-head summary needs its head
        "audit/entropy@4096/layer1",  # a layer needs a head
        "audit/entropy/layer0/head0",  # attention statistics need a length
        "audit/novelty_outside@512/head1",  # novelty is per length only
        "audit/bias_jump@512",  # the bias summary has no length
        "audit/unknown@512",
    ],
)
def test_malformed_audit_keys_parse_to_none(text: str) -> None:
    assert parse_key(text) is None


def test_audit_lengths_are_the_mean_keys_not_the_per_head_ones() -> None:
    keys = ["audit/entropy@512", "audit/entropy@4096/layer0/head1", "audit/entropy@1024", "ppl/8192"]
    assert key_lengths(keys, "entropy") == [512, 1024]
    assert metric_key("entropy", 4096, layer=0, head=1) == keys[1]


def test_a_run_s_metrics_are_parsed_once_and_read_by_text_or_by_key(monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = Metrics({"ppl/512": 4.0, "ppl/4096": 9.0, "val_loss": 1.5, "wikitext2:ppl/1024": 7.0})
    assert metrics.by_key == {
        MetricKey("ppl", 512): 4.0,
        MetricKey("ppl", 4096): 9.0,
        MetricKey("ppl", 1024, corpus="wikitext2"): 7.0,
    }
    assert metrics.other == {"val_loss": 1.5}
    assert metrics["ppl/4096"] == metrics[MetricKey("ppl", 4096)] == 9.0 and MetricKey("ppl", 512) in metrics
    assert list(metrics) == ["ppl/512", "ppl/4096", "val_loss", "wikitext2:ppl/1024"]  # as given

    def no_parsing(text: str) -> None:
        raise AssertionError(f"parsed {text!r} again")

    monkeypatch.setattr("posab.keys.parse_key", no_parsing)
    assert key_lengths(metrics, "ppl") == [512, 4096] and key_corpora(metrics) == ["wikitext2"]
    with pytest.raises(AssertionError, match="parsed"):
        Metrics({"ppl/2048": 5.0})  # a new mapping is parsed, once
