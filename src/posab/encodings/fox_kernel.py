"""FoX's attention form (`posab.encodings.fox`): softmax(q k^T / sqrt(d) + D + causal) V with the decay bias
D_ij = c_i - c_j, c the cumulative log forget gates of one sample and head (B, H, n).

D is per sample, so no mask is shared by the batch; it is rank 2 (c_i * 1 + 1 * (-c_j)), but c grows
linearly with position (c ~ -0.7 i at FoX's initialisation), so neither factor may be rounded alone:
every path forms c_i - c_j from c's float32 sums (float64 for float64 inputs) and never rounds c itself.
- On the CPU, `ForgettingAttention` runs the fused flash kernel over chunks of FORWARD_CHUNK query rows,
  each with its float32 rows of D (the kernel reads a float32 mask beside bf16 q, k, v) over the keys the
  chunk sees; the first chunk of a window is square and takes the kernel's own causal mask, which skips
  the future keys. Its backward recomputes P per QUERY_CHUNK rows from the saved log-sum-exp as
  `BiasedAttention` does, with dc_j = -sum_i dS_ij (the column sums of dS; the row sums vanish: sum_j dS_ij
  = sum_j P_ij dP_ij - rowsum(dO * O) = 0). No (B, H, L, L) gradient is formed; the forward's rows of D
  live in one buffer per forward pass (`Scratch`), the backward's one chunk at a time.
- Elsewhere, FlexAttention reads c_i - c_j from c inside the kernel (float32; its backward carries the
  gradient into the captured c); SDPA with the whole mask where FlexAttention does not run (other devices,
  attention dropout), its difference rounded to the attention dtype as a whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from posab.forms import QUERY_CHUNK, Causal, Form, block_causal, compute_dtype
from posab.forms.accelerated import ScoreMod, flex, flex_runs_on, sdpa
from posab.forms.base import key_offset, logits

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


def rows_buffer(cum: Tensor, rows: int, dtype: torch.dtype) -> Tensor:
    """A flat buffer for `decay_rows` of up to `rows` query rows over all n keys: (B * H * rows * n,)."""
    return torch.empty(math.prod(cum.shape) * rows, dtype=dtype, device=cum.device)


class Scratch:
    """One flat buffer for the forward pass's rows of D, shared by the layers of one forward pass (held by
    its `ForgettingPass`, freed with it): at the training length a layer's rows are its whole (B, H, L, L)
    window (64 MiB at B = 16, H = 4, L = 512), above glibc's largest mmap threshold (32 MiB), so a fresh
    buffer in every layer costs its page faults each time (the forward measured 2.3x NoPE's so, 1.6x with
    one buffer, on 2 shared cores). The CPU kernel is synchronous and never keeps the rows past its flash
    call (the backward recomputes them), so every layer may write into it in turn."""

    def __init__(self) -> None:
        self.buffer: Tensor | None = None

    def take(self, cum: Tensor, rows: int, dtype: torch.dtype) -> Tensor:
        """A flat buffer as `rows_buffer`'s, the kept one when it is large enough."""
        kept, size = self.buffer, math.prod(cum.shape) * rows
        if kept is None or kept.numel() < size or kept.dtype != dtype or kept.device != cum.device:
            self.buffer = kept = rows_buffer(cum, rows, dtype)
        return kept


@dataclass(eq=False)
class ForgettingPass(Causal):
    """FoX's form for a forward pass: causal attention (no layer attends with it: `FoX.layer_form` gives
    each layer its decay bias) and the `Scratch` its layers share, freed when the pass ends."""

    scratch: Scratch = field(default_factory=Scratch)


def forward_rows(cum: Tensor, queries: int) -> int:
    """Query rows per flash call: FORWARD_CHUNK, fewer where their rows of D over all n keys would pass
    FORWARD_FLOATS (a long evaluation window: 256 rows at n = 4,096, B = 4, H = 4), never below
    QUERY_CHUNK; and at most the `queries` there are."""
    fitting = FORWARD_FLOATS // math.prod(cum.shape)  # cum: (B, H, n)
    return min(queries, FORWARD_CHUNK, max(QUERY_CHUNK, fitting))


def forgetting_forward(
    q: Tensor, k: Tensor, v: Tensor, cum: Tensor, window: int | None, scratch: Scratch
) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(D) + c_i - c_j + causal) V over query chunks on the CPU (queries: the last c of
    the n keys): the output (B, H, c, D) and every row's log-sum-exp (B, H, c). A chunk of rows 0:end over
    keys 0:end (the first, without a cache) is square: the kernel's own causal mask skips its future keys."""
    queries, offset, cum = q.shape[-2], key_offset(q, k), cum.to(compute_dtype(q))
    out = torch.empty(q.shape, dtype=v.dtype, device=v.device)  # (B, H, c, D)
    lse = torch.empty(q.shape[:3], dtype=compute_dtype(q), device=q.device)  # (B, H, c)
    chunk = forward_rows(cum, queries)
    buffer = scratch.take(cum, chunk, cum.dtype)
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


class ForgettingAttention(torch.autograd.Function):
    """`forgetting_forward` with its own backward over query chunks (module docstring): with P = softmax(S),
    dS = P * (dP - rowsum(dO * O)), dQ = dS K / sqrt(d), dK = dS^T Q / sqrt(d), dV = P^T dO and
    dc_j = -sum_i dS_ij."""

    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, cum: Tensor, window: int | None, scratch: Scratch
    ) -> Tensor:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out, lse = forgetting_forward(q, k, v, cum, window, scratch)
        ctx.window = window
        ctx.save_for_backward(q, k, v, cum, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, d_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, cum, out, lse = ctx.saved_tensors
        dtype, scale = compute_dtype(q), 1.0 / math.sqrt(q.shape[-1])
        d_out = d_out.to(q.dtype).contiguous()
        delta = (d_out.to(dtype) * out.to(dtype)).sum(-1, keepdim=True)  # (B, H, c, 1)
        dq = torch.empty_like(q)
        dk = torch.zeros(k.shape, dtype=dtype, device=k.device)
        dv = torch.zeros(v.shape, dtype=dtype, device=v.device)
        d_cum = torch.zeros(cum.shape, dtype=dtype, device=cum.device) if ctx.needs_input_grad[3] else None
        queries, offset, rows_of = q.shape[-2], key_offset(q, k), cum.to(dtype)
        buffer = rows_buffer(rows_of, min(queries, QUERY_CHUNK), dtype)
        for start in range(0, queries, QUERY_CHUNK):
            end = min(queries, start + QUERY_CHUNK)
            stop = offset + end  # query rows start:end see keys 0:stop
            q_c, k_c, d_out_c = q[:, :, start:end], k[:, :, :stop], d_out[:, :, start:end]
            probs = decay_rows(rows_of, queries, start, end, buffer)  # D: (B, H, c', stop)
            probs.add_(torch.matmul(q_c, k_c.transpose(-1, -2)), alpha=scale)  # S, in the scores' dtype
            probs.sub_(lse[:, :, start:end, None]).clamp_(min=EXP_FLOOR)  # floored before the causal mask,
            masked(probs, ctx.window).exp_()  # so future keys keep P = 0: P as the forward had it
            d_scores = torch.matmul(d_out_c, v[:, :, :stop].transpose(-1, -2)).to(dtype)  # dP
            d_scores.sub_(delta[:, :, start:end]).mul_(probs)  # dS = P * (dP - D): (B, H, c', stop)
            if d_cum is not None:  # dc_j = -sum_i dS_ij over the chunk's rows
                d_cum[..., :stop] -= d_scores.sum(-2)
            probs_c, d_scores_c = probs.to(q.dtype), d_scores.to(q.dtype)
            dv[:, :, :stop] += torch.matmul(probs_c.transpose(-1, -2), d_out_c).to(dtype)
            dq[:, :, start:end] = torch.matmul(d_scores_c, k_c) * scale
            dk[:, :, :stop] += torch.matmul(d_scores_c.transpose(-1, -2), q_c).to(dtype) * scale
        d_cum = None if d_cum is None else d_cum.to(cum.dtype)
        return dq, dk.to(k.dtype), dv.to(v.dtype), d_cum, None, None


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
    scratch: Scratch = field(
        default_factory=Scratch
    )  # the CPU forward's buffer (the pass's, `ForgettingPass`)

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
            return ForgettingAttention.apply(q, k, v, self.cum, self.window, self.scratch)
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
