"""The CPU training kernel of the additive and low-rank forms, on the chunked core (`forms.chunked`).

`Biased` runs the fused flash kernel forward with the mask as a constant (or is_causal without one); the
core's backward recomputes P per chunk of QUERY_CHUNK query rows from the saved log-sum-exp, and the
kernel carries dS into its own inputs: dMask = dS (summed over the batch when the mask is shared; only
when the mask needs a gradient; autograd then carries it into the bias: for a Toeplitz bias, the sum of dS
along each diagonal), and with bias factors (`LowRank`) dU = dS E per query chunk. The logits' gradient is
dS itself. Measured 9-12% faster per training step than SDPA's flash backward (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from posab.forms.base import QUERY_CHUNK, causal_mask, compute_dtype
from posab.forms.chunked import ChunkedAttention, Kernel, LogitGrads, explicit_forward


class Biased(Kernel):
    """Flash-kernel attention with a differentiable additive mask and/or bias factors, or causal only (CPU);
    see the module docstring. `whole` is the mask the scores get (mask + U E^T, `full_mask`), or None:
    `mask` itself, or with no mask either the causal mask alone."""

    chunk = QUERY_CHUNK

    def __init__(
        self,
        mask: Tensor | None = None,
        whole: Tensor | None = None,
        factor_query: Tensor | None = None,
        factor_key: Tensor | None = None,
    ) -> None:
        self.mask, self.whole, self.factor_query, self.factor_key = mask, whole, factor_query, factor_key
        self.scores_mask = mask if whole is None else whole  # None: causal only
        self.d_mask: Tensor | None = None
        self.d_factor: Tensor | None = None
        self.causal: Tensor | None = None

    def inputs(self) -> tuple[Tensor | None, ...]:
        return self.mask, self.whole, self.factor_query, self.factor_key

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if q.shape[-1] != v.shape[-1]:  # wider q and k (PoPE's): the flash kernel needs one head size
            return explicit_forward(self, q, k, v)
        attn_mask = None if self.scores_mask is None else self.scores_mask.to(q.dtype)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, self.scores_mask is None, attn_mask=attn_mask
        )[:2]  # out: (B, H, T, D), lse: (B, H, T)
        return out, lse

    def begin_backward(self, q: Tensor, k: Tensor, needed: Sequence[bool]) -> None:
        dtype = compute_dtype(q)
        if self.mask is not None and needed[0]:
            self.d_mask = torch.zeros(self.mask.shape, dtype=dtype, device=q.device)
        if self.factor_key is not None and needed[2]:
            self.d_factor = torch.empty(*q.shape[:3], self.factor_key.shape[-1], dtype=dtype, device=q.device)
        # (L, L): the causal mask alone, when no mask gives the scores theirs
        self.causal = causal_mask(q.shape[-2], q.device) if self.scores_mask is None else None

    def scores(self, q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
        """q k^T / sqrt(d) + mask of query rows start:end over keys 0:end (c = n here), in the scores' dtype:
        (B, H, c', end)."""
        dtype, scale = compute_dtype(q), 1.0 / q.shape[-1] ** 0.5
        if self.scores_mask is None and self.causal is None:
            self.causal = causal_mask(q.shape[-2], q.device)
        chunk_mask = (
            self.causal[start:end, :end]
            if self.causal is not None
            else self.scores_mask[..., start:end, :end]
        )
        scores = torch.matmul(q[:, :, start:end], k[:, :, :end].transpose(-1, -2)).to(dtype)  # (B, H, c, end)
        return scores.mul_(scale).add_(chunk_mask)

    def probabilities(self, q: Tensor, k: Tensor, lse: Tensor, start: int, end: int) -> tuple[Tensor, Any]:
        """P = exp(q k^T / sqrt(d) + mask - lse) of query rows start:end over keys 0:end (c = n here)."""
        return self.scores(q, k, start, end).sub_(lse[..., None]).exp_(), None

    def score_backward(
        self, chunk: Any, d_scores: Tensor, q: Tensor, k: Tensor, start: int, end: int
    ) -> LogitGrads:
        if self.d_mask is not None:  # keys past `end` are masked: their gradient stays 0
            shared = self.d_mask.shape[0] == 1
            self.d_mask[..., start:end, :end] = d_scores.sum(0, keepdim=True) if shared else d_scores
        if self.d_factor is not None:  # dU = dS E, in q's dtype as dq: (B, H, c, end) @ (B, 1, end, R)
            factor_key = self.factor_key.to(q.dtype)
            self.d_factor[:, :, start:end] = torch.matmul(d_scores.to(q.dtype), factor_key[:, :, :end])
        return LogitGrads(d_scores)

    def input_grads(self) -> tuple[Tensor | None, ...]:
        d_mask = None if self.d_mask is None else self.d_mask.to(self.mask.dtype)
        d_factor = None if self.d_factor is None else self.d_factor.to(self.factor_query.dtype)
        return d_mask, None, d_factor, None


def biased_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    whole: Tensor | None = None,
    factor_query: Tensor | None = None,
    factor_key: Tensor | None = None,
) -> Tensor:
    """`Biased` on the chunked core: (B, H, T, D)."""
    kernel = Biased(mask, whole, factor_query, factor_key)
    return ChunkedAttention.apply(kernel, q, k, v, *kernel.inputs())
