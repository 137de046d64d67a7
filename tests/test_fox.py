"""FoX, the forgetting transformer (`posab.encodings.fox`): every path of its form (the CPU training kernel,
the evaluation path, the accelerator paths run on the CPU, a block of queries over a longer prefix), forward
and every gradient (q, k, v, the gate projection's weight and bias, the layer input), against an all-pairs
float64 reference written from the paper's formula; the gate initialisation as the references set it; the
decay of nearby keys at positions ~4,000 under bf16; the cached sum of gates; the audit's gate curve."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import posab.encodings.fox_kernel as fox_kernel
from conftest import text_like, tiny_model
from posab.cache import LayerCache
from posab.encodings import Dims, Positions, build_encoding
from posab.encodings.fox import FoX, GateSums, mean_by_distance
from posab.encodings.fox_kernel import Forgetting, decay_rows, forgetting_attention
from posab.errors import ConfigError
from posab.forms import QUERY_CHUNK, Causal, Form, causal_mask
from tolerances import EPS32, EPS_BF16, assert_close_to_scale, scale_of

B, H, C = 2, 3, 12  # batch, heads, model width (head dim C / H = 4)
FORWARD_ROWS = 32  # the forward pass's query chunk in these tests (the model's: 512, its training length)
LENGTH = QUERY_CHUNK + 9  # three forward chunks and two backward ones, the last of each partial
FOX = {"_target_": "posab.encodings.fox.FoX"}


@pytest.fixture(autouse=True)
def forward_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several forward chunks at LENGTH: the first square (the kernel's own causal mask), the others over
    the keys before them too."""
    monkeypatch.setattr(fox_kernel, "FORWARD_CHUNK", FORWARD_ROWS)


def encoding(dtype: torch.dtype = torch.float32, **settings: object) -> FoX:
    """A one-layer FoX with gates away from 1/2 (bias ~ N(0, 1), weight N(0, 0.3)): decays that differ by head
    and token, so a wrong sum of gates shows."""
    torch.manual_seed(0)
    enc = build_encoding({**FOX, **settings}, Dims(d_model=C, n_heads=H, n_layers=1))
    with torch.no_grad():
        enc.gates[0].weight.normal_(std=0.3)
        enc.gates[0].bias.normal_()
    return enc.to(dtype)  # type: ignore[return-value]


def leaves(length: int = LENGTH, dtype: torch.dtype = torch.float32) -> list[Tensor]:
    """x (B, L, C), the layer's attention input, and q, k, v (B, H, L, D): leaves that take a gradient."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, length, C, generator=g, dtype=torch.float64)
    q, k, v = (torch.randn(B, H, length, C // H, generator=g, dtype=torch.float64) for _ in range(3))
    return [t.to(dtype).requires_grad_() for t in (x, q, k, v)]


def decay_all_pairs(enc: FoX, x: Tensor) -> Tensor:
    """The paper's D_ij = sum_{t=j+1..i} log f_t, f_t = sigmoid(w^T x_t + b), each pair's sum written out
    (no cumulative sum): (B, H, L, L), 0 on the diagonal, the values above it unused."""
    gate = enc.gates[0]
    log_f = F.logsigmoid(x @ gate.weight.T + gate.bias).transpose(1, 2)  # (B, L, H) -> (B, H, L)
    n = x.shape[1]
    t, i, j = torch.arange(n)[:, None, None], torch.arange(n)[None, :, None], torch.arange(n)[None, None, :]
    between = ((j < t) & (t <= i)).to(x.dtype)  # (L, L, L): [t, i, j] = 1 where j < t <= i
    return torch.einsum("bhl,lij->bhij", log_f, between)


def fox_all_pairs(enc: FoX, x: Tensor, q: Tensor, k: Tensor, v: Tensor, window: int | None = None) -> Tensor:
    """softmax(q k^T / sqrt(d) + D + causal) V over all pairs, the last c = q's rows of the n keys; with a
    `window` W, each query over itself and the W - 1 keys before it."""
    n, c = k.shape[-2], q.shape[-2]
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, c, n)
    i, j = torch.arange(n - c, n)[:, None], torch.arange(n)[None, :]
    seen = (j <= i) & (j > i - (window or n))  # (c, n)
    scores = logits + decay_all_pairs(enc, x)[..., n - c :, :] + torch.where(seen, 0.0, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def form_of(enc: FoX, x: Tensor, queries: int | None = None) -> Forgetting:
    """The layer's form as the model builds it: over every token of x, or with a cache, the last `queries`
    tokens after the others (two calls sharing the layer's state)."""
    if queries is None:
        return enc.layer_form(Causal(), 0, x)
    cache = LayerCache()
    enc.layer_form(Causal(), 0, x[:, :-queries], cache)
    return enc.layer_form(Causal(), 0, x[:, -queries:], cache)


Path = Callable[[Form, Tensor, Tensor, Tensor], Tensor]


def outputs_and_grads(path: Path | None, dtype: torch.dtype, queries: int | None = None) -> list[Tensor]:
    """A path's output and the gradients of x, q, k, v, the gate's weight and bias after a fixed backward;
    `path` None: the all-pairs reference. With `queries`, those last rows against every key."""
    enc = encoding(dtype)
    x, q, k, v = leaves(dtype=dtype)
    rows = q if queries is None else q[:, :, -queries:]
    out = fox_all_pairs(enc, x, rows, k, v) if path is None else path(form_of(enc, x, queries), rows, k, v)
    out.backward(torch.linspace(-1, 1, out.numel(), dtype=dtype).view_as(out))
    gate = enc.gates[0]
    return [out.detach(), *(t.grad for t in (x, q, k, v, gate.weight, gate.bias))]


NAMES = ["out", "dx", "dq", "dk", "dv", "dW", "db"]


def float32_budget() -> float:
    """The float32 paths' tolerance: c is summed in float32 (as the reference code sums it), so every D_ij =
    c_i - c_j carries up to ~1 ulp of max |c| (~78 here: 9e-6), which the attention weights take as a
    relative error, beside the kernels' sums over <= 73 keys (1e-5 = 84 EPS32): 2.9e-5 here; observed <=
    3e-6 of each tensor's scale (db: 2e-5, below). A gate summed from j instead of j + 1, or one chunk's
    rows shifted, is off by ~1e-1."""
    enc, (x, *_) = encoding(), leaves()
    return 1e-5 + 2 * EPS32 * scale_of(form_of(enc, x).cum)


CANCELLING = 10  # db sums the B * L gate-logit gradients, which cancel to ~1/8 of their magnitudes (observed)


def check(path: Path, queries: int | None = None) -> None:
    """The path against the all-pairs reference, every output and gradient: in float64 they differ in the
    order of their sums only (observed ~2e-14 of each tensor's scale; 1e-12 allows it); in float32 within
    `float32_budget` of each tensor's scale, db within CANCELLING times that (its rounding is relative to
    the terms it sums, not to its scale: tests/tolerances.py)."""
    expected = outputs_and_grads(None, torch.float64, queries)
    for dtype, rel in ((torch.float64, 1e-12), (torch.float32, float32_budget())):
        actual = outputs_and_grads(path, dtype, queries)
        for name, a, e in zip(NAMES, actual, expected, strict=True):
            assert a is not None and e is not None, name
            scaled = rel * CANCELLING if name == "db" and dtype == torch.float32 else rel
            assert_close_to_scale(a, e, rel=scaled, msg=f"{name} ({dtype})")


def test_the_cpu_training_path_equals_the_all_pairs_reference() -> None:
    """The chunked flash kernel on the chunked core's backward (`Forgetful`), as training runs it."""

    def training(form: Form, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        assert isinstance(form, Forgetting) and form.cum.requires_grad
        return form.attend(q, k, v)

    check(training)


def test_the_kernel_takes_a_block_of_queries_over_a_longer_prefix() -> None:
    """`Forgetful` on the last 40 queries of the 73 keys (the forward's chunks and the backward's offset by
    33 keys), gradients included."""
    check(
        lambda form, q, k, v: forgetting_attention(q, k, v, form.cum, form.window, form.scratch),
        queries=40,
    )


@pytest.mark.parametrize("queries", [1, 9])
def test_a_cached_step_s_block_of_queries_equals_the_reference_rows(queries: int) -> None:
    """A cached decoding step: the last `queries` tokens after the cached ones, their c continued from the
    cache's (`state`), attended by `Form.block` (the explicit softmax of `scores`); gradients by autograd."""
    check(lambda form, q, k, v: form.attend(q, k, v), queries=queries)


def test_the_training_path_s_gradients_are_causal_exactly() -> None:
    """Outputs up to token 39 take no gradient, not even a rounding, from the keys, values and gates after it
    (the backward floors exp's argument before the causal mask: future keys keep P = 0)."""
    enc, (x, q, k, v) = encoding(), leaves()
    form_of(enc, x).attend(q, k, v)[:, :, :40].sum().backward()
    for name, grad in (("dx", x.grad[:, 40:]), ("dk", k.grad[:, :, 40:]), ("dv", v.grad[:, :, 40:])):
        assert grad is not None and torch.equal(grad, torch.zeros_like(grad)), name


def test_a_flash_call_s_rows_of_d_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole window in one call at the training length (B = 16, H = 4, L = 512: 2^24 floats, 64 MiB),
    fewer rows past it so that one call's rows of D stay within 2^24 floats (256 rows at L = 4,096 with the
    evaluation's B = 4), never fewer than the backward's QUERY_CHUNK."""
    monkeypatch.setattr(fox_kernel, "FORWARD_CHUNK", 512)  # the model's, not these tests'
    shapes = ((16, 512), (4, 4096), (1, 10**6))
    assert [fox_kernel.forward_rows(torch.empty(b, 4, n), n) for b, n in shapes] == [512, 256, QUERY_CHUNK]


@pytest.mark.parametrize("queries", [None, 9])
def test_in_a_sliding_window_every_path_equals_the_reference(queries: int | None) -> None:
    """`model.window` W = 11: each query over itself and the 10 keys before it, on the training kernel (the
    window's band added to every chunk, the first too; forward and every gradient, float64) and the
    evaluation path; and a block of queries over a prefix."""
    results = []
    for path in ("form", "reference"):
        enc, (x, q, k, v) = encoding(torch.float64), leaves(dtype=torch.float64)
        rows = q if queries is None else q[:, :, -queries:]
        form = dataclasses.replace(form_of(enc, x, queries), window=11)
        out = form.attend(rows, k, v) if path == "form" else fox_all_pairs(enc, x, rows, k, v, window=11)
        out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out))
        gate = enc.gates[0]
        results.append([out.detach(), *(t.grad for t in (x, q, k, v, gate.weight, gate.bias))])
        if path == "form":
            with torch.no_grad():
                assert_close_to_scale(form.attend(rows, k, v), out, rel=1e-12, msg="evaluation")
    for name, a, e in zip(NAMES, *results, strict=True):
        assert_close_to_scale(a, e, rel=1e-12, msg=name)


def test_the_evaluation_path_equals_the_reference() -> None:
    """Without gradients: the chunked flash forward alone."""
    expected = outputs_and_grads(None, torch.float64)[0]
    for dtype, rel in ((torch.float64, 1e-12), (torch.float32, float32_budget())):
        enc, (x, q, k, v) = encoding(dtype), leaves(dtype=dtype)
        with torch.no_grad():
            out = form_of(enc, x).attend(q, k, v)
        assert_close_to_scale(out, expected, rel=rel, msg=str(dtype))


def test_the_accelerator_s_sdpa_path_equals_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where FlexAttention does not run (or with attention dropout): SDPA with the whole mask, the gradient
    into the gates by autograd."""
    monkeypatch.setattr(fox_kernel, "flex_runs_on", lambda device: False)
    check(lambda form, q, k, v: form.accelerated(q, k, v, 0.0))


@pytest.mark.slow
def test_the_flex_path_equals_the_reference_in_evaluation() -> None:
    """FlexAttention compiled on the CPU (no backward there), c_i - c_j read from c inside the kernel, over
    the whole window and over a longer prefix."""
    expected = outputs_and_grads(None, torch.float64)[0]
    enc, (x, q, k, v) = encoding(), (t.detach() for t in leaves())
    with torch.no_grad():
        out = form_of(enc, x).accelerated(q, k, v, 0.0)
        block = form_of(enc, x, 9).accelerated(q[:, :, -9:], k, v, 0.0)
    assert_close_to_scale(out, expected, rel=float32_budget())
    assert_close_to_scale(block, expected[:, :, -9:], rel=float32_budget())


def test_scores_and_dense_bias_are_the_reference_s() -> None:
    """`scores` (the attention analysis, cached decoding) and `dense_bias` of any block of rows."""
    enc, (x, q, k, _) = encoding(torch.float64), leaves(dtype=torch.float64)
    decay = decay_all_pairs(enc, x)  # (B, H, L, L)
    form = form_of(enc, x)
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    expected = (logits + decay + causal_mask(LENGTH, q.device))[:, :, 20:90, :90]
    assert_close_to_scale(form.scores(q, k, 20, 90), expected, rel=1e-12)
    assert_close_to_scale(form.dense_bias().tril(), decay.tril(), rel=1e-12)
    rows = form_of(enc, x, 9).dense_bias().tril(LENGTH - 9)  # (B, H, 9, L), the keys each row sees
    assert_close_to_scale(rows, decay.tril()[:, :, -9:], rel=1e-12)


@dataclass(eq=False)
class AllPairs(Form):
    """The reference as a layer's form: every path is `fox_all_pairs` through autograd."""

    enc: FoX
    x: Tensor

    def attend(self, q: Tensor, k: Tensor, v: Tensor, dropout: float = 0.0, backend: str = "sdpa") -> Tensor:
        return fox_all_pairs(self.enc, self.x, q, k, v)


def test_the_model_with_fox_equals_the_all_pairs_reference_forward_and_backward() -> None:
    """The model as it trains (each layer's gates from its normalised input, `Forgetful`), in
    float32, against the same weights in float64 with each layer's attention the all-pairs reference on
    that layer's own gates: equal logits and equal gradients of every parameter (four layers; observed
    <= 3e-6 of each tensor's scale, the gate biases' <= 7e-6 (they cancel, as db in `check`); 1e-5 = 84
    EPS32; a gate read from the wrong layer is ~1e-1)."""
    model = tiny_model("fox").train()
    with torch.no_grad():
        for gate in model.encoding.gates:
            gate.bias.normal_()  # gates away from 1/2, differing by head
    reference = copy.deepcopy(model).double()
    enc = reference.encoding

    def layer_reference(form: Form, layer: int, x: Tensor, cache: object = None) -> Form:
        single = FoX(Dims(enc.dims.d_model, enc.dims.n_heads)).double()
        single.gates[0] = enc.gates[layer]
        return AllPairs(single, x)

    enc.layer_form = layer_reference  # type: ignore[method-assign]
    tokens, sentence, paragraph = text_like(QUERY_CHUNK + 9)
    targets = torch.roll(tokens, -1, dims=1)
    for net in (model, reference):
        F.cross_entropy(net(tokens, sentence, paragraph).flatten(0, 1), targets.flatten()).backward()
    assert_close_to_scale(
        model(tokens, sentence, paragraph), reference(tokens, sentence, paragraph), rel=1e-5
    )
    for (name, fast), slow in zip(model.named_parameters(), reference.parameters(), strict=True):
        cancelling = name.startswith("encoding.gates.") and name.endswith(".bias")  # as db in `check`
        assert_close_to_scale(fast.grad, slow.grad, rel=1e-5 * (CANCELLING if cancelling else 1), msg=name)


def test_the_cache_keeps_the_sum_of_gates_and_continues_it() -> None:
    """Three calls with one layer cache: c over all keys, each call's gates continued from the last cached c,
    kept in the layer's typed state (`GateSums`)."""
    enc, (x, *_) = encoding(), leaves()
    whole = form_of(enc, x).cum
    cache = LayerCache()
    for start, end in ((0, 30), (30, 31), (31, LENGTH)):
        form = enc.layer_form(Causal(), 0, x[:, start:end], cache)
        assert form.queries == end - start and form.cum.shape == (B, H, end)
    sums = cache.state_for(GateSums)
    assert sums is cache.encoding_state and sums.cum is not None
    # float32 sums of <= 73 gates (each ~1), continued from a rounded partial sum: observed ~1e-7 of c's scale
    assert_close_to_scale(sums.cum, whole, rel=100 * EPS32)


def bf16_window(length: int) -> tuple[Tensor, Tensor, list[Tensor]]:
    """c of `length` tokens whose gates are ~1/2 (log f ~ -0.7: FoX at initialisation, c_L ~ -2,900), in
    float32 as the model sums them and exactly (float64), (1, 2, L) each; q, k, v (1, 2, L, 16) in bf16."""
    g = torch.Generator().manual_seed(3)
    log_f = F.logsigmoid(torch.randn(1, 2, length, generator=g) * 0.5)  # (1, 2, L) float32
    q, k, v = (torch.randn(1, 2, length, 16, generator=g).bfloat16() for _ in range(3))
    return log_f.cumsum(-1), log_f.double().cumsum(-1), [q, k, v]


def test_under_bf16_the_decay_of_nearby_keys_stays_accurate_at_position_4000() -> None:
    """c ~ -2,900 at 4,096 tokens: rounded to bf16 alone (8 bits), c_i and c_j would each be off by up to ~8,
    the decay of a key one token back by as much. Every path forms c_i - c_j from the float32 sums first: the
    rows of the last 64 queries over their last 64 keys are within 2e-3 of the exact decay (float32 sums of
    ~4,000 terms ~2,900 in size: ulp 2.4e-4), and the attention output of those queries, from bf16 q, k, v,
    is within bf16 rounding of the float64 reference (observed 2.5e-3 of its scale; EPS_BF16 = 7.8e-3);
    from the rounded c it would be off by ~0.8 of it."""
    length = 4096
    cum, exact, (q, k, v) = bf16_window(length)
    near = decay_rows(cum, length, length - 64, length)[..., -64:].tril()  # (1, 2, 64, 64)
    expected = (exact[..., -64:, None] - exact[..., None, -64:]).tril()
    assert float((near.double() - expected).abs().max()) <= 2e-3
    rounded = cum.bfloat16().float()  # c rounded alone: the precision trap
    naive = (rounded[..., -64:, None] - rounded[..., None, -64:]).tril()
    assert float((naive.double() - expected).abs().max()) > 1.0
    logits = q.double()[:, :, -64:] @ k.double().transpose(-1, -2) / 4.0  # (1, 2, 64, L)
    decay = exact[..., -64:, None] - exact[..., None, :] + causal_mask(length, q.device)[-64:].double()
    reference = torch.softmax(logits + decay, dim=-1) @ v.double()
    form = Forgetting(cum, length)
    with torch.no_grad():
        evaluated = form.attend(q, k, v)[:, :, -64:]
    with torch.enable_grad():
        trained = form.attend(q.requires_grad_(), k, v)[:, :, -64:].detach()
    for out in (evaluated, trained):
        assert out.dtype == torch.bfloat16
        assert_close_to_scale(out, reference, rel=EPS_BF16)
    with torch.no_grad():  # the same path over the rounded c: the output is off by ~0.8 of its scale
        trap = Forgetting(rounded, length).attend(q.detach(), k, v)[:, :, -64:]
    assert float((trap.double() - reference).abs().max()) > 0.1 * scale_of(reference)


def test_the_gates_start_as_the_references_set_them() -> None:
    """FoX (ForgettingAttentionLayer, fgate_type=full): one Linear(d_model, heads, bias=True) per layer,
    weight N(0, 0.02), bias 0. DataDependentAlibi (x-transformers): the bias 5, the weight at PyTorch's
    default U(-1/sqrt(d), 1/sqrt(d))."""
    dims = Dims(d_model=128, n_heads=4, n_layers=3)
    torch.manual_seed(0)
    fox = build_encoding(FOX, dims)
    assert isinstance(fox, FoX) and len(fox.gates) == 3
    assert len({id(gate) for gate in fox.gates}) == 3
    for gate in fox.gates:
        assert (
            gate.weight.shape == (4, 128) and gate.bias is not None and torch.equal(gate.bias, torch.zeros(4))
        )
        assert 0.018 <= float(gate.weight.detach().std()) <= 0.022  # 512 draws: the std to ~3%
    dda = build_encoding({**FOX, "gate_bias_init": 5.0, "gate_weight_std": None}, dims)
    for gate in dda.gates:
        assert torch.equal(gate.bias, torch.full((4,), 5.0))
        bound = 1 / math.sqrt(128)
        assert float(gate.weight.detach().abs().max()) <= bound and float(
            gate.weight.detach().std()
        ) > 0.8 * bound / math.sqrt(3)


def test_fox_is_relative_has_no_bias_by_distance_and_refuses_a_missing_input() -> None:
    enc = encoding()
    assert enc.relative_only and enc.distance_bias(torch.arange(5.0)) is None
    assert isinstance(enc.attention_form(Positions.build(6), 6, torch.float32), Causal)
    with pytest.raises(ValueError, match="attention input"):
        enc.layer_form(Causal(), 0)
    with pytest.raises(ConfigError, match="gate_weight_std=-1"):
        build_encoding({**FOX, "gate_weight_std": -1.0}, Dims(C, H))


def test_the_gate_curve_is_the_mean_decay_by_distance() -> None:
    """`gate_curve` (the extrapolation audit's bias curve for FoX): per layer, the mean of D_ij over the
    pairs at each distance i - j and over the batch, against the pairs summed out one by one."""
    enc, (x, *_) = encoding(torch.float64), leaves(length=40, dtype=torch.float64)
    curve = enc.gate_curve([x.detach()])  # (1, H, 40)
    decay = decay_all_pairs(enc, x.detach())  # (B, H, L, L)
    expected = torch.stack([decay.diagonal(-d, -2, -1).mean((0, -1)) for d in range(40)], dim=-1)  # (H, L)
    assert curve.shape == (1, H, 40)
    assert_close_to_scale(curve[0], expected, rel=1e-12)
    assert torch.equal(curve[0, :, 0], torch.zeros(H)) and bool((curve[0, :, 1:] < 0).all())
    assert_close_to_scale(mean_by_distance(form_of(enc, x.detach()).cum), expected, rel=1e-12)


def test_the_audit_s_content_statistics_are_the_gates_slope_and_far_decay() -> None:
    """`content_statistics` (the extrapolation audit's part 4): the mean log gate per token and D_{n-1,0},
    per head, over the batch, against the reference's gates and its all-pairs D."""
    enc, (x, q, k, _) = encoding(torch.float64), leaves(dtype=torch.float64)
    gate = enc.gates[0]
    log_f = F.logsigmoid(x @ gate.weight.T + gate.bias)  # (B, L, H)
    found = form_of(enc, x).content_statistics(q, k)
    assert_close_to_scale(found["gate_log"], log_f.mean((0, 1)), rel=1e-12)
    assert_close_to_scale(found["gate_bias_far"], decay_all_pairs(enc, x)[:, :, -1, 0].mean(0), rel=1e-12)
