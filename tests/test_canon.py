"""Canon layers (`model.canon`, Allen-Zhu 2025; issue 59): a layer against the reference's causal depthwise
convolution (nn.Conv1d, left-padded) in float64, forward and every gradient; cached decoding keeps each
layer's last inputs, so with every encoding and Canon at all four places the steps equal the full forward
and the future never reaches the past; bad options name what is valid; a run trains with them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_cache_equivalence import cached_logits

from conftest import ENCODINGS, run_main, text_like, tiny_model, typed_config
from posab.cache import LayerCache
from posab.errors import ConfigError
from posab.layers import Canon
from tolerances import assert_close_to_scale

CANON = "model.canon=ABCD"


def reference_canon(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The reference's ShortConvolution without activation, plus the residual, in float64: x (B, T, C)."""
    kernel = weight.shape[-1]
    mixed = F.conv1d(x.double().transpose(1, 2), weight.double(), padding=kernel - 1, groups=x.shape[-1])
    return x.double() + mixed[..., : x.shape[1]].transpose(1, 2)  # (B, C, T + K - 1) -> (B, T, C)


def test_a_canon_layer_is_the_references_convolution_forward_and_backward() -> None:
    canon = Canon(channels=6, place="A")
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 11, 6, generator=generator, requires_grad=True)
    upstream = torch.randn(2, 11, 6, generator=generator, dtype=torch.float64)
    (canon(x).double() * upstream).sum().backward()
    leaves = [t.detach().double().requires_grad_() for t in (x, canon.weight)]
    (reference_canon(*leaves) * upstream).sum().backward()
    assert_close_to_scale(canon(x), reference_canon(*leaves), rel=1e-6)
    for ours, theirs in zip((x, canon.weight), leaves, strict=True):
        assert ours.grad is not None and theirs.grad is not None
        assert_close_to_scale(ours.grad, theirs.grad, rel=1e-6)
    bound = 1 / math.sqrt(4)  # nn.Conv1d's initialisation
    assert canon.weight.shape == (6, 1, 4) and float(canon.weight.detach().abs().max()) <= bound


def test_in_steps_a_canon_layer_keeps_its_last_inputs() -> None:
    canon, cache = Canon(channels=3, place="C"), LayerCache()
    x = torch.randn(1, 9, 3)
    steps = torch.cat([canon(x[:, :5], cache), canon(x[:, 5:6], cache), canon(x[:, 6:], cache)], dim=1)
    assert torch.equal(cache.recent["C"], x[:, -3:])
    assert_close_to_scale(steps, canon(x), rel=1e-6)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_with_every_encoding_canon_decodes_cached_alike_and_causally(encoding: str) -> None:
    model = tiny_model(encoding, CANON)
    batch = text_like(150, seed=2)
    with torch.no_grad():
        full = model(*batch)  # (2, T, V)
        cut = model(*(t[:, :90] for t in batch))
    assert_close_to_scale(cached_logits(model, batch, 138, 1, 0), full, rel=1e-5)
    assert_close_to_scale(cached_logits(model, batch, 130, 7, 0), full, rel=1e-5)
    assert_close_to_scale(cut, full[:, :90], rel=1e-5)


def test_the_places_hold_layers_of_their_widths() -> None:
    model = tiny_model("nope", CANON)
    block, width = model.blocks[0], model.cfg.d_model
    assert block.canon_a is not None and block.canon_a.weight.shape[0] == width
    assert block.attn.canon is not None and block.attn.canon.weight.shape[0] == 3 * width
    assert block.canon_c is not None and block.canon_c.weight.shape[0] == width
    assert block.mlp.canon is not None and block.mlp.canon.weight.shape[0] == model.cfg.mlp_ratio * width
    plain = tiny_model("nope").blocks[0]
    assert plain.canon_a is None and plain.attn.canon is None and plain.mlp.canon is None


@pytest.mark.parametrize(
    ("override", "message"),
    [("model.canon=AE", "from ABCD"), ("model.canon=AA", "at most once"), ("model.canon_kernel=1", ">= 2")],
)
def test_bad_canon_options_name_what_is_valid(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        typed_config(["+experiment=tiny", override])


def test_a_run_trains_with_canon_layers(tmp_path: Path) -> None:
    overrides = [
        "+experiment=tiny",
        "model.canon=AC",
        "train.steps=4",
        "train.val_every=2",
        "train.checkpoint_every=4",
        "eval.progress=false",
        "train.progress=false",
    ]
    results = run_main(overrides, tmp_path)
    assert results["status"] == "finished" and math.isfinite(results["val_loss"])
