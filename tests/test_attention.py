"""The fast attention paths against slow references, on tiny shapes."""

from __future__ import annotations

import math

import pytest
import torch

from posab.attention import QUERY_CHUNK, BiasedAttention, attention, causal_mask
from posab.encodings import BiasFactors, Dims, Positions
from posab.encodings.rope import RoPE
from tolerances import EPS32, EPS_BF16, assert_close_to_scale


def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + mask  # (B, H, T, T)
    return torch.softmax(scores, dim=-1) @ v


def float64(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Float64 copies, leaves of their own graph (a reference computed from the same values)."""
    return [t.detach().double().requires_grad_(t.requires_grad) for t in tensors]


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
    # the fast path in float32 against the explicit softmax in float64 on the same values
    paths = ((BiasedAttention.apply, (q, k, v, bias)), (explicit_attention, float64(q, k, v, bias)))
    for fn, inputs in paths:
        mask = inputs[3] + causal_mask(length, bias.device).to(inputs[3].dtype)
        out = fn(*inputs[:3], mask)
        out.backward(grad_out.to(out.dtype))
        results.append([out.detach(), *(t.grad for t in inputs)])
    # float32 sums over <= L = 71 keys and 8 channels (and the batch, for a shared mask): observed up to
    # ~1e-6 of each tensor's largest entry; 1e-5 = 84 EPS32; a wrong chunk boundary or term is ~1e-1.
    for name, fast, slow in zip(("out", "dq", "dk", "dv", "dbias"), *results, strict=True):
        assert_close_to_scale(fast, slow, rel=1e-5, msg=name)


@pytest.mark.parametrize("length", [5, QUERY_CHUNK + 7])
def test_causal_attention_in_training_equals_the_reference(length: int) -> None:
    """Without a mask, training on the CPU takes BiasedAttention's backward with the causal mask alone:
    the explicit causal softmax's output and gradients."""
    q, k, v, _ = random_inputs(2, 1, length, torch.float32)
    grad_out = torch.randn(2, 3, length, 8)
    results = []
    for path in ("fast", "explicit"):
        inputs = [q, k, v] if path == "fast" else float64(q, k, v)
        if path == "fast":
            out = attention(*inputs, None)
            assert out.grad_fn is not None and "BiasedAttention" in type(out.grad_fn).__name__
        else:
            out = explicit_attention(*inputs, causal_mask(length, q.device).double())
        out.backward(grad_out.to(out.dtype))
        results.append([out.detach(), *(t.grad for t in inputs)])
    # as above: float32 sums over <= 71 keys and 8 channels, 1e-5 = 84 EPS32; a key past the diagonal
    # let in, or a chunk's rows dropped, is off by ~1e-1
    for name, fast, slow in zip(("out", "dq", "dk", "dv"), *results, strict=True):
        assert_close_to_scale(fast, slow, rel=1e-5, msg=name)


def test_attention_picks_the_path_and_matches_explicit_softmax() -> None:
    q, k, v, bias = random_inputs(2, 1, 9, torch.float32)
    mask = bias + causal_mask(9, bias.device)
    q64, k64, v64, mask64 = float64(q, k, v, mask)
    expected = explicit_attention(q64, k64, v64, mask64)  # the reference in float64
    no_bias = explicit_attention(q64, k64, v64, causal_mask(9, q.device).double())
    # float32 softmax over 9 keys of 8-channel dot products: a few EPS32 of the output's scale;
    # 1e-5 = 84 EPS32, while a wrong path (no bias, no causal mask) is off by ~1e-1
    assert_close_to_scale(attention(q, k, v, mask), expected, rel=1e-5, msg="learned bias")
    assert_close_to_scale(attention(q, k, v, mask.detach()), expected, rel=1e-5, msg="constant bias")
    assert_close_to_scale(attention(q, k, v, None), no_bias, rel=1e-5, msg="no bias")


def test_biased_attention_in_bf16_is_close_to_fp32() -> None:
    q, k, v, bias = random_inputs(2, 1, 40, torch.float32)
    mask = bias + causal_mask(40, bias.device)
    expected = explicit_attention(*float64(q, k, v, mask))  # the reference in float64
    fp32 = BiasedAttention.apply(q, k, v, mask)
    bf16 = BiasedAttention.apply(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask)
    assert_close_to_scale(fp32, expected, rel=1e-5, msg="fp32")  # as in the test above: 84 EPS32
    # bf16 rounds q, k, v and the output to 8 bits (EPS_BF16 = 2^-7), and the scores carry the rounding of
    # q.k: observed ~3e-3 of the output's scale; 4 EPS_BF16 = 3.1e-2 (the old elementwise 0.05 was looser)
    assert_close_to_scale(bf16, expected, rel=4 * EPS_BF16, msg="bf16")


def random_factors(batch: int, length: int, rank: int) -> BiasFactors:
    """A float32 query factor and a one-hot key factor of `rank` slots, as the hierarchical bias makes."""
    g = torch.Generator().manual_seed(1)
    query = torch.randn(batch, 3, length, rank, generator=g).requires_grad_()
    slots = torch.randint(0, rank, (batch, 1, length, 1), generator=g).sort(dim=2).values
    return BiasFactors(query, (slots == torch.arange(rank)).float())


@pytest.mark.parametrize("shared_mask", [True, False])
@pytest.mark.parametrize("length", [5, QUERY_CHUNK + 7])
@pytest.mark.parametrize("score_scale", [None, 1.0])
def test_bias_factors_equal_the_dense_bias_forward_and_backward(
    shared_mask: bool, length: int, score_scale: float | None
) -> None:
    """Attention with bias factors (BiasedAttention's dU = dS E; with a score scale, the whole mask through
    autograd) gives the explicit softmax with the dense bias U E^T added, and the same gradients for q, k,
    v, the mask's bias and U."""
    q, k, v, bias = random_inputs(2, 1, length, torch.float32)
    factors = random_factors(2, length, 4)
    grad_out = torch.randn(2, 3, length, 8)
    results = []
    for path in ("fused", "explicit"):
        inputs = [q, k, v, bias, factors.query] if path == "fused" else float64(q, k, v, bias, factors.query)
        key = factors.key.to(inputs[0].dtype)
        mask = inputs[3] + causal_mask(length, q.device).to(inputs[3].dtype) if shared_mask else None
        if path == "fused":
            scale = None if score_scale is None else torch.full((1, 3, length, length), score_scale)
            out = attention(*inputs[:3], mask, scale=scale, factors=BiasFactors(inputs[4], key))
        else:
            dense = BiasFactors(inputs[4], key).dense()  # (B, H, T, T)
            full = dense + (mask if mask is not None else causal_mask(length, q.device).double())
            out = explicit_attention(*inputs[:3], full)
        out.backward(grad_out.to(out.dtype))
        results.append([out.detach(), *(t.grad if t.grad is not None else torch.zeros(1) for t in inputs)])
    # float32 sums over <= 71 keys and 8 channels (dU: over the keys of a slot): observed ~1e-6 of each
    # tensor's largest entry; 1e-5 = 84 EPS32, while dU from the wrong slot or chunk is off by ~1e-1
    for name, fast, slow in zip(("out", "dq", "dk", "dv", "dbias", "dU"), *results, strict=True):
        assert_close_to_scale(fast, slow, rel=1e-5, msg=name)


def test_bias_factors_in_every_path_give_the_same_output() -> None:
    """With the factors: the learned-bias path (BiasedAttention), the constant-mask path, the causal-only
    path and the explicit-softmax path (a score scale of 1) agree."""
    q, k, v, bias = random_inputs(2, 1, 20, torch.float32)
    factors = BiasFactors(random_factors(2, 20, 3).query.detach(), random_factors(2, 20, 3).key)
    zero_mask = causal_mask(20, q.device).expand(1, 3, 20, 20)
    learned = attention(q, k, v, (zero_mask + 0 * bias).requires_grad_(), factors=factors)
    constant = attention(q, k, v, zero_mask, factors=factors)
    causal = attention(q, k, v, None, factors=factors)
    explicit = attention(q, k, v, zero_mask, scale=torch.ones(1, 3, 20, 20), factors=factors)
    # float32 kernels with other summation orders over 20 keys: 1e-5 = 84 EPS32; a path that drops the
    # factors is off by ~1e-1 of the output's scale
    for name, out in (("constant", constant), ("causal", causal), ("explicit", explicit)):
        assert_close_to_scale(out, learned, rel=1e-5, msg=name)
    assert (attention(q, k, v, None) - learned).abs().max() > 1e-2 * learned.abs().max()


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
    expected = torch.cat([rotated.real, rotated.imag], dim=-1)  # the reference in float64
    # float32 tables and x cos + rot(x) sin: <= ~4 roundings of |x_c| + |x_c'| <= 2x the scale, observed
    # ~1e-7 of it; 2e-6 = 17 EPS32, while a wrong angle is ~1e-1
    assert_close_to_scale(q[0, 0], expected, rel=2e-6)
    fresh = RoPE(Dims(d_model=8, n_heads=1), base=100.0)
    # the same float32 formula on the same values: equal up to an ulp of a vector kernel's rounding
    assert_close_to_scale(fresh.rotate(x, x, Positions(token=positions))[0], q, rel=4 * EPS32)


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
        # two float32 kernels, other summation orders: 1e-5 = 84 EPS32 of the logits' scale
        expected = sdpa(tokens, sentence, sentence // 4)
        assert_close_to_scale(flex(tokens, sentence, sentence // 4), expected, rel=1e-5)


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
