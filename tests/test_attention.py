"""The fast attention paths against slow references, on tiny shapes."""

from __future__ import annotations

import math

import pytest
import torch

from posab.attention import QUERY_CHUNK, BiasedAttention, attention, causal_mask
from posab.encodings import Dims, Positions
from posab.encodings.hierarchical import TableGather
from posab.encodings.rope import RoPE


def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + mask  # (B, H, T, T)
    return torch.softmax(scores, dim=-1) @ v


def random_inputs(batch: int, mask_batch: int, length: int, dtype: torch.dtype = torch.float64):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, 3, length, 8, generator=g, dtype=dtype).requires_grad_() for _ in range(3))
    bias = torch.randn(mask_batch, 3, length, length, generator=g, dtype=dtype).requires_grad_()
    return q, k, v, bias


@pytest.mark.parametrize("mask_batch", [1, 2])
@pytest.mark.parametrize("length", [5, QUERY_CHUNK + 7])
def test_biased_attention_gradients_equal_the_reference(mask_batch: int, length: int) -> None:
    q, k, v, bias = random_inputs(2, mask_batch, length, torch.float32)
    grad_out = torch.randn(2, 3, length, 8)
    results = []
    for fn in (BiasedAttention.apply, explicit_attention):
        for t in (q, k, v, bias):
            t.grad = None
        mask = bias + causal_mask(length, bias.device)
        out = fn(q, k, v, mask)
        out.backward(grad_out)
        results.append([out.detach(), *(t.grad.clone() for t in (q, k, v, bias))])
    for fast, slow in zip(*results, strict=True):
        torch.testing.assert_close(fast, slow, rtol=1e-4, atol=1e-5)


def test_attention_picks_the_path_and_matches_explicit_softmax() -> None:
    q, k, v, bias = random_inputs(2, 1, 9, torch.float32)
    mask = bias + causal_mask(9, bias.device)
    expected = explicit_attention(q, k, v, mask)
    torch.testing.assert_close(attention(q, k, v, mask), expected, rtol=1e-5, atol=1e-5)  # learned bias
    torch.testing.assert_close(attention(q, k, v, mask.detach()), expected, rtol=1e-5, atol=1e-5)  # constant
    no_bias = explicit_attention(q, k, v, causal_mask(9, q.device))
    torch.testing.assert_close(attention(q, k, v, None), no_bias, rtol=1e-5, atol=1e-5)


def test_biased_attention_in_bf16_is_close_to_fp32() -> None:
    q, k, v, bias = random_inputs(2, 1, 40, torch.float32)
    mask = bias + causal_mask(40, bias.device)
    fp32 = BiasedAttention.apply(q, k, v, mask)
    bf16 = BiasedAttention.apply(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask)
    torch.testing.assert_close(bf16.float(), fp32, rtol=0.05, atol=0.05)


def test_table_gather_gradient_equals_indexing() -> None:
    g = torch.Generator().manual_seed(0)
    table = torch.randn(3, 11, generator=g, requires_grad=True)
    index = torch.randint(0, 11, (2, 6, 6), generator=g)
    grad = torch.randn(2, 3, 6, 6, generator=g)
    TableGather.apply(table, index).backward(grad)
    fast = table.grad.clone()
    table.grad = None
    reference = table[:, index].permute(1, 0, 2, 3)
    torch.testing.assert_close(TableGather.apply(table, index), reference)
    reference.backward(grad)
    torch.testing.assert_close(fast, table.grad)


def test_rope_matches_the_rotation_formula_and_cached_tables_honour_offsets() -> None:
    rope = RoPE(Dims(d_model=8, n_heads=1), base=100.0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1, 5, 8, generator=g)
    positions = torch.arange(3, 8)
    q, _ = rope.rotate(x, x, Positions(token=torch.arange(1000, 1005)))  # grows the cache past 8 first
    q, _ = rope.rotate(x, x, Positions(token=positions))
    theta = 100.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)  # (4,)
    angle = positions[:, None].double() * theta[None, :]  # (5, 4)
    pairs = torch.complex(x[0, 0, :, :4].double(), x[0, 0, :, 4:].double())  # (x_c, x_{c+4}) as complex
    rotated = pairs * torch.polar(torch.ones_like(angle), angle)
    expected = torch.cat([rotated.real, rotated.imag], dim=-1).float()
    torch.testing.assert_close(q[0, 0], expected, rtol=1e-5, atol=1e-5)
    fresh = RoPE(Dims(d_model=8, n_heads=1), base=100.0)
    torch.testing.assert_close(fresh.rotate(x, x, Positions(token=positions))[0], q)


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["nope", "alibi", "hierarchical"])
def test_flex_attention_equals_sdpa_in_evaluation(encoding: str) -> None:
    """FlexAttention (compiled; tens of seconds on the CPU the first time) gives the SDPA logits."""
    from conftest import tiny_model

    sdpa, flex = tiny_model(encoding), tiny_model(encoding, "model.attention=flex")
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (2, 96), generator=g)
    sentence = torch.cumsum(torch.rand(2, 96, generator=g) < 0.1, dim=1)
    with torch.inference_mode():
        torch.testing.assert_close(
            flex(tokens, sentence, sentence // 4), sdpa(tokens, sentence, sentence // 4)
        )


def test_mask_is_cached_per_length_in_evaluation_and_cleared_by_training() -> None:
    from conftest import tiny_model

    model = tiny_model("multiscale")
    tokens = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        first = model(tokens)
        assert len(model._mask_cache) == 1
        assert torch.equal(model(tokens), first)
    with torch.no_grad():
        model.encoding.distance_mlp.mlp[-1].weight.mul_(3.0)  # as a training step changes the bias
    model.train()
    assert not model._mask_cache
    model.eval()
    with torch.inference_mode():
        assert (model(tokens) - first).abs().max() > 1e-4
