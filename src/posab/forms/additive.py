"""The form `additive`: softmax(q k^T / sqrt(D) + b + causal) V with a bias b shared by the batch, from a
per-distance table b[h, i - j] (ALiBi, T5, KERPLE, the multi-scale bias: `Additive.by_distance`) or, for a
bias that depends on the query as well (FIRE's normaliser), from a dense (1, H, c, n) tensor.

On the CPU the mask (b plus the causal mask, in the attention dtype) is built once per forward pass and
shared by every layer; training takes `forms.kernels.Biased` (its gradient reaches b), evaluation SDPA's fused
kernel with the mask. Elsewhere, FlexAttention reads b[h, q - k] from the table inside the kernel with a
causal block mask (`forms.accelerated`); a dense bias, or attention dropout, takes SDPA with the mask.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from posab.forms.accelerated import flex, flex_runs_on, mask_score_mod, sdpa, table_score_mod
from posab.forms.base import Form, block_causal, logits
from posab.forms.kernels import biased_attention


def block_toeplitz(table: Tensor, queries: int, keys: int) -> Tensor:
    """(H, 2n-1) values at distances -(n-1) .. n-1 -> (H, c, n) with out[h, r, j] the value at distance
    (n - c + r) - j: the rows of the last c queries. For c = n the whole Toeplitz matrix."""
    first = keys - queries  # table[:, first + r + m] = distance (n - c + r) - (n - 1 - m)
    windows = table[:, first : first + queries + keys - 1].unfold(-1, keys, 1)  # (H, c, n)
    return windows.flip(-1)  # m = n - 1 - j


@dataclass(eq=False)
class Additive(Form):
    """b: (1, H, c, n) without the causal part; `table` (H, 2n-1) over distances -(n-1) .. n-1 when b is
    a function of i - j alone (then b is formed only where a path needs it)."""

    dense: Tensor | None
    dtype: torch.dtype  # the attention dtype the mask is built in
    table: Tensor | None = None
    queries: int = 0
    keys: int = 0
    window: int | None = None  # sliding-window attention (`Causal`): keys more than window - 1 back masked

    @staticmethod
    def by_distance(
        table: Tensor, queries: int, keys: int, dtype: torch.dtype, window: int | None = None
    ) -> Additive:
        """A bias b(i - j) from its (H, 2n-1) table over distances -(n-1) .. n-1."""
        return Additive(None, dtype, table, queries, keys, window)

    def dense_bias(self) -> Tensor:
        if self.dense is not None:
            return self.dense
        return block_toeplitz(self.table, self.queries, self.keys)[None]  # (1, H, c, n)

    @functools.cached_property
    def mask(self) -> Tensor:
        """b plus the causal mask, in the attention dtype: (1, H, c, n), built once for every layer."""
        bias = self.dense_bias()
        causal = block_causal(bias.shape[-2], bias.shape[-1], bias.device, self.window)
        return (bias + causal).to(self.dtype)

    def on_cpu(self, q: Tensor, k: Tensor, v: Tensor, dropout: float, backend: str) -> Tensor:
        if dropout == 0.0 and backend == "flex" and not torch.is_grad_enabled():
            return self.accelerated(q, k, v, dropout)
        if dropout == 0.0 and torch.is_grad_enabled():
            return biased_attention(q, k, v, self.mask)  # faster than SDPA's flash backward
        return sdpa(q, k, v, self.mask, dropout)

    def accelerated(self, q: Tensor, k: Tensor, v: Tensor, dropout: float) -> Tensor:
        if dropout or not flex_runs_on(q.device):
            return sdpa(q, k, v, self.mask, dropout)
        if self.table is not None:
            zero = (self.keys - 1) + (self.keys - self.queries)  # table index of query row 0, key 0
            return flex(q, k, v, table_score_mod(self.table, zero), window=self.window)
        return flex(q, k, v, mask_score_mod(self.mask), window=self.window)

    def scores(self, q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
        scores = logits(q, k, start, end)  # (B, H, c', stop)
        return scores + self.mask[..., start:end, : scores.shape[-1]]  # (1, H, c', stop)
