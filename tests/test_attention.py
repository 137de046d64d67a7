"""The fast attention paths (the forms' `attend`, and the kernel beneath them) against slow references
written out here, on tiny shapes."""

from __future__ import annotations

import math

import pytest
import torch

from posab.encodings import Dims, Positions
from posab.encodings.rope import RoPE
from posab.forms import QUERY_CHUNK, Additive, BiasFactors, Causal, LowRank, causal_mask, lowrank
from posab.forms.kernels import Biased, biased_attention
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
    paths = ((biased_attention, (q, k, v, bias)), (explicit_attention, float64(q, k, v, bias)))
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
    """Without a mask, training on the CPU takes the Biased kernel's backward with the causal mask alone:
    the explicit causal softmax's output and gradients."""
    q, k, v, _ = random_inputs(2, 1, length, torch.float32)
    grad_out = torch.randn(2, 3, length, 8)
    results = []
    for path in ("fast", "explicit"):
        inputs = [q, k, v] if path == "fast" else float64(q, k, v)
        if path == "fast":
            out = Causal().attend(*inputs)
            assert out.grad_fn is not None and isinstance(getattr(out.grad_fn, "kernel", None), Biased)
        else:
            out = explicit_attention(*inputs, causal_mask(length, q.device).double())
        out.backward(grad_out.to(out.dtype))
        results.append([out.detach(), *(t.grad for t in inputs)])
    # as above: float32 sums over <= 71 keys and 8 channels, 1e-5 = 84 EPS32; a key past the diagonal
    # let in, or a chunk's rows dropped, is off by ~1e-1
    for name, fast, slow in zip(("out", "dq", "dk", "dv"), *results, strict=True):
        assert_close_to_scale(fast, slow, rel=1e-5, msg=name)


def test_attention_picks_the_path_and_matches_explicit_softmax() -> None:
    """Each form's `attend` on the CPU: the Biased kernel with gradients (a learned bias, a constant one,
    none), SDPA without; every path gives the explicit softmax, and so does the form's own `reference` in
    float64."""
    q, k, v, bias = random_inputs(2, 1, 9, torch.float32)
    table = torch.randn(3, 17, generator=torch.Generator().manual_seed(1)).requires_grad_()  # (H, 2L-1)
    q64, k64, v64, bias64, table64 = float64(q, k, v, bias, table)
    causal64 = causal_mask(9, q.device).double()
    index = 8 + torch.arange(9)[:, None] - torch.arange(9)[None, :]  # (L, L): table column (L-1) + i - j
    cases = {  # the form in float32, the same form in float64, and the explicit mask in float64
        "learned bias": (Additive(bias, torch.float32), Additive(bias64, torch.float64), bias64 + causal64),
        "constant bias": (
            Additive(bias.detach(), torch.float32),
            Additive(bias64.detach(), torch.float64),
            bias64 + causal64,
        ),
        "learned bias by distance": (
            Additive.by_distance(table, 9, 9, torch.float32),
            Additive.by_distance(table64, 9, 9, torch.float64),
            table64[:, index][None] + causal64,
        ),
        "no bias": (Causal(), Causal(), causal64),
    }
    for name, (form, form64, mask64) in cases.items():
        expected = explicit_attention(q64, k64, v64, mask64)  # the reference in float64
        # the same float64 softmax, summed in another order: ~1e-16 of the scale
        assert_close_to_scale(form64.reference(q64, k64, v64), expected, rel=1e-12, msg=f"{name}: reference")
        training = form.attend(q, k, v)
        assert training.grad_fn is not None and isinstance(
            getattr(training.grad_fn, "kernel", None), Biased
        ), name
        with torch.no_grad():
            evaluation = form.attend(q, k, v)
        # float32 softmax over 9 keys of 8-channel dot products: a few EPS32 of the output's scale;
        # 1e-5 = 84 EPS32, while a wrong path (no bias, no causal mask) is off by ~1e-1
        assert_close_to_scale(training, expected, rel=1e-5, msg=f"{name}: training")
        assert_close_to_scale(evaluation, expected, rel=1e-5, msg=f"{name}: evaluation")


def test_biased_attention_in_bf16_is_close_to_fp32() -> None:
    q, k, v, bias = random_inputs(2, 1, 40, torch.float32)
    mask = bias + causal_mask(40, bias.device)
    expected = explicit_attention(*float64(q, k, v, mask))  # the reference in float64
    fp32 = biased_attention(q, k, v, mask)
    bf16 = biased_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask)
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
@pytest.mark.parametrize("path", ["cpu", "channels"])
def test_bias_factors_equal_the_dense_bias_forward_and_backward(
    shared_mask: bool, length: int, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attention with bias factors (`LowRank`) on the CPU (the Biased kernel's dU = dS E) and on the
    accelerators' path (`accelerated`: the factors as extra channels of q and k, through SDPA's autograd;
    beside a shared bias the SDPA path where FlexAttention does not run) gives the explicit softmax with the
    dense bias U E^T added, and the same gradients for q, k, v, the shared bias and U."""
    monkeypatch.setattr(lowrank, "flex_runs_on", lambda device: False)  # SDPA, not FlexAttention
    q, k, v, bias = random_inputs(2, 1, length, torch.float32)
    factors = random_factors(2, length, 4)
    grad_out = torch.randn(2, 3, length, 8)
    results = []
    for side in ("fused", "explicit"):
        inputs = [q, k, v, bias, factors.query] if side == "fused" else float64(q, k, v, bias, factors.query)
        key = factors.key.to(inputs[0].dtype)
        if side == "fused":
            shared = Additive(inputs[3], torch.float32) if shared_mask else None
            form = LowRank(shared, BiasFactors(inputs[4], key), torch.float32)
            out = form.attend(*inputs[:3]) if path == "cpu" else form.accelerated(*inputs[:3], 0.0)
            assert out.grad_fn is not None
            assert (isinstance(getattr(out.grad_fn, "kernel", None), Biased)) == (path == "cpu")
        else:
            causal = causal_mask(length, q.device).double()
            mask = inputs[3] + causal if shared_mask else causal
            out = explicit_attention(*inputs[:3], BiasFactors(inputs[4], key).dense() + mask)
        out.backward(grad_out.to(out.dtype))
        results.append([out.detach(), *(t.grad if t.grad is not None else torch.zeros(1) for t in inputs)])
    # float32 sums over <= 71 keys and 8 channels (dU: over the keys of a slot): observed ~1e-6 of each
    # tensor's largest entry; 1e-5 = 84 EPS32, while dU from the wrong slot or chunk is off by ~1e-1
    for name, fast, slow in zip(("out", "dq", "dk", "dv", "dbias", "dU"), *results, strict=True):
        assert_close_to_scale(fast, slow, rel=1e-5, msg=name)


def test_bias_factors_in_every_path_give_the_same_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the factors: the learned-bias path (the Biased kernel with dU), the constant-mask path (the whole
    mask, beside a shared bias or the causal mask alone), the evaluation path (SDPA with the whole mask),
    the accelerators' factor channels (SDPA) and the explicit softmax (`reference`) agree."""
    monkeypatch.setattr(lowrank, "flex_runs_on", lambda device: False)  # SDPA, not FlexAttention
    q, k, v, bias = random_inputs(2, 1, 20, torch.float32)
    factors = BiasFactors(random_factors(2, 20, 3).query.detach(), random_factors(2, 20, 3).key)
    zero = torch.zeros(1, 3, 20, 20)
    learned = LowRank(Additive(0 * bias, torch.float32), factors, torch.float32).attend(q, k, v)
    assert learned.grad_fn is not None and isinstance(getattr(learned.grad_fn, "kernel", None), Biased)
    constant = LowRank(Additive(zero, torch.float32), factors, torch.float32).attend(q, k, v)
    causal = LowRank(None, factors, torch.float32).attend(q, k, v)
    with torch.no_grad():
        evaluation = LowRank(None, factors, torch.float32).attend(q, k, v)
    channels = LowRank(Additive(zero, torch.float32), factors, torch.float32).accelerated(q, k, v, 0.0)
    causal_channels = LowRank(None, factors, torch.float32).accelerated(q, k, v, 0.0)
    explicit = LowRank(None, factors, torch.float32).reference(q, k, v)
    # float32 kernels with other summation orders over 20 keys: 1e-5 = 84 EPS32; a path that drops the
    # factors is off by ~1e-1 of the output's scale
    paths = {
        "constant": constant,
        "causal": causal,
        "evaluation": evaluation,
        "channels": channels,
        "causal channels": causal_channels,
        "explicit": explicit,
    }
    for name, out in paths.items():
        assert_close_to_scale(out, learned, rel=1e-5, msg=name)
    assert (Causal().attend(q, k, v) - learned).abs().max() > 1e-2 * learned.abs().max()


def test_rope_matches_the_rotation_formula_and_cached_tables_honour_offsets() -> None:
    rope = RoPE(Dims(d_model=8, n_heads=1), base=100.0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1, 5, 8, generator=g)
    positions = torch.arange(3, 8)
    q, _ = rope.rotate(x, x, Positions.build(5, offset=1000))  # grows the cache past 8 first
    q, _ = rope.rotate(x, x, Positions.build(5, offset=3))
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
    assert_close_to_scale(fresh.rotate(x, x, Positions.build(5, offset=3))[0], q, rel=4 * EPS32)


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


def test_form_is_cached_per_length_in_evaluation_and_cleared_by_training() -> None:
    from conftest import tiny_model

    model = tiny_model("multiscale")
    tokens = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        first = model(tokens)
        assert len(model._form_cache) == 1
        assert torch.equal(model(tokens), first)
    with torch.no_grad():
        model.encoding.distance_mlp.mlp[-1].weight.mul_(3.0)  # as a training step changes the bias
    model.train()
    assert not model._form_cache
    model.eval()
    with torch.inference_mode():
        assert (model(tokens) - first).abs().max() > 1e-4
