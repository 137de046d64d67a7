"""The CPU training kernel every additive form shares: the fused flash forward with its own backward.

`BiasedAttention` runs the fused flash kernel forward with the mask as a constant (or is_causal without
one), and computes every gradient in one pass over query chunks, recomputing the attention probabilities
from the saved log-sum-exp (no (B, H, L, L) tensor lives longer than one chunk, and keys past the chunk are
skipped by causality): with P = softmax(S), dP = dO V^T, D = rowsum(dO * O) and dS = P * (dP - D),
dQ = dS K / sqrt(d), dK = dS^T Q / sqrt(d), dV = P^T dO and dMask = dS (summed over the batch when the
mask is shared; only when the mask needs a gradient). Autograd then carries dMask into the bias (for a
Toeplitz bias: the sum of dS along each diagonal). Measured 9-12% faster per training step than SDPA's
flash backward (docs/performance.md). With bias factors (`LowRank`), dU = dS E per query chunk.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from posab.forms.base import QUERY_CHUNK, causal_mask, compute_dtype


class BiasedAttention(torch.autograd.Function):
    """Flash-kernel attention with a differentiable additive mask and/or bias factors, or causal only (CPU);
    see the module docstring. `whole` is the mask the scores get (mask + U E^T, `full_mask`), or None:
    `mask` itself, or with no mask either the causal mask alone."""

    @staticmethod
    def forward(
        ctx: Any,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        whole: Tensor | None = None,
        factor_query: Tensor | None = None,
        factor_key: Tensor | None = None,
    ) -> Tensor:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        scores_mask = mask if whole is None else whole  # None: causal only
        attn_mask = None if scores_mask is None else scores_mask.to(q.dtype)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, scores_mask is None, attn_mask=attn_mask
        )  # out: (B, H, T, D), lse: (B, H, T)
        ctx.mask_shape = None if mask is None or not ctx.needs_input_grad[3] else (mask.shape, mask.dtype)
        ctx.factor_dtype = None if factor_query is None else factor_query.dtype
        ctx.save_for_backward(q, k, v, scores_mask, factor_key, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, d_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, scores_mask, factor_key, out, lse = ctx.saved_tensors
        d_out, dtype = d_out.to(q.dtype).contiguous(), compute_dtype(q)  # float32, float64 for float64 inputs
        scale = 1.0 / math.sqrt(q.shape[-1])
        delta = (d_out.to(dtype) * out.to(dtype)).sum(-1, keepdim=True)  # (B, H, T, 1)
        dq = torch.empty_like(q)
        dk = torch.zeros(k.shape, dtype=dtype, device=k.device)
        dv = torch.zeros(v.shape, dtype=dtype, device=v.device)
        d_mask = (
            None if ctx.mask_shape is None else torch.zeros(ctx.mask_shape[0], dtype=dtype, device=q.device)
        )
        d_factor = None
        if factor_key is not None and ctx.needs_input_grad[5]:
            factor_key = factor_key.to(q.dtype)
            d_factor = torch.empty(
                *q.shape[:3], factor_key.shape[-1], dtype=dtype, device=q.device
            )  # (B, H, T, R)
        length = q.shape[-2]
        causal = causal_mask(length, q.device) if scores_mask is None else None  # (L, L)
        for start in range(0, length, QUERY_CHUNK):
            end = min(length, start + QUERY_CHUNK)  # queries start:end see keys 0:end
            q_c, k_c, v_c, d_out_c = q[:, :, start:end], k[:, :, :end], v[:, :, :end], d_out[:, :, start:end]
            chunk_mask = causal[start:end, :end] if causal is not None else scores_mask[..., start:end, :end]
            probs = torch.matmul(q_c, k_c.transpose(-1, -2)).to(dtype)  # (B, H, c, end)
            probs.mul_(scale).add_(chunk_mask).sub_(lse[:, :, start:end, None]).exp_()
            d_scores = torch.matmul(d_out_c, v_c.transpose(-1, -2)).to(dtype)  # dP: (B, H, c, end)
            d_scores.sub_(delta[:, :, start:end]).mul_(probs)  # dS = P * (dP - D)
            if d_mask is not None:  # keys past `end` are masked: their gradient stays 0
                shared = d_mask.shape[0] == 1
                d_mask[..., start:end, :end] = d_scores.sum(0, keepdim=True) if shared else d_scores
            probs_c, d_scores_c = probs.to(q.dtype), d_scores.to(q.dtype)
            if d_factor is not None:  # dU = dS E, in q's dtype as dq: (B, H, c, end) @ (B, 1, end, R)
                d_factor[:, :, start:end] = torch.matmul(d_scores_c, factor_key[:, :, :end])
            dv[:, :, :end] += torch.matmul(probs_c.transpose(-1, -2), d_out_c).to(dtype)
            dq[:, :, start:end] = torch.matmul(d_scores_c, k_c) * scale
            dk[:, :, :end] += torch.matmul(d_scores_c.transpose(-1, -2), q_c).to(dtype) * scale
        d_mask = None if d_mask is None else d_mask.to(ctx.mask_shape[1])
        d_factor = None if d_factor is None else d_factor.to(ctx.factor_dtype)
        return dq, dk.to(k.dtype), dv.to(v.dtype), d_mask, None, d_factor, None
