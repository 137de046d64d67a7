"""The extrapolation audit (issue 28, part 1): the bias curve and its summary, the MLP's input novelty and
the attention statistics, on hand-built biases, ALiBi's closed form and every encoding's tiny model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import ENCODINGS, run_main, tiny_model, typed_config
from posab.catalog import extrapolation as extrapolation_columns
from posab.data import CorpusData
from posab.encodings.alibi import alibi_slopes
from posab.encodings.base import Dims, Encoding, Positions
from posab.encodings.cope import CoPE
from posab.encodings.fox import FoX
from posab.encodings.multiscale import MultiScale
from posab.encodings.path import PaTH
from posab.errors import ConfigError
from posab.evaluate import EvalConfig, run_evaluator
from posab.evaluate.context import EvalContext
from posab.evaluate.extrapolation import (
    ExtrapolationConfig,
    bias_pull,
    bias_summary,
    input_novelty,
    novelty_scalars,
    pull_scalars,
)
from posab.forms import LowRank, Scaled
from posab.keys import AUDIT_CONTENT_METRICS, format_key, parse_key
from posab.outputs import EvalOutput
from posab.plots import png_bytes
from posab.run.audit_backfill import backfill_run

TRAIN_LEN = 32
LENGTHS = [16, 32, 64]
CONTENT_REPORTED = {  # part 4: what the content-dependent encodings' forms (and their subclasses') report
    FoX: ("gate_log", "gate_bias_far"),
    CoPE: ("cope_count_last", "cope_count_mean", "cope_count_max", "cope_clamped"),
    PaTH: ("path_beta", "path_kept_far", "path_turn_far"),  # PaTH-FoX: and its gates' (below)
}
# Every encoding is audited alike: a bias curve exactly where it offers its bias by distance (`distance_bias`,
# which must then be the model's own bias; an additive bias without one fails), novelty exactly where it
# offers its bias MLP's inputs (`bias_features`), so a new encoding needs no entry here. These sets only
# guard what is known: each of their encodings keeps its curve, or its novelty.
# b(i - j) added to scores (DAPE: its base bias, the prior its MLP builds on)
DISTANCE_BIASED = {
    "alibi",
    "t5",
    "fire",
    "kerple",
    "multiscale",
    "hierarchical",
    "dape_alibi",
    "dape_multiscale",
}
MLP_BIASED = {"multiscale", "hierarchical", "dape_multiscale"}  # that bias is an MLP on distance features
CPU = torch.device("cpu")


@torch.no_grad()
def offers(encoding: object, reader: str) -> bool:
    """The encoding answers the audit's `reader` (`distance_bias`: its bias by distance; `bias_features`:
    its bias MLP's inputs) at distances 0 .. 63 with a tensor."""
    method = getattr(encoding, reader, None)
    return callable(method) and method(torch.arange(64.0)) is not None


@torch.no_grad()
def own_bias(encoding: Encoding, length: int) -> torch.Tensor | None:
    """The additive bias the model's own form adds over a window of `length` (one sentence, one paragraph),
    without the causal mask: (1, H, L, L), or None without one. Beside a score scale (`Scaled`) or per-sample
    factors (`LowRank`): the shared additive part, the bias by distance."""
    flat = torch.zeros(1, length, dtype=torch.long)  # (1, L) sentence and paragraph indices
    pos = Positions.build(length, sentence=flat, paragraph=flat)
    form = encoding.attention_form(pos, length, torch.float32)
    if isinstance(form, Scaled | LowRank):
        return None if form.shared is None else form.shared.dense_bias()
    return form.dense_bias()


def context(corpus: CorpusData, encoding: str, *overrides: str) -> EvalContext:
    cfg = EvalConfig(lengths=LENGTHS, progress=False, extrapolation=ExtrapolationConfig(windows=1))
    model = tiny_model(encoding, *overrides)
    return EvalContext(model, corpus.tokenizer, corpus.streams["valid"], CPU, None, TRAIN_LEN, cfg, encoding)


def audit(ctx: EvalContext) -> EvalOutput:
    return run_evaluator(ctx, "extrapolation")


def hand_built(distance: torch.Tensor) -> torch.Tensor:
    """Head 0: -d/2, lifted by 10 from d = 40 on (a jump of 9.5 past T = 32); head 1: the constant 3."""
    head0 = -0.5 * distance + 10.0 * (distance >= 40)
    return torch.stack([head0, torch.full_like(distance, 3.0)])  # (2, D)


def test_a_known_jump_past_the_training_length_is_reported_exactly(corpus: CorpusData) -> None:
    summary = bias_summary(hand_built(torch.arange(64.0)), TRAIN_LEN)
    assert summary["at_end"].tolist() == [-15.5, 3.0]
    assert summary["min_beyond"].tolist() == [-21.5, 3.0]  # d = 63: -31.5 + 10
    assert summary["max_beyond"].tolist() == [-10.0, 3.0]  # d = 40: -20 + 10
    assert summary["jump"].tolist() == [9.5, 0.0]  # b(40) - b(39) = -10 + 19.5
    assert summary["jump_rel"][0].item() == 9.5 / 15.5  # over the range inside, 0 .. -15.5
    assert math.isnan(summary["jump_rel"][1].item())  # a constant head has no range to compare with
    ctx = context(corpus, "alibi")
    ctx.model.encoding.distance_bias = hand_built  # type: ignore[assignment]
    output = audit(ctx)
    scalars = output.scalars
    assert scalars["audit/bias_jump/head0"] == 9.5 / 15.5 and math.isnan(scalars["audit/bias_jump/head1"])
    assert scalars["audit/bias_jump"] == 9.5 / 15.5  # the largest defined head
    assert (scalars["audit/bias_end/head0"], scalars["audit/bias_min_beyond/head0"]) == (-15.5, -21.5)
    assert scalars["audit/bias_max_beyond/head0"] == -10.0
    table = output.tables["extrapolation_bias"]
    assert table.columns == ["head", "at_end", "min_beyond", "max_beyond", "jump", "jump_rel"]
    assert table.rows[0] == [0, -15.5, -21.5, -10.0, 9.5, 9.5 / 15.5]


def test_alibi_beyond_the_training_length_is_its_linear_continuation(corpus: CorpusData) -> None:
    output = audit(context(corpus, "alibi"))
    arrays = output.arrays["extrapolation_bias"]
    bias, distance = torch.from_numpy(arrays["bias"]), torch.from_numpy(arrays["distance"]).double()
    assert bias.shape == (2, 64) and int(arrays["train_len"]) == TRAIN_LEN
    slopes = alibi_slopes(2).double()[:, None]  # (H, 1)
    assert torch.equal(bias, -slopes * distance)  # every distance, exactly
    step = bias[:, TRAIN_LEN - 1] - bias[:, TRAIN_LEN - 2]  # (H,): the slope inside
    continued = bias[:, TRAIN_LEN - 1 : TRAIN_LEN] + step[:, None] * (distance[TRAIN_LEN:] - (TRAIN_LEN - 1))
    assert torch.equal(bias[:, TRAIN_LEN:], continued)
    for h in range(2):
        assert output.scalars[f"audit/bias_jump/head{h}"] == pytest.approx(1 / (TRAIN_LEN - 1), rel=1e-12)


def test_the_pull_past_the_training_length_separates_a_far_spike_from_a_broad_head() -> None:
    """Head 0 local (peak 10 at d = 0, decaying), with a spike to 15 at d = 50 past T = 32: nearly all its
    bias-only attention moves there (pull ~ 1, from 64 on); head 1 flat (a broad head): pull 0; head 2
    ALiBi-like: pull < 0; the same curve clamped at T - 1: pull 0 for every head."""
    distance = torch.arange(64.0)
    local = 10.0 - 0.5 * distance + 30.0 * (distance == 50)
    curve = torch.stack([local, torch.zeros(64), -0.25 * distance])  # (3, 64)
    pull = bias_pull(curve, TRAIN_LEN, 64)
    assert pull[0] > 0.98 and pull[1] == 0 and pull[2] < 0  # e^15 against e^10 / (1 - e^-0.5) near: 0.983
    assert bias_pull(curve, TRAIN_LEN, 48)[0] < 1e-6  # the spike at 50 is not within a window of 48
    clamped = torch.cat([curve[:, :TRAIN_LEN], curve[:, TRAIN_LEN - 1 : TRAIN_LEN].expand(-1, 32)], 1)
    assert torch.equal(bias_pull(clamped, TRAIN_LEN, 64), torch.zeros(3, dtype=torch.float64))
    scalars = pull_scalars(curve, TRAIN_LEN, [16, 32, 48, 64])
    assert set(scalars) == {
        f"audit/bias_pull@{n}{h}" for n in (48, 64) for h in ("", "/head0", "/head1", "/head2")
    }
    assert scalars["audit/bias_pull@64"] == float(pull.max())


def test_novelty_is_zero_within_the_training_length_and_grows_past_it() -> None:
    """The note's raw input with tau up to 4,096: past 512 the slow features leave their training range."""
    torch.manual_seed(0)
    encoding = MultiScale(Dims(16, 2, train_len=512), num_freqs=8, max_dist=4096.0, hidden=8)
    found = input_novelty(encoding, 512, [128, 512, 1024, 2048, 4096], CPU, None)
    assert found is not None
    for length in (128, 512):
        outside, nearest = found[length]
        assert outside.shape == (16,) and nearest.shape == (length,)
        assert outside.abs().sum().item() == 0.0 and nearest.abs().sum().item() == 0.0
    past = [found[length] for length in (1024, 2048, 4096)]
    for measure in (
        [outside.mean().item() for outside, _ in past],
        [outside.max().item() for outside, _ in past],
        [nearest.max().item() for _, nearest in past],
        [nearest.mean().item() for _, nearest in past],
    ):
        assert 0 < measure[0] < measure[1] < measure[2], measure
    # the slowest sine, sin(d / 4096), leaves its range at every distance past 511: (L - 512) / L of them
    assert [outside[7].item() for outside, _ in past] == [0.5, 0.75, 0.875]


@pytest.mark.parametrize("input", ["raw", "log", "fire", "fire_held"])
def test_near_novelty_sees_the_fire_inputs_moving_the_trained_distances(input: str) -> None:
    """An input of d alone keeps every trained distance's input past T (near novelty 0 at every length);
    the FIRE input's normaliser grows past T, so each trained distance d >= 1 reads a new input there."""
    encoding = MultiScale(Dims(16, 2, train_len=512), num_freqs=8, max_dist=4096.0, hidden=8, input=input)
    lengths = [256, 512, 1024, 4096]
    found = input_novelty(encoding, 512, lengths, CPU, None)
    assert found is not None
    scalars = novelty_scalars(found, 512)
    for length in lengths:
        near = found[length][1][:512]  # (T,) or (L,) for L < T
        assert scalars[f"audit/novelty_near@{length}"] == pytest.approx(float(near.mean()), rel=1e-12)
        if input != "fire" or length <= 512:
            assert near.abs().sum().item() == 0.0
        else:  # d = 0 reads ln 1 = 0 under any normaliser; every other trained distance moved
            assert near[0].item() == 0.0 and bool((near[1:] > 0).all())
    if input == "fire":
        assert 0 < scalars["audit/novelty_near@1024"] <= scalars["audit/novelty_near@4096"]


def test_every_encoding_gets_attention_statistics_and_bias_curves_where_it_has_them(
    corpus: CorpusData, encoding: str
) -> None:
    assert DISTANCE_BIASED <= set(ENCODINGS)  # the sets name encodings of conf/encoding/
    ctx = context(corpus, encoding)
    output = audit(ctx)
    scalars, layers, heads = output.scalars, len(ctx.model.blocks), ctx.model.cfg.n_heads
    # every audit scalar is a key of posab.keys' audit family, in its one written form
    assert all(parse_key(key) is not None and format_key(parse_key(key)) == key for key in scalars)
    for length in LENGTHS:
        for layer in range(layers):
            for head in range(heads):
                assert (
                    0 <= scalars[f"audit/entropy@{length}/layer{layer}/head{head}"] <= math.log(length) + 1e-5
                )
                assert 0 <= scalars[f"audit/distance@{length}/layer{layer}/head{head}"] <= length - 1
        assert 0 <= scalars[f"audit/entropy@{length}"] <= math.log(length) + 1e-5
    assert len(output.tables["extrapolation_attention"].rows) == len(LENGTHS) * layers * heads
    means = [key[len("audit/") :].split("@") for key in scalars if "@" in key and "/layer" not in key]
    content = {(name, int(length)) for name, length in means if name in AUDIT_CONTENT_METRICS}
    reported = [names for kind, names in CONTENT_REPORTED.items() if isinstance(ctx.model.encoding, kind)]
    expected = {name: LENGTHS for names in reported for name in names}
    if isinstance(ctx.model.encoding, PaTH) and ctx.model.encoding.forget_gate:
        expected.update({name: LENGTHS for name in CONTENT_REPORTED[FoX]})
    if isinstance(ctx.model.encoding, CoPE):  # read against the pass at the training length, past it
        expected["cope_past_trained"] = [length for length in LENGTHS if length > TRAIN_LEN]
    assert content == {(name, length) for name, lengths in expected.items() for length in lengths}
    has_curve = "extrapolation_bias" in output.arrays
    assert has_curve == offers(ctx.model.encoding, "distance_bias")
    assert has_curve or encoding not in DISTANCE_BIASED
    assert ("audit/bias_jump" in scalars) == has_curve and (
        "extrapolation_bias" in output.figures
    ) == has_curve
    has_novelty = "audit/novelty_outside@64" in scalars
    assert has_novelty == offers(ctx.model.encoding, "bias_features")
    assert has_novelty or encoding not in MLP_BIASED
    row = own_bias(ctx.model.encoding, 64)
    if not has_curve:
        assert row is None  # no additive bias was left out
        return
    # the curve is the last query's row of the model's own bias: b(d) at d = 63 - j
    assert row is not None
    expected = row[0, :, -1, :].flip(-1).double()  # (H, 64)
    assert torch.equal(torch.from_numpy(output.arrays["extrapolation_bias"]["bias"]), expected)


def test_inputs_within_the_training_length_are_not_novel(corpus: CorpusData) -> None:
    scalars = audit(context(corpus, "multiscale")).scalars
    for length in (16, 32):
        assert scalars[f"audit/novelty_outside@{length}"] == 0.0
        assert scalars[f"audit/novelty_nearest@{length}"] == 0.0
    assert scalars["audit/novelty_nearest@64"] > 0


def test_the_figure_renders_and_names_the_run(corpus: CorpusData) -> None:
    figure = audit(context(corpus, "kerple")).figures["extrapolation_bias"]
    assert png_bytes(figure)[:8] == b"\x89PNG\r\n\x1a\n"
    (ax,) = figure.axes
    assert ax.get_title() == "kerple: bias by distance" and "distance" in ax.get_xlabel()
    assert [line.get_label() for line in ax.get_lines()] == ["head 0", "head 1", "training length 32"]


def test_report_columns_follow_the_keys() -> None:
    assert extrapolation_columns.report_columns(set()) == []
    keys = {
        "audit/bias_jump",
        "audit/novelty_outside@512",
        "audit/novelty_outside@4096",
        "audit/entropy@4096",
    }
    columns = extrapolation_columns.report_columns(keys)
    assert [c.key for c in columns] == ["audit/bias_jump", "audit/novelty_outside@4096", "audit/entropy@4096"]


def test_on_by_default_and_a_bad_value_is_named() -> None:
    assert typed_config().eval.extrapolation == ExtrapolationConfig(enabled=True, windows=1)
    for bad in ("0", "-2"):
        with pytest.raises(ConfigError, match=rf"eval.extrapolation.windows={bad}: use a positive integer"):
            typed_config([f"eval.extrapolation.windows={bad}"])


def test_a_run_writes_the_audit(tmp_path: Path) -> None:
    overrides = ["+experiment=tiny", "encoding=multiscale", f"data.cache_dir={tmp_path / 'cache'}"]
    results = run_main([*overrides, "train.steps=2"], tmp_path / "run")["eval"]
    assert results["audit/novelty_outside@128"] == 0.0 and "audit/bias_jump" in results
    assert "time/extrapolation_s" in results and results["audit/grid"]["lengths"] == [128, 256]
    saved = np.load(tmp_path / "run" / "extrapolation_bias.npz")
    assert saved["bias"].shape == (2, 256)
    for name in ("extrapolation_bias.png", "extrapolation_bias.csv", "extrapolation_novelty.csv"):
        assert (tmp_path / "run" / name).is_file()


def test_the_backfill_adds_the_pull_from_a_saved_curve_once_and_says_so(tmp_path: Path) -> None:
    """A run audited before the pull existed: its saved curve gives exactly the evaluator's numbers."""
    curve = hand_built(torch.arange(64.0)).double()  # (2, 64)
    np.savez(tmp_path / "extrapolation_bias.npz", distance=np.arange(64), bias=curve.numpy(), train_len=32)
    OmegaConf.save(OmegaConf.create({"eval": {"lengths": [16, 32, 64]}}), tmp_path / "config.yaml")
    (tmp_path / "results.json").write_text(json.dumps({"status": "finished", "eval": {"ppl/64": 3.0}}))
    added = backfill_run(tmp_path)
    results = json.loads((tmp_path / "results.json").read_text())
    assert added == sorted(pull_scalars(curve, TRAIN_LEN, [64])) and results["eval"]["ppl/64"] == 3.0
    assert {k: results["eval"][k] for k in added} == pull_scalars(curve, TRAIN_LEN, [64])
    assert results["backfilled"] == {"posab.run.audit_backfill": added}
    assert backfill_run(tmp_path) == []  # nothing missing the second time


def test_the_backfill_derives_the_novelty_the_evaluator_measured_from_the_checkpoint(tmp_path: Path) -> None:
    """A run whose results lack the novelty keys (made before they existed): the backfill, from its
    config and checkpoint, writes exactly the numbers its own evaluation wrote."""
    overrides = ["+experiment=tiny", "encoding=multiscale", "encoding.input=fire"]
    run = tmp_path / "run"
    measured = run_main([*overrides, f"data.cache_dir={tmp_path / 'cache'}", "train.steps=2"], run)["eval"]
    assert measured["audit/novelty_near@256"] > 0 and measured["audit/novelty_near@128"] == 0.0
    results = json.loads((run / "results.json").read_text())
    novelty = {k: results["eval"].pop(k) for k in list(results["eval"]) if k.startswith("audit/novelty_")}
    (run / "results.json").write_text(json.dumps(results))
    added = backfill_run(run)
    backfilled = json.loads((run / "results.json").read_text())
    assert added == sorted(novelty) and {k: backfilled["eval"][k] for k in added} == novelty
    assert backfilled["backfilled"] == {"posab.run.audit_backfill": added}
