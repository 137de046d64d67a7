"""Cached decoding equals the full forward pass, for every encoding and every form: the logits of each
decoding step (token by token and by blocks), from a prompt shorter and one longer than the training
length, at position offsets, are the full forward's at those positions to 1e-5 of their scale (fp32).

This is where relative biases break in peer libraries (a bias zeroed or dropped at decode steps, a bias
built for the wrong query rows); here each step's form is built from the positions of every key."""

from __future__ import annotations

import pytest
import torch

from conftest import CASES, text_like, tiny_model
from posab.cache import KVCache
from posab.errors import ConfigError
from posab.model import DecoderLM
from tolerances import assert_close_to_scale


@torch.no_grad()
def cached_logits(model: DecoderLM, batch: tuple, prompt: int, block: int, offset: int) -> torch.Tensor:
    """The logits of a prompt of `prompt` tokens, then of every later token in blocks of `block`, each
    call adding to one cache: (2, T, V)."""
    tokens, sentence, paragraph = batch
    cache = KVCache()
    steps = [
        model(tokens[:, :prompt], sentence[:, :prompt], paragraph[:, :prompt], offset=offset, cache=cache)
    ]
    for start in range(prompt, tokens.shape[1], block):
        end = start + block
        steps.append(
            model(tokens[:, start:end], sentence[:, start:end], paragraph[:, start:end], cache=cache)
        )
    assert cache.length == tokens.shape[1]
    return torch.cat(steps, dim=1)


@pytest.mark.parametrize(("encoding", "override"), CASES)
@pytest.mark.parametrize(("prompt", "block", "offset"), [(64, 1, 0), (200, 1, 37), (200, 7, 0)])
def test_cached_decoding_equals_the_full_forward(
    encoding: str, override: str | None, prompt: int, block: int, offset: int
) -> None:
    """Prompts of 64 and 200 tokens (the training length is 128), 12 more tokens one at a time or 14 in
    blocks of 7. Float32 rounding only: the cached step sums the same terms over the same keys in another
    order (an explicit softmax against the fused kernel), observed <= 5e-7 of the logits' scale; 1e-5 =
    84 EPS32, while a bias built for the wrong rows, dropped or zeroed is ~1e-2 of it or more."""
    model = tiny_model(encoding, *([override] if override else []))
    batch = text_like(prompt + (12 if block == 1 else 14), seed=prompt + offset)
    with torch.no_grad():
        full = model(*batch, offset=offset)  # (2, T, V)
    assert_close_to_scale(cached_logits(model, batch, prompt, block, offset), full, rel=1e-5)


def test_a_wrong_bias_in_a_step_would_fail() -> None:
    """The test above can fail: ALiBi's cached steps given the rows of the queries one position earlier
    (a form built for c + 1 queries, its first c rows read) differ from the full forward by far more."""
    model = tiny_model("alibi")
    batch = text_like(76)
    with torch.no_grad():
        full = model(*batch)
    original = model.encoding.attention_form

    def rows_one_early(pos, queries, dtype):  # type: ignore[no-untyped-def]
        return original(pos, queries + (queries < pos.length), dtype)

    model.encoding.attention_form = rows_one_early  # type: ignore[method-assign]
    with pytest.raises(AssertionError, match="ratio"):
        assert_close_to_scale(cached_logits(model, batch, 64, 1, 0), full, rel=1e-5)


def test_an_offset_that_breaks_the_cache_is_refused() -> None:
    model = tiny_model("alibi")
    tokens, sentence, paragraph = text_like(10)
    cache = KVCache()
    with torch.no_grad():
        model(tokens[:, :8], offset=5, cache=cache)
        with pytest.raises(ConfigError, match="next token is at 13"):
            model(tokens[:, 8:], offset=20, cache=cache)
        assert model(tokens[:, 8:], offset=13, cache=cache).shape[:2] == (2, 2)
        assert cache.positions is not None and cache.positions.last == 14


def test_the_cache_grows_by_doubling_and_holds_every_key() -> None:
    """One token at a time, 40 times after a 10-token prompt: each layer's buffer holds exactly the keys
    and values fed in, in order, and its capacity is at most twice the cached length."""
    cache = KVCache()
    layer = cache.layer(0)
    g = torch.Generator().manual_seed(0)
    fed = [torch.randn(2, 3, 10, 4, generator=g)] + [torch.randn(2, 3, 1, 4, generator=g) for _ in range(40)]
    for chunk in fed:
        keys, values = layer.extend(chunk, -chunk)
    assert torch.equal(keys, torch.cat(fed, dim=2)) and torch.equal(values, -keys)
    assert layer.length == 50 and 50 <= layer.keys.shape[2] <= 100
