"""Selective attention's form (`posab.encodings.selective`): the scores of every head minus the selection
M, accumulated from head 0's logits A0 = q k^T / sqrt(D) of the earlier queries,

    M_ij = sum_{k = j+1 .. i-1} relu(A0_kj)   (no key j = 0: the first token is never selected away),

i.e. each earlier query k after key j adds how strongly head 0 of k attended to j. In a forward pass the
query chunks run in order and carry the column sums of relu(A0) over the rows so far (`carried`, (B, n));
in cached decoding the layer's `Selections` keeps them between steps, so a step computes what the full
forward pass does. The explicit softmax runs in float32 (the scores' dtype), autograd through it (the
training length's (B, H, L, L) scores fit; evaluation holds one chunk of rows at a time).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from posab.cache import EncodingState
from posab.forms import QUERY_CHUNK, Form, block_causal, compute_dtype
from posab.forms.base import key_offset, logits


@dataclass
class Selections(EncodingState):
    """Selective attention's decoding state of one layer: the column sums of relu(A0) over every query so
    far, one per cached key."""

    carried: Tensor | None = None  # (B, n)


def gates(head0: Tensor, first_row: int) -> Tensor:
    """relu(A0) (B, c', stop) of query rows at positions first_row .. first_row + c' - 1, kept only at keys
    before each row's own position and after the first key: (B, c', stop)."""
    rows, stop = head0.shape[-2:]
    position = torch.arange(first_row, first_row + rows, device=head0.device)[:, None]  # (c', 1)
    key = torch.arange(stop, device=head0.device)[None, :]  # (1, stop)
    kept = (key < position) & (key > 0)  # (c', stop)
    return F.relu(head0) * kept


def chunk_scores(q: Tensor, k: Tensor, carried: Tensor, start: int, end: int) -> tuple[Tensor, Tensor]:
    """The scores of query rows start:end (B, H, c', stop), -inf at future keys, and the column sums of
    their gates (B, stop) to carry on, given `carried` (B, >= stop) of the rows before `start`."""
    offset = key_offset(q, k)
    stop = offset + end
    scores = logits(q, k, start, end)  # (B, H, c', stop)
    gate = gates(scores[:, 0], offset + start)  # (B, c', stop)
    earlier = torch.cumsum(gate, dim=1) - gate  # the chunk's rows before each row: (B, c', stop)
    selection = carried[:, None, :stop] + earlier  # M: (B, c', stop)
    causal = block_causal(end - start, stop, q.device).to(scores.dtype)  # (c', stop)
    return scores - selection[:, None] + causal, gate.sum(dim=1)


@dataclass(eq=False)
class Selected(Form):
    """One layer's selective attention (module docstring), after `carried` (B, n0) of the keys cached before
    this pass (None: none), writing the sums after its queries into `state` when decoding."""

    carried: Tensor | None = None
    state: Selections | None = None

    def prior(self, q: Tensor, k: Tensor) -> Tensor:
        """The carried sums at the first query, zeros at the keys after them: (B, n) in the scores' dtype."""
        prior = torch.zeros(k.shape[0], k.shape[-2], dtype=compute_dtype(q), device=q.device)  # (B, n)
        if self.carried is not None:
            prior[:, : self.carried.shape[-1]] = self.carried
        return prior

    def attend(self, q: Tensor, k: Tensor, v: Tensor, dropout: float = 0.0, backend: str = "sdpa") -> Tensor:
        """q (B, H, c, D), k (B, H, n, D), v (B, H, n, Dv) -> (B, H, c, Dv), by chunks of query rows."""
        carried, parts, offset = self.prior(q, k), [], key_offset(q, k)
        for start in range(0, q.shape[-2], QUERY_CHUNK):
            end = min(q.shape[-2], start + QUERY_CHUNK)
            scores, column_sums = chunk_scores(q, k, carried, start, end)
            weights = F.dropout(torch.softmax(scores, dim=-1), dropout) if dropout else scores.softmax(-1)
            parts.append(torch.matmul(weights.to(v.dtype), v[:, :, : offset + end]))  # (B, H, c', Dv)
            carried = carried + F.pad(column_sums, (0, carried.shape[-1] - column_sums.shape[-1]))
        if self.state is not None:
            self.state.carried = carried.detach()
        return torch.cat(parts, dim=2)  # (B, H, c, Dv)

    def scores(self, q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
        """Scores of rows start:end (the rows before them run first, for their sums; the state unchanged)."""
        carried = self.prior(q, k)
        if start:
            _, column_sums = chunk_scores(q, k, carried, 0, start)
            carried = carried + F.pad(column_sums, (0, carried.shape[-1] - column_sums.shape[-1]))
        return chunk_scores(q, k, carried, start, end)[0]
