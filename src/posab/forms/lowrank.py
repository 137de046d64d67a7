"""The form `low rank`: an additive bias that is per sample but of low rank R, U E^T, beside an optional
shared bias by distance (the hierarchical bias's sentence and paragraph levels beside its token level).

On the CPU the whole mask, the shared mask plus U E^T, is built once per forward pass in the attention
dtype (`full_mask`; one matmul of R channels) and the flash kernel reads it; in training
`forms.kernels.Biased`'s backward recomputes P from it and carries dS into the factors directly, dU = dS E per
query chunk: the (B, H, L, L) gradient of the per-sample part is never formed, nor any L x L index.
Elsewhere the factors travel as R extra channels of q and k (q' = [q, sqrt(D) U], k' = [k, E], so
q' k'^T / sqrt(D) = q k^T / sqrt(D) + U E^T) through SDPA's fused kernels: no L x L bias is formed.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from posab.forms.accelerated import flex, flex_runs_on, mask_score_mod, sdpa
from posab.forms.additive import Additive
from posab.forms.base import Form, block_causal, logits
from posab.forms.kernels import biased_attention

CHANNEL_MULTIPLE = 8  # the fused kernels' head dimensions come in multiples of 8


@dataclass
class BiasFactors:
    """An additive attention bias of rank R per sample, as two factors:
    bias[b, h, i, j] = query[b, h, i, :] . key[b, 0, j, :] (query: the last c rows of the n keys)."""

    query: Tensor  # (B, H, c, R)
    key: Tensor  # (B, 1, n, R)

    def dense(self) -> Tensor:
        """The bias itself: (B, H, c, R) @ (B, 1, R, n) -> (B, H, c, n)."""
        return torch.matmul(self.query, self.key.transpose(-1, -2))


def full_mask(mask: Tensor | None, factors: BiasFactors, dtype: torch.dtype) -> Tensor:
    """The mask (or the causal mask) plus the factors' product U E^T, in `dtype`: (B, H, c, n).

    In bf16 the product's entry (a sum of one term per level) is rounded once and the mask added to it:
    the roundings of a gathered bias summed over its levels."""
    product = torch.matmul(factors.query.to(dtype), factors.key.to(dtype).transpose(-1, -2))  # (B, H, c, n)
    causal = block_causal(product.shape[-2], product.shape[-1], product.device)
    base = (causal if mask is None else mask).to(dtype)
    return product + base if product.requires_grad else product.add_(base)  # in place: one (B, H, c, n)


def with_factor_channels(q: Tensor, k: Tensor, factors: BiasFactors) -> tuple[Tensor, Tensor]:
    """q' = [q, sqrt(D) U, 0...], k' = [k, E, 0...]: (B, H, c, D'), (B, H, n, D'), D' = D + R padded to a
    multiple of CHANNEL_MULTIPLE."""
    extra = factors.query.shape[-1]
    pad = -(q.shape[-1] + extra) % CHANNEL_MULTIPLE
    scaled = factors.query.to(q.dtype) * math.sqrt(q.shape[-1])  # (B, H, c, R)
    key = factors.key.to(k.dtype).expand(k.shape[0], k.shape[1], -1, -1)  # (B, 1, n, R) -> (B, H, n, R)
    return F.pad(torch.cat([q, scaled], -1), (0, pad)), F.pad(torch.cat([k, key], -1), (0, pad))


@dataclass(eq=False)
class LowRank(Form):
    shared: Additive | None  # the bias by distance beside the factors, or None
    factors: BiasFactors
    dtype: torch.dtype  # the attention dtype

    @property
    def shared_mask(self) -> Tensor | None:
        return None if self.shared is None else self.shared.mask

    @functools.cached_property
    def whole(self) -> Tensor:
        """The shared mask plus U E^T, without gradient, built once for every layer: (B, H, c, n)."""
        with torch.no_grad():
            return full_mask(self.shared_mask, self.factors, self.dtype)

    def dense_bias(self) -> Tensor:
        product = self.factors.dense()  # (B, H, c, n)
        return product if self.shared is None else product + self.shared.dense_bias()

    def learned(self) -> bool:
        """Whether a gradient must reach the shared bias or the factors."""
        trained = [t for t in (self.shared_mask, self.factors.query) if t is not None and t.requires_grad]
        return torch.is_grad_enabled() and bool(trained)

    def on_cpu(self, q: Tensor, k: Tensor, v: Tensor, dropout: float, backend: str) -> Tensor:
        learned = self.learned()
        if learned and dropout == 0.0:
            factors = self.factors
            return biased_attention(q, k, v, self.shared_mask, self.whole, factors.query, factors.key)
        mask = full_mask(self.shared_mask, self.factors, q.dtype) if learned else self.whole
        if dropout == 0.0 and backend == "flex" and not torch.is_grad_enabled():
            return flex(q, k, v, mask_score_mod(mask))
        if dropout == 0.0 and torch.is_grad_enabled():
            return biased_attention(q, k, v, mask)
        return sdpa(q, k, v, mask, dropout)

    def accelerated(self, q: Tensor, k: Tensor, v: Tensor, dropout: float) -> Tensor:
        wide_q, wide_k = with_factor_channels(q, k, self.factors)  # (B, H, c, D'), (B, H, n, D')
        scale = 1.0 / math.sqrt(q.shape[-1])
        mask = self.shared_mask
        if mask is None or dropout or not flex_runs_on(q.device):
            causal = mask is None
            return F.scaled_dot_product_attention(
                wide_q, wide_k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal, scale=scale
            )
        return flex(wide_q, wide_k, v, mask_score_mod(mask), scale)

    def scores(self, q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
        """With gradients to the bias, the mask through autograd (the reference); else `whole`."""
        scores = logits(q, k, start, end)  # (B, H, c', stop)
        mask = full_mask(self.shared_mask, self.factors, self.dtype) if self.learned() else self.whole
        return scores + mask[..., start:end, : scores.shape[-1]]  # (B, H, c', stop)
