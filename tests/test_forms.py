"""Every attention form's paths against its all-pairs reference in float64: the CPU training path (forward
and every gradient), the evaluation path, the accelerator path (run on the CPU: SDPA with the factors as
channels, the explicit softmax; FlexAttention's compiled paths are `slow`) and the block of queries against
a longer prefix of keys that cached decoding runs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from posab.encodings.dape import ScoreMixer
from posab.encodings.dape_kernel import Mixed
from posab.forms import QUERY_CHUNK, Additive, BiasFactors, Causal, Form, LowRank, Scaled
from tolerances import assert_close_to_scale

B, H, D, R = 2, 3, 8, 4
WINDOW = 11  # sliding-window attention: each query sees itself and the 10 keys before it
LENGTH = QUERY_CHUNK + 7  # two query chunks, the second partial
Params = dict[str, Tensor]


def parameters(length: int = LENGTH) -> Params:
    """Float32 leaves: a per-distance table, a dense bias, a scale, factors (U, one-hot E)."""
    g = torch.Generator().manual_seed(0)
    units = torch.cumsum(torch.rand(B, length, generator=g) < 0.1, dim=1).clamp(max=R - 1)  # (B, L)
    return {
        "table": torch.randn(H, 2 * length - 1, generator=g).requires_grad_(),
        "dense": torch.randn(1, H, length, length, generator=g).requires_grad_(),
        "scale": (1 + 0.3 * torch.randn(1, H, length, length, generator=g)).requires_grad_(),
        "query": torch.randn(B, H, length, R, generator=g).requires_grad_(),
        "key": (units[:, None, :, None] == torch.arange(R)).float(),  # (B, 1, L, R)
    }


def mixer() -> ScoreMixer:
    torch.manual_seed(1)
    return ScoreMixer(H, 4)


def by_distance(p: Params, c: int, n: int) -> Additive:
    return Additive.by_distance(p["table"], c, n, p["table"].dtype)


def factors(p: Params, c: int) -> BiasFactors:
    return BiasFactors(p["query"][:, :, -c:], p["key"])


FORMS: dict[str, Callable[[Params, int, int], Form]] = {
    "causal": lambda p, c, n: Causal(),
    "additive by distance": by_distance,
    "additive dense": lambda p, c, n: Additive(p["dense"][..., -c:, :], p["dense"].dtype),
    "low rank": lambda p, c, n: LowRank(None, factors(p, c), p["query"].dtype),
    "low rank beside a bias": lambda p, c, n: LowRank(by_distance(p, c, n), factors(p, c), p["query"].dtype),
    "multiplicative": lambda p, c, n: Scaled(p["scale"][..., -c:, :], by_distance(p, c, n)),
    "causal in a window": lambda p, c, n: Causal(window=WINDOW),
    "additive in a window": lambda p, c, n: Additive.by_distance(p["table"], c, n, p["table"].dtype, WINDOW),
    "logits and bias (DAPE)": lambda p, c, n: Mixed(by_distance(p, c, n), mixer()),
}
# the accelerator paths that compile FlexAttention on the CPU (the bias read inside the kernel)
FLEX = {"additive by distance", "additive dense", "low rank beside a bias", "causal in a window"}
FLEX |= {"additive in a window"}


def qkv(length: int = LENGTH) -> list[Tensor]:
    g = torch.Generator().manual_seed(2)
    return [torch.randn(B, H, length, D, generator=g).requires_grad_() for _ in range(3)]


def float64(tensors: list[Tensor] | Params) -> list[Tensor] | Params:
    """Float64 copies, leaves of their own graph (a reference computed from the same values)."""
    copy = lambda t: t.detach().double().requires_grad_(t.requires_grad)  # noqa: E731
    return (
        {k: copy(t) for k, t in tensors.items()} if isinstance(tensors, dict) else [copy(t) for t in tensors]
    )


def run(kind: str, path: Callable[[Form, list[Tensor]], Tensor], p: Params, inputs: list[Tensor]) -> list:
    """The path's output and the gradients of every leaf that takes one, after a fixed backward."""
    form = FORMS[kind](p, LENGTH, LENGTH)
    out = path(form, inputs)
    out.backward(torch.linspace(-1, 1, out.numel()).view_as(out).to(out.dtype))
    leaves = [*inputs, *(t for t in p.values() if t.requires_grad)]
    return [out.detach(), *(t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves)]


def reference(kind: str) -> list:
    return run(kind, lambda form, x: form.reference(*x), float64(parameters()), float64(qkv()))


def check(kind: str, path: Callable[[Form, list[Tensor]], Tensor]) -> None:
    """float32 sums over <= L = 71 keys and 8 channels (and the batch for a shared bias): observed up to
    ~1e-6 of each tensor's largest entry; 1e-5 = 84 EPS32; a wrong chunk boundary or term is ~1e-1."""
    fast = run(kind, path, parameters(), qkv())
    for index, (actual, expected) in enumerate(zip(fast, reference(kind), strict=True)):
        assert_close_to_scale(actual, expected, rel=1e-5, msg=f"{kind}: output/gradient {index}")


@pytest.mark.parametrize("kind", FORMS)
def test_the_cpu_training_path_equals_the_reference(kind: str) -> None:
    check(kind, lambda form, x: form.attend(*x))


@pytest.mark.parametrize("kind", FORMS)
def test_the_evaluation_path_equals_the_reference(kind: str) -> None:
    p, inputs = parameters(), qkv()
    with torch.no_grad():
        out = FORMS[kind](p, LENGTH, LENGTH).attend(*inputs)
    assert_close_to_scale(out, reference(kind)[0], rel=1e-5)


@pytest.mark.parametrize("kind", sorted(set(FORMS) - FLEX))
def test_the_accelerator_path_equals_the_reference(kind: str) -> None:
    check(kind, lambda form, x: form.accelerated(*x, 0.0))


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(FLEX))
def test_the_flex_accelerator_path_equals_the_reference_in_evaluation(kind: str) -> None:
    """FlexAttention compiled on the CPU (no backward there): the bias read from its table or mask."""
    p, inputs = parameters(), [t.detach() for t in qkv()]
    with torch.no_grad():
        out = FORMS[kind](p, LENGTH, LENGTH).accelerated(*inputs, 0.0)
    assert_close_to_scale(out, reference(kind)[0], rel=1e-5)


@pytest.mark.slow
def test_flex_compiles_a_few_graphs_for_many_lengths() -> None:
    """Ten evaluation lengths never reach dynamo's recompile limit (8), where FlexAttention would fall back
    to its unfused eager kernel: a graph per length is kept, and every length equals the reference (the
    eager fallback would too: the graph count is what shows the compiled kernel ran)."""
    from torch._dynamo.utils import counters

    counters.clear()
    for n in range(64, 224, 16):
        p, inputs = parameters(n), [t.detach() for t in qkv(n)]
        with torch.no_grad():
            form = by_distance(p, n, n)
            assert_close_to_scale(form.accelerated(*inputs, 0.0), form.reference(*inputs), rel=1e-5)
    assert counters["stats"]["unique_graphs"] == 10


@pytest.mark.parametrize("kind", FORMS)
@pytest.mark.parametrize("queries", [1, 9])
def test_a_block_of_queries_over_a_longer_prefix_equals_the_references_rows(kind: str, queries: int) -> None:
    """The last `queries` rows against all LENGTH keys (a cached decoding step), and `scores` of those
    rows, equal the reference's rows."""
    p, (q, k, v) = parameters(), qkv()
    with torch.no_grad():
        form = FORMS[kind](p, queries, LENGTH)
        out = form.attend(q[:, :, -queries:], k, v)  # (B, H, c, D)
        scores = form.scores(q[:, :, -queries:], k, 0, queries)  # (B, H, c, n)
        whole = FORMS[kind](p, LENGTH, LENGTH).scores(q, k, LENGTH - queries, LENGTH)
    assert_close_to_scale(out, reference(kind)[0][:, :, -queries:], rel=1e-5)
    assert torch.equal(scores.isinf(), whole.isinf())
    finite = whole.isfinite()
    assert_close_to_scale(scores[finite], whole[finite], rel=1e-5)


def test_a_window_is_the_band_of_keys_each_query_sees() -> None:
    """The windowed forms' reference against the formula written out: softmax over keys i - W < j <= i."""
    q, k, v = (t.detach().double() for t in qkv())
    i, j = torch.arange(LENGTH)[:, None], torch.arange(LENGTH)[None, :]
    band = torch.where((j <= i) & (j > i - WINDOW), 0.0, float("-inf")).double()  # (L, L)
    explicit = torch.softmax(q @ k.transpose(-1, -2) / D**0.5 + band, dim=-1) @ v
    assert_close_to_scale(Causal(window=WINDOW).reference(q, k, v), explicit, rel=1e-12)


def test_the_check_can_fail() -> None:
    """A form whose path and reference disagree (the bias of one distance further) fails `check`."""
    shifted = lambda p, c, n: Additive.by_distance(p["table"].roll(1, -1), c, n, p["table"].dtype)  # noqa: E731
    FORMS["shifted"] = shifted
    try:
        with pytest.raises(AssertionError, match="ratio"):
            fast = run("shifted", lambda form, x: form.attend(*x), parameters(), qkv())
            slow = run(
                "additive by distance",
                lambda form, x: form.reference(*x),
                float64(parameters()),
                float64(qkv()),
            )
            assert_close_to_scale(fast[0], slow[0], rel=1e-5)
    finally:
        del FORMS["shifted"]
