"""Stick-breaking attention (Tan et al., ICLR 2025): the chunked kernel against the all-pairs reference
(forward and every gradient, float64 and float32), the cached-decoding block, a hand-worked example, the
remainder, bf16 autocast, the memory bound and the encoding's wiring."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from posab.encodings import Dims, Positions, build_encoding
from posab.encodings.stickbreaking import StickBreaking
from posab.encodings.stickbreaking_kernel import (
    STICK_CHUNK,
    StickBreakingAttention,
    StickBreakingForm,
    stick_breaking_all_pairs,
)
from posab.errors import ConfigError
from posab.forms import AttentionInputs
from tolerances import EPS32, assert_close_to_scale

B, H, D = 2, 3, 8
FORM = StickBreakingForm()


def leaves(
    length: int, dtype: torch.dtype = torch.float64, keys: int | None = None, spread: float = 1.0
) -> list[Tensor]:
    """q (B, H, length, D), k, v (B, H, keys, D) leaves: the queries the last `length` of the keys; q and
    k times `spread` (spread 3: logits of sd ~ 9, betas near 0 and 1)."""
    g = torch.Generator().manual_seed(length + (keys or 0))
    n = keys or length
    q = torch.randn(B, H, length, D, generator=g, dtype=torch.float64) * spread
    k = torch.randn(B, H, n, D, generator=g, dtype=torch.float64) * spread
    v = torch.randn(B, H, n, D, generator=g, dtype=torch.float64)
    return [t.to(dtype).requires_grad_() for t in (q, k, v)]


def output_and_grads(path: str, q: Tensor, k: Tensor, v: Tensor) -> list[Tensor]:
    """The output and dq, dk, dv for a fixed float64 output gradient: the kernel or the reference."""
    out = StickBreakingAttention.apply(q, k, v) if path == "kernel" else FORM.reference(q, k, v)
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    return [out.detach(), *torch.autograd.grad(out, (q, k, v), d_out.to(out.dtype))]


@pytest.mark.parametrize(
    ("length", "keys"),
    [(1, None), (7, None), (STICK_CHUNK, None), (2 * STICK_CHUNK + 9, None), (STICK_CHUNK + 5, 150), (1, 40)],
)
def test_kernel_equals_the_all_pairs_reference_in_float64(length: int, keys: int | None) -> None:
    """Output, dq, dk and dv, over one chunk, whole chunks, a partial last chunk and queries that are the
    last of more keys (a cached step): the two differ in the order of their sums only (observed <= 5e-15 of
    the scale); a wrong chunk boundary, index or sign is off by ~1e-1."""
    fast = output_and_grads("kernel", *leaves(length, keys=keys))
    slow = output_and_grads("reference", *leaves(length, keys=keys))
    for name, a, b in zip(["out", "dq", "dk", "dv"], fast, slow, strict=True):
        assert_close_to_scale(a, b, rel=1e-12, msg=name)


@pytest.mark.parametrize("spread", [1.0, 3.0])
def test_kernel_in_float32_is_within_rounding_of_the_float64_reference(spread: float) -> None:
    """float32 against float64 at L = 200 (four chunks). Budget 64 EPS32: each log weight is a logit (D
    products) plus a sum of up to L logsigmoids, each off by a few EPS32 of its size, and a weight's
    relative error is its log's absolute error; W |log W| <= 1/e keeps a far key's large log from
    mattering, and each output sums L weighted values. Observed <= 11 EPS32 (spread 3)."""
    fast = output_and_grads("kernel", *leaves(200, torch.float32, spread=spread))
    slow = output_and_grads("reference", *leaves(200, spread=spread))
    for name, a, b in zip(["out", "dq", "dk", "dv"], fast, slow, strict=True):
        assert a.dtype == torch.float32
        assert_close_to_scale(a, b, rel=64 * EPS32, msg=name)


def test_the_block_path_equals_the_reference_rows() -> None:
    """A cached decoding step (c = 5 queries against n = 150 keys, one query against 150) is the last rows
    of the whole window's attention, and of the reference; stateless: no state is kept between steps."""
    q, k, v = (t.detach() for t in leaves(150))
    with torch.no_grad():
        whole = FORM.attend(q, k, v)
        for c in (5, 1):
            step = FORM.attend(q[:, :, -c:], k, v)  # `block`: fewer queries than keys
            assert_close_to_scale(step, whole[:, :, -c:], rel=1e-12, msg=f"c={c}")
            assert_close_to_scale(step, FORM.reference(q[:, :, -c:], k, v), rel=1e-12, msg=f"ref c={c}")


def test_a_hand_worked_example() -> None:
    """Three tokens, D = 3, k_j = sqrt(3) e_j so that z_ij = q_i[j], v_j = e_j so that o_i = W_i. Row 1:
    beta_10 = sigmoid(-ln 3) = 1/4 -> A_10 = 1/4, remainder 3/4. Row 2: beta_21 = sigmoid(0) = 1/2,
    beta_20 = sigmoid(ln 3) = 3/4 -> A_21 = 1/2, A_20 = 3/4 (1 - 1/2) = 3/8, remainder (1 - 1/2)(1 - 3/4) =
    1/8. Row 0 has no earlier key: all of it stays on itself."""
    ln3 = math.log(3.0)
    q = torch.tensor([[0.0, 0.0, 0.0], [-ln3, 0.0, 0.0], [ln3, 0.0, 0.0]], dtype=torch.float64)
    k = math.sqrt(3.0) * torch.eye(3, dtype=torch.float64)
    v = torch.eye(3, dtype=torch.float64)
    rows = [[1.0, 0.0, 0.0], [1 / 4, 3 / 4, 0.0], [3 / 8, 1 / 2, 1 / 8]]
    expected = torch.tensor(rows, dtype=torch.float64)
    q, k, v = (t[None, None] for t in (q, k, v))  # (1, 1, 3, 3)
    assert_close_to_scale(FORM.probabilities(q, k, 0, 3)[0, 0], expected, rel=1e-15)
    assert_close_to_scale(FORM.attend(q, k, v)[0, 0], expected, rel=1e-15)
    assert_close_to_scale(FORM.reference(q, k, v)[0, 0], expected, rel=1e-15)
    weights, remainder = stick_breaking_all_pairs(q, k)
    assert_close_to_scale(remainder[0, 0], torch.tensor([1.0, 3 / 4, 1 / 8], dtype=torch.float64), rel=1e-15)
    assert torch.equal(weights[0, 0].diagonal(), torch.zeros(3, dtype=torch.float64))  # A has no diagonal


def test_weights_and_remainder_make_one_and_probabilities_reproduce_the_output() -> None:
    """`probabilities` (what the attention analysis and the needle evaluation read) are A below the
    diagonal and the remainder 1 - sum_j A_ij on it: every row sums to 1, no weight on a future key, the
    diagonal is prod_j (1 - beta_ij) as the reference's 1 - sum, and W V is the attention output."""
    q, k, v = (t.detach() for t in leaves(STICK_CHUNK + 9))
    probs = FORM.probabilities(q, k, 0, q.shape[-2])  # (B, H, L, L)
    weights, remainder = stick_breaking_all_pairs(q, k)
    assert_close_to_scale(probs.sum(-1), torch.ones_like(remainder), rel=1e-14)
    assert probs.triu(1).abs().max() == 0
    assert_close_to_scale(probs.tril(-1), weights, rel=1e-13, msg="A")
    assert_close_to_scale(probs.diagonal(0, -2, -1), remainder, rel=1e-13, msg="remainder")
    assert_close_to_scale(probs @ v, FORM.attend(q, k, v), rel=1e-13, msg="W V")
    rows = FORM.probabilities(q, k, 10, 30)  # a block of rows, over the keys they see
    assert rows.shape == (B, H, 20, 30)
    assert_close_to_scale(rows, probs[:, :, 10:30, :30], rel=1e-14)
    assert_close_to_scale(torch.softmax(FORM.scores(q, k, 10, 30), -1), rows, rel=1e-13, msg="softmax")


def bf16_step(autocast: bool) -> list[Tensor]:
    """Output and gradients from bf16 q, k, v (as autocast's projections give them), with or without bf16
    autocast around the forward pass; the backward runs outside it, as in `Trainer.step`."""
    q, k, v = (t.detach().bfloat16().requires_grad_() for t in leaves(STICK_CHUNK + 3))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = FORM.attend(q, k, v)
    out.float().square().sum().backward()
    return [out.detach(), *(t.grad for t in (q, k, v))]


def test_bf16_autocast_runs_the_kernel_in_float32_forward_and_backward_alike() -> None:
    """Under autocast the kernel still runs in float32 (as the backward pass, outside autocast, recomputes
    it): the same output and gradients with autocast as without, to the bit; and the analysis's
    probabilities stay float32."""
    for name, a, b in zip(["out", "dq", "dk", "dv"], bf16_step(True), bf16_step(False), strict=True):
        assert a is not None and b is not None and torch.equal(a, b), name
    q, k, _ = (t.detach().bfloat16() for t in leaves(5))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        probs = AttentionInputs(q, k, FORM).probabilities()
    assert probs.dtype == torch.float32


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an aten op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_no_op_makes_a_tensor_of_all_pairs_at_512() -> None:
    """Forward and backward at L = 512: no aten op returns more than one chunk's (B, H, 64, L) elements,
    an eighth of (B, H, L, L), which the all-pairs reference does make (the guard sees it)."""
    length = 512
    q, k, v = leaves(length, torch.float32)
    with LargestTensor() as guard:
        StickBreakingAttention.apply(q, k, v).square().sum().backward()
    assert guard.largest == B * H * STICK_CHUNK * length < B * H * length * length
    with LargestTensor() as guard, torch.no_grad():
        FORM.reference(q, k, v)
    assert guard.largest >= B * H * length * length


def test_the_encoding_is_relative_and_refuses_a_window_and_dropout() -> None:
    dims = Dims(d_model=16, n_heads=2)
    encoding = build_encoding({"_target_": "posab.encodings.stickbreaking.StickBreaking"}, dims)
    assert isinstance(encoding, StickBreaking) and encoding.relative_only and encoding.static_form
    assert isinstance(encoding.attention_form(Positions.build(4), 4, torch.float32), StickBreakingForm)
    assert encoding.distance_bias(torch.arange(4.0)) is None  # no bias by distance: the audit's curve
    with pytest.raises(ConfigError, match="model.window=8"):
        StickBreaking(Dims(d_model=16, n_heads=2, window=8))
    with pytest.raises(ValueError, match="dropout=0.1"):
        FORM.attend(*leaves(4), dropout=0.1)
