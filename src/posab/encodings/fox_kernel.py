"""FoX's attention form (`posab.encodings.fox`): softmax(q k^T / sqrt(d) + D + causal) V with the decay bias
D_ij = c_i - c_j, c the cumulative log forget gates of one sample and head (B, H, n).

D is per sample, so no mask is shared by the batch; it is rank 2 (c_i * 1 + 1 * (-c_j)), but c grows
linearly with position (c ~ -0.7 i at FoX's initialisation), so neither factor may be rounded alone:
every path forms c_i - c_j from c's float32 sums (float64 for float64 inputs) and never rounds c itself.
- On the CPU, `Forgetful` (on the chunked core, `forms.chunked`) runs the fused flash kernel over chunks
  of FORWARD_CHUNK query rows, each with its float32 rows of D (the kernel reads a float32 mask beside bf16
  q, k, v) over the keys the chunk sees; the first chunk of a window is square and takes the kernel's own
  causal mask, which skips the future keys. The core's backward recomputes P per QUERY_CHUNK rows from the
  saved log-sum-exp, and dc_j = -sum_i dS_ij (the column sums of dS; the row sums vanish: sum_j dS_ij =
  sum_j P_ij dP_ij - rowsum(dO * O) = 0). No (B, H, L, L) gradient is formed; the forward's rows of D
  live in one buffer per forward pass (a `Workspace`), the backward's one chunk at a time.
- Elsewhere, FlexAttention reads c_i - c_j from c inside the kernel (float32; its backward carries the
  gradient into the captured c); SDPA with the whole mask where FlexAttention does not run (other devices,
  attention dropout), its difference rounded to the attention dtype as a whole.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from posab.forms import QUERY_CHUNK, Causal, Form, block_causal, compute_dtype
from posab.forms.accelerated import ScoreMod, flex, flex_runs_on, sdpa
from posab.forms.base import key_offset, logits
from posab.forms.chunked import ChunkedAttention, Kernel, LogitGrads, Workspace

FORWARD_CHUNK = 512  # query rows per flash call of the forward pass: the whole window at the training length
# exp's vectorised CPU kernel takes a slow path below ~-87 (denormal or zero results): 20x slower there,
# measured; and a decay of 0.7 per token (FoX's gates at initialisation) puts every key ~125 tokens back
# there. The backward floors exp's argument at this: P below e^-80 ~ 2e-35 reads e^-80, a change no float32
# or float64 sum of <= 10^6 terms of size <= 1 can hold. (The forward's flash kernel has no such slow path.)
EXP_FLOOR = -80.0
FORWARD_FLOATS = 2**24  # at most this many floats of D per flash call (64 MiB: B = 16, H = 4, L = 512 whole)


def decay_rows(cum: Tensor, queries: int, start: int, end: int, buffer: Tensor | None = None) -> Tensor:
    """c_i - c_j of query rows start:end (the last `queries` of the n keys) over the keys they see, 0 ..
    n - queries + end - 1, in c's dtype, without the causal mask: (B, H, end - start, stop). The difference
    is taken before any rounding to the attention dtype (module docstring). `buffer`: a flat tensor whose
    prefix holds the rows, contiguous (a fresh tensor per chunk costs its page faults, and a strided view of
    a wider buffer its strides: each slower than the arithmetic on 2 CPU cores)."""
    stop = cum.shape[-1] - queries + end
    first = stop - (end - start)  # the key position of query row `start`
    shape = (*cum.shape[:2], end - start, stop)  # (B, H, c', stop)
    out = None if buffer is None else buffer[: math.prod(shape)].view(shape)
    return torch.sub(cum[..., first:stop, None], cum[..., None, :stop], out=out)


def masked(rows: Tensor, window: int | None = None) -> Tensor:
    """Rows (B, H, c', stop) of the last c' queries over their stop keys, plus the causal (or sliding-window)
    mask, in place. Causal: every key before the first row's own is seen, so only the last c' columns
    take the mask (the others' pass would add 0)."""
    queries, stop = rows.shape[-2:]
    if window is None:
        rows[..., stop - queries :].add_(block_causal(queries, queries, rows.device).to(rows.dtype))
        return rows
    return rows.add_(block_causal(queries, stop, rows.device, window).to(rows.dtype))


@dataclass(eq=False)
class ForgettingPass(Causal):
    """FoX's form for a forward pass: causal attention (no layer attends with it: `FoX.layer_form` gives
    each layer its decay bias) and the `Workspace` its layers share, freed when the pass ends. At the training
    length a layer's rows of D are its whole (B, H, L, L) window (64 MiB at B = 16, H = 4, L = 512), above
    glibc's largest mmap threshold (32 MiB), so a fresh buffer in every layer costs its page faults each
    time (the forward measured 2.3x NoPE's so, 1.6x with one buffer, on 2 shared cores). The CPU kernel is
    synchronous and never keeps the rows past its flash call (the backward recomputes them), so every layer
    may write into it in turn."""

    scratch: Workspace = field(default_factory=Workspace)


def forward_rows(cum: Tensor, queries: int) -> int:
    """Query rows per flash call: FORWARD_CHUNK, fewer where their rows of D over all n keys would pass
    FORWARD_FLOATS (a long evaluation window: 256 rows at n = 4,096, B = 4, H = 4), never below
    QUERY_CHUNK; and at most the `queries` there are."""
    fitting = FORWARD_FLOATS // math.prod(cum.shape)  # cum: (B, H, n)
    return min(queries, FORWARD_CHUNK, max(QUERY_CHUNK, fitting))


def forgetting_forward(
    q: Tensor, k: Tensor, v: Tensor, cum: Tensor, window: int | None, scratch: Workspace
) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(D) + c_i - c_j + causal) V over query chunks on the CPU (queries: the last c of
    the n keys): the output (B, H, c, D) and every row's log-sum-exp (B, H, c). A chunk of rows 0:end over
    keys 0:end (the first, without a cache) is square: the kernel's own causal mask skips its future keys."""
    queries, offset, cum = q.shape[-2], key_offset(q, k), cum.to(compute_dtype(q))
    out = q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=v.dtype, device=v.device)  # (B, H, c, Dv)
    lse = torch.empty(q.shape[:3], dtype=compute_dtype(q), device=q.device)  # (B, H, c)
    chunk = forward_rows(cum, queries)
    buffer = scratch.take("rows", cum.shape[:2], chunk * cum.shape[-1], cum).view(-1)  # (B * H * c * n,)
    for start in range(0, queries, chunk):
        end = min(queries, start + chunk)
        stop, square = offset + end, offset + start == 0 and window is None
        rows = decay_rows(cum, queries, start, end, buffer)  # (B, H, c', stop)
        mask = rows if square else masked(rows, window)
        out[:, :, start:end], lse[:, :, start:end] = (
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q[:, :, start:end], k[:, :, :stop], v[:, :, :stop], 0.0, square, attn_mask=mask
            )[:2]
        )
    return out, lse


class Forgetful(Kernel):
    """FoX's attention on the chunked core (`forms.chunked`): `forgetting_forward`, then the shared backward
    with P recomputed per QUERY_CHUNK rows (module docstring), the logits' gradient dS itself and
    dc_j = -sum_i dS_ij. Its input: c (B, H, n)."""

    chunk = QUERY_CHUNK

    def __init__(self, cum: Tensor, window: int | None, scratch: Workspace) -> None:
        self.cum, self.window, self.scratch = cum, window, scratch
        self.d_cum: Tensor | None = None
        self.rows_of: Tensor | None = None
        self.buffer: Tensor | None = None

    def inputs(self) -> tuple[Tensor | None, ...]:
        return (self.cum,)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return forgetting_forward(q, k, v, self.cum, self.window, self.scratch)

    def begin_backward(self, q: Tensor, k: Tensor, needed: Sequence[bool]) -> None:
        dtype = compute_dtype(q)
        self.d_cum = torch.zeros(self.cum.shape, dtype=dtype, device=self.cum.device) if needed[0] else None
        self.rows_of = self.cum.to(dtype)
        rows, keys = min(q.shape[-2], self.chunk), self.rows_of.shape[-1]
        self.buffer = Workspace().take("rows", self.rows_of.shape[:2], rows * keys, self.rows_of).view(-1)

    def probabilities(self, q: Tensor, k: Tensor, lse: Tensor, start: int, end: int) -> tuple[Tensor, Any]:
        """P = exp(D + q k^T / sqrt(d) - lse), floored at EXP_FLOOR before the causal mask, so that future
        keys keep P = 0: P as the forward had it."""
        stop, scale = key_offset(q, k) + end, 1.0 / math.sqrt(q.shape[-1])
        probs = decay_rows(self.rows_of, q.shape[-2], start, end, self.buffer)  # D: (B, H, c', stop)
        probs.add_(torch.matmul(q[:, :, start:end], k[:, :, :stop].transpose(-1, -2)), alpha=scale)  # S
        probs.sub_(lse[..., None]).clamp_(min=EXP_FLOOR)
        return masked(probs, self.window).exp_(), None

    def score_backward(
        self, chunk: Any, d_scores: Tensor, q: Tensor, k: Tensor, start: int, end: int
    ) -> LogitGrads:
        if self.d_cum is not None:  # dc_j = -sum_i dS_ij over the chunk's rows
            self.d_cum[..., : key_offset(q, k) + end] -= d_scores.sum(-2)
        return LogitGrads(d_scores)

    def input_grads(self) -> tuple[Tensor | None, ...]:
        return (None if self.d_cum is None else self.d_cum.to(self.cum.dtype),)


def forgetting_attention(
    q: Tensor, k: Tensor, v: Tensor, cum: Tensor, window: int | None, scratch: Workspace
) -> Tensor:
    """`Forgetful` on the chunked core: (B, H, c, D)."""
    kernel = Forgetful(cum, window, scratch)
    return ChunkedAttention.apply(kernel, q, k, v, *kernel.inputs())


def decay_score_mod(cum: Tensor, offset: int) -> ScoreMod:
    """score + (c_i - c_j) read from c (B, H, n) inside FlexAttention, query row r at key position
    offset + r; the difference first, in c's float32. The keys read a copy of c: FlexAttention's backward
    takes the gradient of a captured tensor read once per score (two reads of one tensor that needs a
    gradient fail to compile: InductorError, torch 2.11 on CUDA, `posab check-device`)."""
    keys_cum = cum.clone()  # (B, H, n)

    def decay(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + (cum[b, h, q_idx + offset] - keys_cum[b, h, kv_idx])

    return decay


@dataclass(eq=False)
class Forgetting(Form):
    """The decay bias c_i - c_j of one layer: `cum` (B, H, n) the cumulative log forget gates of every key
    (float32, float64 for float64 inputs), the queries the last `queries` of the keys."""

    cum: Tensor
    queries: int
    window: int | None = None  # sliding-window attention (`Causal`): keys more than window - 1 back masked
    # the CPU forward's buffer (the pass's, `ForgettingPass`)
    scratch: Workspace = field(default_factory=Workspace)

    def mask(self, dtype: torch.dtype) -> Tensor:
        """The whole (B, H, c, n) bias plus the causal mask, differences in float32, then in `dtype`."""
        return masked(decay_rows(self.cum, self.queries, 0, self.queries), self.window).to(dtype)

    def content_statistics(
        self, q: Tensor, k: Tensor, trained: dict[str, Tensor] | None = None
    ) -> dict[str, Tensor]:
        """For the extrapolation audit, per head over the batch, (H,) each: `gate_log` the mean log forget
        gate per token (the decay's slope, c_{n-1} / n) and `gate_bias_far` the decay at the longest
        distance of the keys, D_{n-1,0} = c_{n-1} - c_0 (the bias curve as the gates make it)."""
        cum = self.cum.detach()
        last = cum[..., -1]  # (B, H)
        return {"gate_log": (last / cum.shape[-1]).mean(0), "gate_bias_far": (last - cum[..., 0]).mean(0)}

    def dense_bias(self) -> Tensor:
        offset = self.cum.shape[-1] - self.queries
        return self.cum[..., offset:, None] - self.cum[..., None, :]  # (B, H, c, n)

    def on_cpu(self, q: Tensor, k: Tensor, v: Tensor, dropout: float, backend: str) -> Tensor:
        if dropout:
            return sdpa(q, k, v, self.mask(q.dtype), dropout)
        if backend == "flex" and not torch.is_grad_enabled():
            return self.accelerated(q, k, v, dropout)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, self.cum)):
            return forgetting_attention(q, k, v, self.cum, self.window, self.scratch)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return forgetting_forward(q, k, v, self.cum, self.window, self.scratch)[0]

    def accelerated(self, q: Tensor, k: Tensor, v: Tensor, dropout: float) -> Tensor:
        if dropout or not flex_runs_on(q.device):
            return sdpa(q, k, v, self.mask(q.dtype), dropout)
        score_mod = decay_score_mod(self.cum.to(compute_dtype(q)), key_offset(q, k))
        return flex(q, k, v, score_mod, window=self.window)

    def scores(self, q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
        scores = logits(q, k, start, end)  # (B, H, c', stop)
        return scores + masked(decay_rows(self.cum.to(scores.dtype), self.queries, start, end), self.window)
