"""The one chunked attention core that every CPU kernel with its own backward pass runs on (issue 57).

With P = softmax(S) over the keys each query row sees, the backward pass of any attention whose scores S
are a function of the logits A = q k^T / sqrt(d) and of the form's own inputs is, per chunk of query rows:
dV += P^T dO, dP = dO V^T, D = rowsum(dO * O), dS = P * (dP - D); the form maps dS to dA, the gradient of
the logits (dA = dS for a bias added to them), and to the gradient of its own inputs; then
dQ = dA K / sqrt(d) and dK += dA^T Q / sqrt(d). `ChunkedAttention` saves q, k, v, the output and the
log-sum-exp once, runs the kernel's forward pass, and runs that loop in its backward pass, P recomputed
per chunk from the saved log-sum-exp: no (B, H, L, L) tensor outlives a chunk, and keys past a chunk's
last query are skipped by causality. A `Kernel` gives only what differs between forms: its forward pass
(the fused flash kernel, or `explicit_forward` over its `scores`), a chunk's probabilities, and its
scores' backward (`LogitGrads`, its own inputs' gradients kept by the kernel). The additive and low-rank
forms (`forms.kernels.Biased`), FoX's (`encodings.fox_kernel`), DAPE's (`encodings.dape_kernel`) and
CoPE's (`encodings.cope_kernel`) run on it; stick-breaking, which replaces the softmax, keeps its own.

Dtypes: the scores, their gradients and the sums over chunks are in the scores' dtype (float32; float64
for float64 inputs); the matmuls run in the kernel's `operand_dtype`, q's (bf16 under autocast: the
additive and FoX kernels) or the scores' (DAPE's and CoPE's, which compute their scores in float32).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from posab.forms.base import compute_dtype, key_offset


@dataclass
class LogitGrads:
    """What a kernel's scores' backward gives the core for one chunk of query rows."""

    logits: Tensor  # dA: (B, H, c', stop) in the scores' dtype
    scaled: bool = False  # dA carries the logits' 1/sqrt(d) already (else the core applies it after)
    query: Tensor | None = None  # a further gradient of the chunk's queries (B, H, c', D), added to dQ


class Kernel(ABC):
    """One kind of attention on the chunked core (module docstring). It holds its own inputs (the tensors
    after q, k, v that `ChunkedAttention.apply` receives, in `inputs()`'s order) and accumulates their
    gradients between `begin_backward` and `input_grads`."""

    chunk: int  # query rows per chunk of the backward pass (and of `explicit_forward`)

    def operand_dtype(self, q: Tensor) -> torch.dtype:
        """The dtype of the backward pass's matmuls: q's by default."""
        return q.dtype

    @abstractmethod
    def inputs(self) -> tuple[Tensor | None, ...]:
        """The kernel's own inputs, whose gradients `input_grads` returns in this order."""

    @abstractmethod
    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """The output (B, H, c, D) in v's dtype and every row's log-sum-exp (B, H, c) in the scores' dtype."""

    @abstractmethod
    def probabilities(self, q: Tensor, k: Tensor, lse: Tensor, start: int, end: int) -> tuple[Tensor, Any]:
        """P of query rows start:end over the keys they see (B, H, c', stop) in the scores' dtype, from the
        rows' log-sum-exp `lse` (B, H, c'), and whatever `score_backward` needs of the chunk."""

    @abstractmethod
    def begin_backward(self, q: Tensor, k: Tensor, needed: Sequence[bool]) -> None:
        """Before the chunks: allocate the gradients of the inputs `needed` (per input, in order)."""

    @abstractmethod
    def score_backward(
        self, chunk: Any, d_scores: Tensor, q: Tensor, k: Tensor, start: int, end: int
    ) -> LogitGrads:
        """From dS of the chunk (B, H, c', stop), in the scores' dtype: dA, and the kernel's own inputs'
        gradients added to what it accumulates. It may overwrite `d_scores` and `chunk`, not P."""

    @abstractmethod
    def input_grads(self) -> tuple[Tensor | None, ...]:
        """After the chunks: the gradients of `inputs()` (None where not needed), in their dtypes."""


class Workspace:
    """Flat buffers that the chunks of a pass (or the layers of one forward pass) reuse. A chunk's tensors
    are megabytes (DAPE's f: 16 MB at B = 16 and 16 query rows over 512 keys; FoX's rows of D: 64 MB for a
    whole 512-token window), and a fresh one each time pays the allocator's page faults each time (about
    2.5 ms per 16 MB on the 2-core Xeon; results/bench/issue57_refactor.md). Buffer `name` is kept while it
    is large enough, else allocated again for `capacity` (query, key) pairs per leading index, or for the
    request if it is larger: a pass whose chunks grow gives the capacity of its largest, and allocates
    once."""

    def __init__(self, capacity: int = 0) -> None:
        self.capacity = capacity
        self.buffers: dict[str, Tensor] = {}

    def take(self, name: str, leading: tuple[int, ...], pairs: int, like: Tensor) -> Tensor:
        """Buffer `name` as a contiguous (*leading, pairs) tensor in `like`'s dtype and device; its
        contents are whatever was last written there."""
        size, kept = math.prod(leading), self.buffers.get(name)
        fits = kept is not None and kept.numel() >= size * pairs
        if not fits or (kept.dtype, kept.device) != (like.dtype, like.device):
            kept = torch.empty(size * max(pairs, self.capacity), dtype=like.dtype, device=like.device)
            self.buffers[name] = kept
        return kept[: size * pairs].view(*leading, pairs)


def explicit_forward(kernel: Kernel, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """softmax(S) V by chunks of `kernel.chunk` query rows, S from `kernel.scores(q, k, start, end)` (the
    queries: the last c of the n keys), for kernels without a fused forward: the output (B, H, c, D) in v's
    dtype and every row's log-sum-exp (B, H, c) in the scores' dtype."""
    length, offset = q.shape[-2], key_offset(q, k)
    out = q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=v.dtype, device=v.device)  # (B, H, c, Dv)
    lse = torch.empty(q.shape[:3], dtype=compute_dtype(q), device=q.device)  # (B, H, c)
    for start in range(0, length, kernel.chunk):
        end = min(length, start + kernel.chunk)
        scores = kernel.scores(q, k, start, end)  # type: ignore[attr-defined]  # (B, H, c', stop)
        lse[:, :, start:end] = torch.logsumexp(scores, dim=-1)
        probs = scores.sub_(lse[:, :, start:end, None]).exp_()  # (B, H, c', stop)
        out[:, :, start:end] = torch.matmul(probs.to(v.dtype), v[:, :, : offset + end])
    return out, lse


class ChunkedAttention(torch.autograd.Function):
    """`kernel.forward`, with the shared backward pass over chunks of query rows (module docstring):
    `ChunkedAttention.apply(kernel, q, k, v, *kernel.inputs())`."""

    @staticmethod
    def forward(ctx: Any, kernel: Kernel, q: Tensor, k: Tensor, v: Tensor, *inputs: Tensor | None) -> Tensor:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out, lse = kernel.forward(q, k, v)
        ctx.kernel = kernel
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, d_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        kernel: Kernel = ctx.kernel
        dq, dk, dv = chunked_backward(kernel, q, k, v, out, lse, d_out, ctx.needs_input_grad[4:])
        return None, dq, dk, dv, *kernel.input_grads()


def chunked_backward(
    kernel: Kernel,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    d_out: Tensor,
    needed: Sequence[bool],
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv in q's, k's and v's dtypes, over chunks of `kernel.chunk` query rows (module
    docstring); the kernel's own inputs' gradients accumulate in the kernel."""
    dtype, operand, scale = compute_dtype(q), kernel.operand_dtype(q), 1.0 / math.sqrt(q.shape[-1])
    queries, offset = q.shape[-2], key_offset(q, k)
    d_out = d_out.to(operand).contiguous()
    q_op, k_op, v_op = (t.to(operand) for t in (q, k, v))
    delta = (d_out.to(dtype) * out.to(dtype)).sum(-1, keepdim=True)  # D: (B, H, c, 1)
    dq = torch.empty(q.shape, dtype=operand, device=q.device)
    dk = torch.zeros(k.shape, dtype=dtype, device=k.device)
    dv = torch.zeros(v.shape, dtype=dtype, device=v.device)
    kernel.begin_backward(q, k, needed)
    for start in range(0, queries, kernel.chunk):
        end = min(queries, start + kernel.chunk)
        stop = offset + end  # query rows start:end see keys 0:stop
        q_c, k_c, d_out_c = q_op[:, :, start:end], k_op[:, :, :stop], d_out[:, :, start:end]
        probs, chunk = kernel.probabilities(q, k, lse[:, :, start:end], start, end)  # P: (B, H, c', stop)
        d_scores = torch.matmul(d_out_c, v_op[:, :, :stop].transpose(-1, -2)).to(dtype)  # dP
        d_scores.sub_(delta[:, :, start:end]).mul_(probs)  # dS = P * (dP - D): (B, H, c', stop)
        grads = kernel.score_backward(chunk, d_scores, q, k, start, end)
        dv[:, :, :stop] += torch.matmul(probs.to(operand).transpose(-1, -2), d_out_c).to(dtype)
        d_logits = grads.logits.to(operand)
        if grads.scaled:
            dq[:, :, start:end] = torch.matmul(d_logits, k_c)
            dk[:, :, :stop] += torch.matmul(d_logits.transpose(-1, -2), q_c).to(dtype)
        else:
            dq[:, :, start:end] = torch.matmul(d_logits, k_c) * scale
            dk[:, :, :stop] += torch.matmul(d_logits.transpose(-1, -2), q_c).to(dtype) * scale
        if grads.query is not None:
            dq[:, :, start:end] += grads.query
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
