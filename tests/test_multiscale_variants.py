"""The design-space options of the multi-scale bias (note section 3.3) through the shared checks."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from posab.encodings import Dims, Positions
from posab.encodings.multiscale import MultiScale

VARIANTS = [
    ["encoding.spacing=linear"],
    ["encoding.input=log"],
    ["encoding.input=fire"],
    ["encoding.form=multiplicative"],
    ["encoding.input=fire", "encoding.form=multiplicative", "encoding.num_freqs=8"],
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
    torch.testing.assert_close(model(tokens)[:, :21], model(changed)[:, :21], rtol=0, atol=1e-5)
    long = model(batch(8 * 128))  # the tiny preset trains at 128
    assert long.shape == (2, 1024, 260) and torch.isfinite(long).all()


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(v))
@torch.no_grad()
def test_offset_invariance_follows_the_input_transform(variant: list[str]) -> None:
    model = tiny_model("multiscale", *variant)
    tokens = batch(32)
    inside = model(tokens, offset=50)  # every position below the training length (128)
    torch.testing.assert_close(model(tokens), inside, rtol=0, atol=1e-5)
    beyond = model(tokens, offset=1000)
    if model.encoding.relative_only:
        torch.testing.assert_close(model(tokens), beyond, rtol=0, atol=1e-5)
    else:  # FIRE-style input: normalised by the query position past the training length
        assert (model(tokens) - beyond).abs().max() > 1e-6


def test_multiplicative_form_starts_as_the_additive_one() -> None:
    torch.manual_seed(0)
    additive = MultiScale(Dims(32, 4, 64, 512), num_freqs=8, hidden=16)
    torch.manual_seed(0)
    multiplicative = MultiScale(Dims(32, 4, 64, 512), num_freqs=8, hidden=16, form="multiplicative")
    pos = Positions.build(20)
    torch.testing.assert_close(multiplicative.bias(pos), additive.bias(pos))
    torch.testing.assert_close(multiplicative.score_scale(pos), torch.ones(1, 4, 20, 20))
    assert additive.score_scale(pos) is None


def test_fire_input_per_query_equals_the_distance_table_below_the_training_length() -> None:
    torch.manual_seed(0)
    enc = MultiScale(Dims(32, 4, 64, 512), num_freqs=8, hidden=16, input="fire")
    pos = Positions.build(30, offset=10)
    per_query = enc._query_normalised(enc.distance_mlp, pos)  # (H, L, L)
    lower = torch.ones(30, 30).tril().bool()
    torch.testing.assert_close(per_query[:, lower], enc.bias(pos)[0][:, lower])


def test_log_spacing_and_linear_spacing() -> None:
    log = MultiScale(Dims(32, 4), num_freqs=4, max_dist=1000.0).distance_mlp.taus
    linear = MultiScale(Dims(32, 4), num_freqs=4, max_dist=1000.0, spacing="linear").distance_mlp.taus
    torch.testing.assert_close(log, torch.tensor([1.0, 10.0, 100.0, 1000.0]))
    torch.testing.assert_close(linear, torch.tensor([1.0, 334.0, 667.0, 1000.0]))
