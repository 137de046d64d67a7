"""A layer's decoding state (`posab.cache.LayerCache`) is typed and reaches `Encoding.layer_form` with the
cached keys (issue 57): an encoding keeps its own state there by type, and a method that rewrites every
cached key at each step (as PaTH does) needs no change to the model."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

from conftest import tiny_model
from posab.cache import EncodingState, KVCache, LayerCache
from posab.encodings.base import Encoding, Positions
from posab.forms import Form


@dataclass
class Count(EncodingState):
    steps: int = 0


@dataclass
class Other(EncodingState):
    value: float = 0.0


def test_a_layer_keeps_one_typed_state_made_on_first_use() -> None:
    cache = LayerCache()
    assert cache.encoding_state is None
    cache.state_for(Count).steps += 1
    cache.state_for(Count).steps += 1
    assert cache.state_for(Count) == Count(steps=2)
    with pytest.raises(TypeError, match="holds a Count, not a Other"):
        cache.state_for(Other)


def test_rewriting_the_cached_keys_rewrites_what_the_next_step_sees() -> None:
    cache = LayerCache()
    cache.extend(torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4))
    keys, _ = cache.cached()
    keys.mul_(0.5)  # in place, as an encoding's layer_form may
    every, _ = cache.extend(torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4))
    assert every.shape == (1, 2, 4, 4) and torch.equal(every[:, :, :3], torch.full((1, 2, 3, 4), 0.5))


class ZeroedKeysInTheCache(Encoding):
    """Every cached key set to 0 at each decoding step, in `layer_form`: attention then averages the values
    it sees, as a full forward pass whose keys `rotate` zeroes does."""

    def layer_form(
        self, form: Form, layer: int, x: Tensor | None = None, cache: LayerCache | None = None
    ) -> Form:
        if cache is not None:
            cache.cached()[0].zero_()
            cache.state_for(Count).steps += 1
        return form


class ZeroedKeys(Encoding):
    def rotate(self, q: Tensor, k: Tensor, pos: Positions, layer: int = 0) -> tuple[Tensor, Tensor]:
        return q, torch.zeros_like(k)


def test_an_encoding_that_rewrites_cached_keys_decodes_as_its_full_forward_pass() -> None:
    model = tiny_model("nope")
    tokens = torch.randint(0, 200, (2, 12), generator=torch.Generator().manual_seed(0))
    model.encoding = ZeroedKeys(model.encoding.dims)
    with torch.no_grad():
        full = model(tokens)  # (B, T, V)
        model.encoding = ZeroedKeysInTheCache(model.encoding.dims)
        cache = KVCache()
        steps = [model(tokens[:, :5], cache=cache)] + [
            model(tokens[:, t : t + 1], cache=cache) for t in range(5, 12)
        ]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    assert all(layer.state_for(Count).steps == 8 for layer in cache.layers)  # one prefill, seven steps
