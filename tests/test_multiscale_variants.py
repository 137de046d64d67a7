"""The design-space options of the multi-scale bias (note section 3.3) through the shared checks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from conftest import run_main, tiny_model
from posab.encodings import Dims, Positions
from posab.encodings.hierarchical import Hierarchical
from posab.encodings.multiscale import MultiScale
from posab.errors import ConfigError
from posab.forms import Additive, Scaled
from posab.report.rundirs import load_run
from posab.run.reevaluation import reevaluate
from tolerances import EPS32, assert_close_to_scale, scale_of

VARIANTS = [
    ["encoding.spacing=linear"],
    ["encoding.input=log"],
    ["encoding.input=fire"],
    ["encoding.input=fire_held"],
    ["encoding.form=multiplicative"],
    ["encoding.input=fire", "encoding.form=multiplicative", "encoding.num_freqs=8"],
    ["encoding.clamp=train"],
]


def batch(length: int) -> torch.Tensor:
    return torch.randint(0, 256, (2, length), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(v))
@torch.no_grad()
def test_variant_is_causal_and_runs_at_eight_times_the_training_length(variant: list[str]) -> None:
    model = tiny_model("multiscale", *variant)
    tokens = batch(40)
    changed = tokens.clone()
    changed[:, 21:] = (changed[:, 21:] + 5) % 256
    # float32 rounding at most (later keys weigh exactly 0): 1e-5 = 84 EPS32 of the logits' scale, while a
    # leak of the changed tokens is ~1e-1 of it
    assert_close_to_scale(model(changed)[:, :21], model(tokens)[:, :21], rel=1e-5)
    long = model(batch(8 * 128))  # the tiny preset trains at 128
    assert long.shape == (2, 1024, 260) and torch.isfinite(long).all()


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(v))
@torch.no_grad()
def test_offset_invariance_follows_the_input_transform(variant: list[str]) -> None:
    model = tiny_model("multiscale", *variant)
    tokens = batch(32)
    base = model(tokens)
    inside = model(tokens, offset=50)  # every position below the training length (128)
    # invariance up to float32 rounding: 1e-5 = 84 EPS32 of the logits' scale
    assert_close_to_scale(inside, base, rel=1e-5)
    beyond = model(tokens, offset=1000)
    if model.encoding.relative_only:
        assert_close_to_scale(beyond, base, rel=1e-5)
    else:  # FIRE-style input: normalised by the query position past the training length (observed ~1e-2)
        assert (base - beyond).abs().max() > 1e-4 * scale_of(base)


def test_multiplicative_form_starts_as_the_additive_one() -> None:
    torch.manual_seed(0)
    additive = MultiScale(Dims(32, 4, 64, 512), num_freqs=8, hidden=16)
    torch.manual_seed(0)
    multiplicative = MultiScale(Dims(32, 4, 64, 512), num_freqs=8, hidden=16, form="multiplicative")
    pos = Positions.build(20)
    form = multiplicative.attention_form(pos, 20, torch.float32)
    assert isinstance(form, Scaled) and form.shared is not None
    # the same seed, the same MLP and the same float32 computation: equal up to an ulp at most; the gate
    # starts at exactly 1 (its last layer is zero)
    assert_close_to_scale(form.shared.dense_bias(), additive.dense_bias(pos), rel=4 * EPS32)
    torch.testing.assert_close(form.scale, torch.ones(1, 4, 20, 20), rtol=0, atol=0)
    assert isinstance(additive.attention_form(pos, 20, torch.float32), Additive)  # no score scale


def test_fire_input_per_query_equals_the_distance_table_below_the_training_length() -> None:
    torch.manual_seed(0)
    enc = MultiScale(Dims(32, 4, 64, 512), num_freqs=8, hidden=16, input="fire")
    pos = Positions.build(30, offset=10)
    per_query = enc._query_normalised(enc.distance_mlp, pos, 30)  # (H, L, L)
    lower = torch.ones(30, 30).tril().bool()
    # two float32 paths to the same inputs (log1p(d) / log1p(L_train) * L_max, the normaliser a tensor or a
    # Python float) through the same MLP: equal here, an ulp or so apart at most through the MLP;
    # 1e-5 = 84 EPS32 of the bias's scale, while a wrong normaliser is ~1e-1 of it
    assert_close_to_scale(per_query[:, lower], enc.dense_bias(pos)[0][:, lower], rel=1e-5)


@torch.no_grad()
def test_the_held_fire_input_is_fire_below_the_training_length_and_its_training_input_past_it() -> None:
    """`fire_held`, L_train = 16: the same bias as `fire` at every query below 16 (training's), and past it
    the MLP on ln(1 + d) / ln(1 + 16) * L_max, the input training gave each trained distance."""
    dims = Dims(32, 4, 16)
    torch.manual_seed(0)
    fire = MultiScale(dims, num_freqs=8, hidden=16, input="fire")
    torch.manual_seed(0)
    held = MultiScale(dims, num_freqs=8, hidden=16, input="fire_held")
    assert held.relative_only and held.static_form and not fire.relative_only
    inside = Positions.build(16)
    assert torch.equal(held.dense_bias(inside), fire.dense_bias(inside))
    last = held.dense_bias(Positions.build(40))[0][:, 39, :]  # (H, L): query 39, key j at distance 39 - j
    distance = torch.arange(39.0, -1.0, -1.0)  # (L,)
    expected = held.distance_mlp(torch.log1p(distance) / math.log1p(16) * held.max_dist)  # (H, L)
    assert torch.equal(last, expected)
    assert not torch.allclose(fire.dense_bias(Positions.build(40))[0][:, 39, :], last)


def test_log_spacing_and_linear_spacing() -> None:
    log = MultiScale(Dims(32, 4), num_freqs=4, max_dist=1000.0).distance_mlp.taus
    linear = MultiScale(Dims(32, 4), num_freqs=4, max_dist=1000.0, spacing="linear").distance_mlp.taus
    torch.testing.assert_close(log, torch.tensor([1.0, 10.0, 100.0, 1000.0]))
    torch.testing.assert_close(linear, torch.tensor([1.0, 334.0, 667.0, 1000.0]))


@torch.no_grad()
def test_a_clamp_gives_every_distance_past_it_the_bias_at_it() -> None:
    """clamp=train, L_train = 16: b(d) = b(15) for every d >= 15, b(d) unchanged below (the same weights)."""
    torch.manual_seed(0)
    clamped = MultiScale(Dims(32, 4, 16), num_freqs=8, hidden=16, clamp="train")
    torch.manual_seed(0)
    free = MultiScale(Dims(32, 4, 16), num_freqs=8, hidden=16)
    assert clamped.clamp == 15 and free.clamp is None
    last = clamped.dense_bias(Positions.build(40))[0][:, 39, :]  # (H, L): query 39, key j at distance 39 - j
    assert (last[:, :25] == last[:, 24:25]).all()  # distances 39 .. 15 (keys 0 .. 24): one value each head
    unclamped = free.dense_bias(Positions.build(40))[0][:, 39, :]
    assert torch.equal(last[:, 24:], unclamped[:, 24:])  # distances 15 .. 0: the same MLP on the same inputs
    assert not torch.equal(last[:, :24], unclamped[:, :24])
    curve = clamped.distance_bias(torch.arange(40.0))  # (H, 40), as the extrapolation audit reads it
    assert (curve[:, 15:] == curve[:, 15:16]).all()
    assert MultiScale(Dims(32, 4, 16), num_freqs=8, hidden=16, clamp=7).clamp == 7


@pytest.mark.parametrize("bad", [0, -3, "all", 2.5, True])
def test_a_bad_clamp_names_the_value_and_what_is_valid(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"multiscale clamp=.*null, 'train' \(L_train - 1\) or a distance"):
        MultiScale(Dims(32, 4, 16), clamp=bad)  # type: ignore[arg-type]


@torch.no_grad()
def test_the_hierarchical_clamp_holds_its_token_level_and_leaves_the_structure_levels() -> None:
    """clamp=train on the hierarchical bias (issue 28's arm on its token level), L_train = 16: the token
    level's b(d) = b(15) past 15, the same weights below; the sentence and paragraph factors unchanged."""
    dims = Dims(32, 4, 16)
    torch.manual_seed(0)
    clamped = Hierarchical(dims, num_freqs=8, hidden=16, clamp="train")
    torch.manual_seed(0)
    free = Hierarchical(dims, num_freqs=8, hidden=16)
    curve, free_curve = clamped.distance_bias(torch.arange(40.0)), free.distance_bias(torch.arange(40.0))
    assert (curve[:, 15:] == curve[:, 15:16]).all() and torch.equal(curve[:, :16], free_curve[:, :16])
    assert not torch.equal(curve[:, 16:], free_curve[:, 16:])
    units = torch.arange(40)[None] // 5  # (1, L): a sentence every 5 tokens, a paragraph every 10
    pos = Positions.build(40, sentence=units, paragraph=units // 2)
    factors, free_factors = clamped.bias_factors(pos, 40), free.bias_factors(pos, 40)
    assert torch.equal(factors.dense(), free_factors.dense())
    with pytest.raises(ConfigError, match=r"hierarchical clamp=0: use null"):
        Hierarchical(dims, clamp=0)


@pytest.mark.parametrize("encoding", ["multiscale", "hierarchical"])
def test_a_clamp_is_evaluated_on_a_trained_run_as_a_run_of_its_own(tmp_path: Path, encoding: str) -> None:
    """The clamp at L_train - 1 never acts in training, so `reevaluate(..., as_run=True)` turns a run into
    the clamp arm's run: its own record, the clamp in its config, the same numbers at L_train, a bias held
    at b(L_train - 1) past it; a clamp that would have acted in training is refused, nothing written."""
    unclamped = ["encoding.clamp=null", "eval.needle.enabled=false"]  # multiscale's default clamps
    trained = run_main(["+experiment=tiny", f"encoding={encoding}", *unclamped], tmp_path / "run")
    out = tmp_path / "clamped"
    reevaluate(tmp_path / "run", ["encoding.clamp=train"], out, as_run=True)
    record = json.loads((out / "results.json").read_text())
    assert OmegaConf.load(out / "config.yaml").encoding.clamp == "train"
    assert record["val_loss"] == trained["val_loss"] and record["reevaluated"]["from"] == "run"
    assert record["overrides"].endswith("encoding.clamp=train")
    assert record["eval"]["ppl/128"] == pytest.approx(trained["eval"]["ppl/128"], rel=1e-6)
    for head in range(2):  # the tiny model's heads: b(d) = b(127) for every d past 127
        key = f"audit/bias_{{}}/head{head}"
        assert record["eval"][key.format("min_beyond")] == record["eval"][key.format("max_beyond")]
        assert trained["eval"][key.format("min_beyond")] != trained["eval"][key.format("max_beyond")]
    assert load_run(out).config["encoding.clamp"] == "train"  # the report reads it as a run
    with pytest.raises(ConfigError, match="would have changed training"):
        reevaluate(tmp_path / "run", ["encoding.clamp=8"], tmp_path / "refused", as_run=True)
    with pytest.raises(ConfigError, match="inside"):
        reevaluate(tmp_path / "run", ["encoding.clamp=train"], tmp_path / "run" / "eval", as_run=True)
    assert not (tmp_path / "refused").exists() and not (tmp_path / "run" / "eval").exists()


def test_the_fire_normaliser_is_held_on_a_trained_run_as_a_run_of_its_own(tmp_path: Path) -> None:
    """`fire` and `fire_held` agree at every query below the training length, so a `fire` run re-evaluated
    with `fire_held` is that arm's run (the same weights): the same numbers at L_train, and past it the
    trained distances keep their inputs (the audit's novelty_near 0); another input is refused."""
    trained = run_main(
        ["+experiment=tiny", "encoding=multiscale", "encoding.input=fire", "eval.needle.enabled=false"],
        tmp_path / "run",
    )
    out = tmp_path / "held"
    reevaluate(tmp_path / "run", ["encoding.input=fire_held"], out, as_run=True)
    record = json.loads((out / "results.json").read_text())
    assert OmegaConf.load(out / "config.yaml").encoding.input == "fire_held"
    assert record["val_loss"] == trained["val_loss"]
    assert record["eval"]["ppl/128"] == pytest.approx(trained["eval"]["ppl/128"], rel=1e-6)
    assert trained["eval"]["audit/novelty_near@256"] > 0 and record["eval"]["audit/novelty_near@256"] == 0.0
    with pytest.raises(ConfigError, match=r"encoding.input 'fire' -> 'log' would have changed training"):
        reevaluate(tmp_path / "run", ["encoding.input=log"], tmp_path / "refused", as_run=True)
    assert not (tmp_path / "refused").exists()
