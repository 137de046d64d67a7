"""CoPE's attention kernel (`posab.encodings.cope`): the scores of a block of query rows,

    S_ij = A_ij + s (q_i . e[p_ij]) interpolated,   A = q k^T / sqrt(D),   p_ij = sum_{t=j..i} sigmoid(A_it),

with p clamped to npos - 1, the position logits q_i . e[t] of the integer positions t = 0 .. npos - 1
interpolated linearly between floor(p) and ceil(p), and s = 1 / sqrt(D) (the reference's default) or 1
(its `--cope-nodiv`). A row's counts need its gates over every key it sees (a reverse cumulative sum), so a
chunk of query rows with all its keys is the unit: `Counting`, on the chunked core (`forms.chunked`), runs
the forward over query chunks and recomputes each chunk in the backward pass from the saved log-sum-exp.
Training and evaluation hold O(B H c n) per chunk of c queries over n keys, never (B, H, L, L); nothing
else is saved but q, k, v, the table, the output and the log-sum-exp. In a cached decoding step the queries
are the last c of the n keys (`posab.forms.base`): a new row's counts need only its own gates, so decoding
keeps no state of its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from posab.forms import Form, compute_dtype, without_autocast
from posab.forms.base import key_offset
from posab.forms.chunked import ChunkedAttention, Kernel, LogitGrads, explicit_forward

COUNT_CHUNK = 32  # queries per chunk, by the chunked core's rule, measured in bench section 7
# (`posab.bench.chunks`; results/bench/chunks: 1.024x the fastest, 16 rows)


@dataclass
class CountedChunk:
    """One query chunk of CoPE's scores, with what the backward pass differentiates through."""

    gates: Tensor  # (B, H, c, n) g = sigmoid(A), 0 at future keys
    low: Tensor  # (B, H, c, n) int64 floor(p) of the clamped count p
    weight: Tensor  # (B, H, c, n) w = p - floor(p), the weight of e[ceil(p)]
    spread: Tensor  # (B, H, c, n) u - l, the position logits' step from floor(p) to floor(p) + 1
    scores: Tensor  # (B, H, c, n) S, -inf at future keys
    reach: int  # the integer positions the chunk's counts can take: 0 .. min(n, npos - 1)


def reverse_cumsum(x: Tensor) -> Tensor:
    """out[..., j] = sum_{t >= j} x[..., t], summed from the last key back, as the reference does."""
    return x.flip(-1).cumsum(-1).flip(-1)


def masked_logits(q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
    """A = q k^T / sqrt(D) of query rows start:end over keys 0 .. n - c + end - 1, -inf at future keys (all
    in the chunk's last end - start columns), in q's dtype: (B, H, c, n). sigmoid(-inf) = 0 masks the gates
    and -inf + z the scores."""
    rows, stop = end - start, key_offset(q, k) + end
    attn = torch.matmul(q[:, :, start:end] / math.sqrt(q.shape[-1]), k[:, :, :stop].transpose(-1, -2))
    future = torch.ones(rows, rows, dtype=torch.bool, device=q.device).triu(1)  # (c, c): key after query
    attn[..., stop - rows :].masked_fill_(future, float("-inf"))
    return attn


def counted_chunk(q: Tensor, k: Tensor, table: Tensor, scale: float, start: int, end: int) -> CountedChunk:
    """CoPE's scores of query rows start:end over the keys they see, 0 .. n - c + end - 1, from q, k in the
    scores' dtype (`counted_attention`). `table`: (npos, D) e[t] in that dtype; `scale`: s. The position
    logits are l + w (u - l), l = z[floor p] and u - l = z[floor p + 1] - z[floor p] from the row's logits
    z[t] = s q . e[t] at the t a count of the chunk can reach (p <= n: a row sees at most n keys), 0 past
    the last (a count there has w = 0). Autograd can differentiate it (the form's all-pairs `reference`):
    nothing it saves is changed in place."""
    top, stop = table.shape[0] - 1, key_offset(q, k) + end
    reach = min(stop, top) + 1
    attn = masked_logits(q, k, start, end)  # A: (B, H, c, n)
    gates = torch.sigmoid(attn)
    counts = reverse_cumsum(gates)  # p: (B, H, c, n), 0 at future keys
    if stop > top:  # the clamp acts only past npos - 1 keys (never in training at the default npos)
        counts = counts.clamp(max=top)
    floor = counts.floor()
    weight = counts - floor
    low = floor.long()
    table_logits = torch.matmul(q[:, :, start:end], table[:reach].t()) * scale  # z: (B, H, c, reach)
    steps = F.pad(table_logits.diff(dim=-1), (0, 1))  # z[t + 1] - z[t], 0 at the last t: (B, H, c, reach)
    spread = steps.gather(-1, low)
    scores = torch.addcmul(table_logits.gather(-1, low), weight, spread).add_(attn)  # (B, H, c, n)
    return CountedChunk(gates, low, weight, spread, scores, reach)


def in_scores_dtype(*tensors: Tensor) -> list[Tensor]:
    """q, k, v as the kernel reads them: in the scores' dtype (float32 from bf16), contiguous (the model's
    are views of one projection: a matmul over their prefixes would copy them in every chunk)."""
    dtype = compute_dtype(tensors[0])
    return [t.to(dtype).contiguous() for t in tensors]


def counted_attention(q: Tensor, k: Tensor, v: Tensor, table: Tensor, scale: float, dropout: float) -> Tensor:
    """Attention with CoPE's scores (module docstring): (B, H, c, D) in v's dtype. The scores run in float32
    (float64 from float64) under any autocast, in the forward pass as in the backward's recomputation. No
    attention dropout: the scores have no fused kernel to drop from (the study runs without it)."""
    if dropout:
        raise ValueError(f"model.dropout={dropout}: attention with contextual positions (CoPE) has none")
    with without_autocast(q.device):
        inputs = in_scores_dtype(q, k, v)
        kernel = Counting(table, scale)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (*inputs, table)):
            out = ChunkedAttention.apply(kernel, *inputs, table)
        else:
            out = kernel.forward(*inputs)[0]
    return out.to(v.dtype)


class Counting(Kernel):
    """CoPE's attention on the chunked core (`forms.chunked`): softmax(S) V by chunks of COUNT_CHUNK query
    rows (`explicit_forward` over `counted_chunk`), and the shared backward with, through S = A + l +
    w (u - l) (l = z[floor p], u = z[floor p + 1], w = p - floor p, z[t] = s q . e[t]): dz scattered from
    dS (1 - w) at floor(p) and dS w at floor(p) + 1, dp = dS (u - l) (0 at a clamped count: u - l = 0 at
    npos - 1, the clamp's gradient; and, as the reference's ceil(p) = floor(p) makes it, at an integer
    count), dg_it = sum_{j <= t} dp_ij (the adjoint of the reverse cumulative sum), dA = dS + dg g (1 - g)
    (the logits' gradient, into dq, dk), and dq += dz s e, de += dz s q. q, k, v arrive in the scores'
    dtype (`counted_attention`); its input: the table e (npos, D)."""

    chunk = COUNT_CHUNK

    def __init__(self, table: Tensor, scale: float) -> None:
        self.table, self.scale = table, scale
        self.table_q: Tensor | None = None  # e in q's dtype
        self.d_table: Tensor | None = None

    def operand_dtype(self, q: Tensor) -> torch.dtype:
        return compute_dtype(q)

    def inputs(self) -> tuple[Tensor | None, ...]:
        return (self.table,)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.table_q = self.table.to(q.dtype)
        return explicit_forward(self, q, k, v)

    def scores(self, q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
        return counted_chunk(q, k, self.table_q, self.scale, start, end).scores

    def begin_backward(self, q: Tensor, k: Tensor, needed: Sequence[bool]) -> None:
        self.table_q = self.table.to(q.dtype)
        self.d_table = torch.zeros_like(self.table_q)

    def probabilities(self, q: Tensor, k: Tensor, lse: Tensor, start: int, end: int) -> tuple[Tensor, Any]:
        chunk = counted_chunk(q, k, self.table_q, self.scale, start, end)
        return chunk.scores.sub_(lse[..., None]).exp_(), chunk  # P: (B, H, c, stop)

    def score_backward(
        self, chunk: Any, d_scores: Tensor, q: Tensor, k: Tensor, start: int, end: int
    ) -> LogitGrads:
        d_table_logits, d_attn = position_grads(chunk, d_scores)  # (B, H, c, reach), (B, H, c, stop)
        d_attn = d_attn.mul_(1.0 / math.sqrt(q.shape[-1]))  # dA / sqrt(D): into q . k
        d_table_logits = d_table_logits.mul_(self.scale)  # into q . e[t]
        # de[t] = sum over batch, heads and rows of d(q . e[t]) q: (B*H*c, T)^T (B*H*c, D) -> (T, D)
        self.d_table[: chunk.reach] += d_table_logits.flatten(0, 2).t() @ q[:, :, start:end].flatten(0, 2)
        return LogitGrads(
            d_attn, scaled=True, query=torch.matmul(d_table_logits, self.table_q[: chunk.reach])
        )

    def input_grads(self) -> tuple[Tensor | None, ...]:
        return (self.d_table.to(self.table.dtype),)


def position_grads(chunk: CountedChunk, d_scores: Tensor) -> tuple[Tensor, Tensor]:
    """From dS (B, H, c, n): the gradient of the position logits z (B, H, c, reach) and of the logits A
    (B, H, c, n), the gates' path included (`Counting`)."""
    to_upper = d_scores * chunk.weight  # dS w, to z[floor p + 1]
    d_table_logits = d_scores.new_zeros(*d_scores.shape[:3], chunk.reach + 1)  # (B, H, c, reach + 1)
    d_table_logits[..., :-1].scatter_add_(-1, chunk.low, d_scores - to_upper)
    d_table_logits[..., 1:].scatter_add_(-1, chunk.low, to_upper)  # index `reach`: from w = 0 only
    d_counts = chunk.spread.mul_(d_scores).masked_fill_(chunk.weight == 0, 0.0)  # dp
    d_gates = d_counts.cumsum(-1)  # dg_it = sum_{j <= t} dp_ij
    gates = chunk.gates
    slope = torch.addcmul(gates, gates, gates, value=-1.0)  # g (1 - g): 0 at future keys, where g = 0
    return d_table_logits[..., :-1], d_gates.mul_(slope).add_(d_scores)


@dataclass
class PositionCounts:
    """CoPE's position counts of each query row, before the clamp (the extrapolation audit reads them):
    (B, H, c) float32 each."""

    largest: Tensor  # p_i0 = sum_{t <= i} g_it: the count over every key the row sees, its largest p_ij
    mean: Tensor  # the mean of p_ij over the row's keys j <= i
    past: Tensor  # the share of the row's keys whose count passes the limit, p_ij > limit
    limit: Tensor  # (1|H,) the limit: npos - 1 by default (those keys read the clamped e[npos - 1])


@dataclass(eq=False)
class Counted(Form):
    """CoPE's form, one per layer: its scores on every path (the chunked kernel is plain PyTorch, so it runs
    on any device), with the layer's table e (npos, D) and the position logits' scale s."""

    table: Tensor  # (npos, D)
    scale: float

    def on_cpu(self, q: Tensor, k: Tensor, v: Tensor, dropout: float, backend: str) -> Tensor:
        return counted_attention(q, k, v, self.table, self.scale, dropout)

    def accelerated(self, q: Tensor, k: Tensor, v: Tensor, dropout: float) -> Tensor:
        return counted_attention(q, k, v, self.table, self.scale, dropout)

    def block(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return counted_attention(q, k, v, self.table, self.scale, 0.0)

    def scores(self, q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
        with without_autocast(q.device):
            q, k = in_scores_dtype(q, k)
            return counted_chunk(q, k, self.table.to(q.dtype), self.scale, start, end).scores

    def content_statistics(
        self, q: Tensor, k: Tensor, trained: dict[str, Tensor] | None = None
    ) -> dict[str, Tensor]:
        """The extrapolation audit's view of the counts (per head, mean over the batch unless named): the
        count at the window's last query (`cope_count_last`), each row's mean count (`cope_count_mean`),
        the largest count of any pair (`cope_count_max`, over the batch), and the share of pairs counted
        past npos - 1 (`cope_clamped`), averaged over the rows. With the statistics at the training length
        (`trained`), also the share counted past each head's largest count there (`cope_past_trained`):
        table rows above it were barely trained (e[t] learns only from counts in (t - 1, t + 1)), so those
        pairs read an untrained row, zero at init, well before the clamp at npos - 1."""
        counts = self.position_counts(q, k)
        found = {
            "cope_count_last": counts.largest[..., -1].mean(0),
            "cope_count_mean": counts.mean.mean((0, 2)),
            "cope_count_max": counts.largest.amax((0, 2)),
            "cope_clamped": counts.past.mean((0, 2)),
        }
        if trained is not None:
            limit = trained["cope_count_max"].to(q.device)  # (H,)
            found["cope_past_trained"] = self.position_counts(q, k, limit).past.mean((0, 2))
        return found

    @torch.no_grad()
    def position_counts(self, q: Tensor, k: Tensor, limit: Tensor | float | None = None) -> PositionCounts:
        """The counts p_ij of every query row over the keys it sees, unclamped, summarised per row
        (`PositionCounts`), from the layer's q (B, H, c, D) and k (B, H, n, D), by query chunks. `limit`:
        a number, or one per head (H,) (e.g. the largest count each head reached at the training length);
        None: npos - 1, the clamp's."""
        rows, offset = q.shape[-2], key_offset(q, k)
        limit = torch.as_tensor(self.table.shape[0] - 1 if limit is None else limit, device=q.device).float()
        limit = limit.reshape(-1)  # (1|H,)
        parts: list[tuple[Tensor, Tensor, Tensor]] = []
        with without_autocast(q.device):
            q, k = (t.float().contiguous() for t in (q, k))
            for start in range(0, rows, COUNT_CHUNK):
                end = min(rows, start + COUNT_CHUNK)
                counts = reverse_cumsum(torch.sigmoid(masked_logits(q, k, start, end)))  # (B, H, c', stop)
                seen = torch.arange(offset + start + 1, offset + end + 1, device=q.device)  # keys: (c',)
                past = (counts > limit[:, None, None]).sum(-1) / seen  # (B, H, c')
                parts.append((counts[..., 0], counts.sum(-1) / seen, past))
        largest, mean, past = (torch.cat(part, dim=-1) for part in zip(*parts, strict=True))
        return PositionCounts(largest, mean, past.float(), limit)
