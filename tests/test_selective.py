"""Selective attention (Leviathan et al., 2024; conf/encoding/selective.yaml): the layer's attention against
the paper's accumulated mask written out over all pairs in float64 (F = relu of head 0's masked logits,
BOS column zeroed, the diagonal zeroed, shifted one row, summed over rows), forward and every gradient,
from a whole window and from a block of queries after cached keys; the selections reach every head and
only later queries. (The shared suite runs selective as every encoding, cached decoding included.)"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import tiny_model
from posab.encodings.selective_kernel import Selected, Selections
from tolerances import assert_close_to_scale


def paper_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The paper's section 3 over a whole window, in float64: (B, H, T, D)."""
    length = q.shape[-2]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    logits = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    masked = logits.masked_fill(~causal, float("-inf"))
    not_bos = torch.ones(length, dtype=torch.float64).index_fill(0, torch.tensor([0]), 0.0)  # (T,)
    selected = torch.relu(masked[:, 0]) * not_bos  # F, the BOS column never masked: (B, T, T)
    selected = selected * (1 - torch.eye(length, dtype=torch.float64))  # a token does not mask itself
    selected = torch.cat([torch.zeros_like(selected[:, :1]), selected[:, :-1]], dim=1)  # only later rows
    accumulated = torch.cumsum(selected, dim=1)  # M: (B, T, T)
    weights = (masked - accumulated[:, None]).softmax(-1)
    return weights @ v.double()


@pytest.mark.parametrize("queries", [37, 12])
def test_selective_attention_is_the_papers_forward_and_backward(queries: int) -> None:
    """A window of 37 tokens (forward and every gradient), and its last 12 queries after the first 25 cached
    (their selections carried in from a first pass over those 25: the forward)."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 37, 8, generator=generator, requires_grad=True) for _ in range(3))
    upstream = torch.randn(2, 3, 37, 8, generator=generator, dtype=torch.float64)
    first = 37 - queries
    state = Selections()
    if first:
        Selected(None, state).attend(q[:, :, :first], k[:, :, :first], v[:, :, :first])
    got = Selected(state.carried, state).attend(q[:, :, first:], k, v)  # (B, H, c, D)
    (got.double() * upstream[:, :, first:]).sum().backward()
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = paper_attention(*leaves)[:, :, first:]
    (want * upstream[:, :, first:]).sum().backward()
    assert_close_to_scale(got, want, rel=1e-5)
    assert state.carried is not None and state.carried.shape == (2, 37)
    if (
        first
    ):  # the carried selections are decoding state: no gradient reaches the cached queries through them
        return
    for ours, theirs in zip((q, k, v), leaves, strict=True):
        assert ours.grad is not None and theirs.grad is not None
        assert_close_to_scale(ours.grad, theirs.grad, rel=1e-5)


def test_the_selections_change_every_head_and_only_later_queries() -> None:
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 10, 4, generator=generator) for _ in range(3))
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    selective = Selected().attend(q, k, v)
    assert_close_to_scale(selective[:, :, :2], plain[:, :, :2], rel=1e-6)  # nothing selected yet
    assert not torch.allclose(selective[:, :, 5:], plain[:, :, 5:])
    assert_close_to_scale(Selected().reference(q, k, v), selective, rel=1e-6)


def test_a_selective_model_is_causal() -> None:
    model = tiny_model("selective")
    tokens = torch.randint(0, 64, (2, 60))
    with torch.no_grad():
        whole, cut = model(tokens), model(tokens[:, :40])
    assert_close_to_scale(cut, whole[:, :40], rel=1e-5)
