"""The chunked attention core (`posab.forms.chunked`, issue 57): a new kind of attention is a `Kernel` of a
few methods; its forward pass and every gradient then match autograd through the all-pairs softmax. Shown
on a toy kernel, scores A + s * tanh(A) with a learned s per head (a function of the logits, so its dA is
not dS), in float64 and with a block of queries over a longer prefix of keys."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from torch import Tensor

from posab.forms.base import compute_dtype, key_offset
from posab.forms.chunked import ChunkedAttention, Kernel, LogitGrads, Workspace, explicit_forward


class Squashed(Kernel):
    """S = A + s_h tanh(A), A = q k^T / sqrt(d), causal; its input: s (H,)."""

    chunk = 5

    def __init__(self, gain: Tensor) -> None:
        self.gain = gain
        self.d_gain: Tensor | None = None

    def inputs(self) -> tuple[Tensor | None, ...]:
        return (self.gain,)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return explicit_forward(self, q, k, v)

    def logits(self, q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
        stop = key_offset(q, k) + end
        return torch.matmul(q[:, :, start:end], k[:, :, :stop].transpose(-1, -2)) / math.sqrt(q.shape[-1])

    def scores(self, q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
        logits = self.logits(q, k, start, end)  # (B, H, c', stop)
        rows = torch.arange(key_offset(q, k) + start, key_offset(q, k) + end)[:, None]
        future = torch.arange(logits.shape[-1])[None, :] > rows  # (c', stop)
        scores = logits + self.gain[:, None, None] * torch.tanh(logits)
        return scores.masked_fill(future, float("-inf"))

    def begin_backward(self, q: Tensor, k: Tensor, needed: Sequence[bool]) -> None:
        self.d_gain = torch.zeros(self.gain.shape, dtype=compute_dtype(q)) if needed[0] else None

    def probabilities(self, q: Tensor, k: Tensor, lse: Tensor, start: int, end: int) -> tuple[Tensor, Any]:
        return self.scores(q, k, start, end).sub_(lse[..., None]).exp_(), self.logits(q, k, start, end)

    def score_backward(
        self, chunk: Any, d_scores: Tensor, q: Tensor, k: Tensor, start: int, end: int
    ) -> LogitGrads:
        squashed = torch.tanh(chunk)
        if self.d_gain is not None:
            self.d_gain += (d_scores * squashed).sum((0, 2, 3))
        d_logits = d_scores * (1 + self.gain[:, None, None] * (1 - squashed**2))
        return LogitGrads(d_logits)

    def input_grads(self) -> tuple[Tensor | None, ...]:
        return (self.d_gain,)


def all_pairs(q: Tensor, k: Tensor, v: Tensor, gain: Tensor) -> Tensor:
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, c, n)
    offset = k.shape[-2] - q.shape[-2]
    future = torch.arange(k.shape[-2])[None, :] > torch.arange(offset, k.shape[-2])[:, None]
    scores = (logits + gain[:, None, None] * torch.tanh(logits)).masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("queries", [13, 6])
def test_a_new_kernel_on_the_core_matches_autograd_through_all_pairs(queries: int) -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, queries, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 3, 13, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    gain = torch.tensor([0.5, -0.3, 1.2], dtype=torch.float64, requires_grad=True)
    d_out = torch.randn(2, 3, queries, 8, generator=g, dtype=torch.float64)
    kernel = Squashed(gain)
    out = ChunkedAttention.apply(kernel, q, k, v, *kernel.inputs())
    grads = torch.autograd.grad(out, (q, k, v, gain), d_out)
    expected = all_pairs(q, k, v, gain)
    expected_grads = torch.autograd.grad(expected, (q, k, v, gain), d_out)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_a_workspace_allocates_once_for_its_largest_chunk_and_reuses_it() -> None:
    like = torch.zeros(1)
    space = Workspace(capacity=12)
    small = space.take("rows", (2, 3), 4, like)  # a first chunk of 4 pairs: allocated for 12
    assert small.shape == (2, 3, 4) and small.is_contiguous()
    large = space.take("rows", (2, 3), 12, like)
    assert large.data_ptr() == small.data_ptr()  # the same storage: no allocation per chunk
    other = space.take("other", (2, 3), 12, like)
    assert other.data_ptr() != large.data_ptr()  # each name its own buffer
    grown = space.take("rows", (2, 3), 20, like)  # past the capacity: a buffer of the request's size
    assert grown.shape == (2, 3, 20) and grown.data_ptr() != large.data_ptr()
    assert space.take("rows", (2, 3), 20, like.double()).dtype == torch.float64  # a dtype of its own
