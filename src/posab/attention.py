"""The one attention function, on `scaled_dot_product_attention`.

- No bias: SDPA with `is_causal` (the fused flash kernel).
- A constant bias (ALiBi, evaluation): SDPA with one additive float mask holding the causal mask and the
  bias (the flash kernel accepts a mask).
- A bias that needs a gradient (learned biases, training on the CPU): SDPA would fall back to its
  unfused math kernel, which materialises and differentiates (B, H, L, L) tensors op by op.
  `BiasedAttention` instead runs the fused flash kernel forward with the mask as a constant, and computes
  every gradient in one pass over query chunks, recomputing the attention probabilities from the saved
  log-sum-exp (no (B, H, L, L) tensor lives longer than one chunk, and keys past the chunk are skipped by
  causality): with P = softmax(S), dP = dO V^T, D = rowsum(dO * O) and dS = P * (dP - D),
  dQ = dS K / sqrt(d), dK = dS^T Q / sqrt(d), dV = P^T dO and dMask = dS (summed over the batch when the
  mask is shared). Autograd then carries dMask into the bias (for a Toeplitz bias: the sum of dS along
  each diagonal).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

QUERY_CHUNK = 64  # measured fastest on 2 CPU cores at L=512 (64: 0.081 s, 128: 0.086 s, 256: 0.117 s)


def causal_mask(length: int, device: torch.device) -> Tensor:
    """(L, L) float: 0 on and below the diagonal, -inf above."""
    return torch.full((length, length), float("-inf"), device=device).triu(1)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    dropout: float = 0.0,
    backend: str = "sdpa",
    scale: Tensor | None = None,
) -> Tensor:
    """q, k, v: (B, H, T, D); mask: (1|B, H, T, T) additive, causal part included, or None -> (B, H, T, D).

    backend `flex` runs FlexAttention (compiled) where it can: on a GPU, and on the CPU without gradients
    (PyTorch has no FlexAttention backward on the CPU); everything else takes the SDPA paths. `scale`
    (1|B, H, T, T) multiplies q.k / sqrt(d) before the mask is added (form (2) of the design note): no
    fused kernel does that, so it takes an explicit softmax.
    """
    if scale is not None:
        return scaled_attention(q, k, v, mask, scale, dropout)
    if backend == "flex" and dropout == 0.0 and (q.device.type == "cuda" or not torch.is_grad_enabled()):
        return flex(q, k, v, mask)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)
    if mask.requires_grad and torch.is_grad_enabled() and q.device.type == "cpu" and dropout == 0.0:
        return BiasedAttention.apply(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)


def attention_scores(
    q: Tensor, k: Tensor, mask: Tensor | None, scale: Tensor | None, start: int, end: int
) -> Tensor:
    """Float32 scores of queries start:end over keys 0:end (later keys are masked anyway): (B, H, c, end).

    q k^T / sqrt(D), times `scale` (1|B, H, T, T) when given, plus `mask` (1|B, H, T, T) additive with its
    causal part, or the causal mask when there is none. The matmul runs in q's dtype."""
    scores = torch.matmul(q[:, :, start:end], k[:, :, :end].transpose(-1, -2)).float()  # (B, H, c, end)
    scores = scores / math.sqrt(q.shape[-1])
    if scale is not None:
        scores = scores * scale[..., start:end, :end]  # (1|B, H, c, end)
    if mask is None:  # -inf where key j > query i = start + row
        return scores + causal_mask(end, q.device)[start:end]  # (c, end)
    return scores + mask[..., start:end, :end]  # (1|B, H, c, end)


def attention_probabilities(
    q: Tensor, k: Tensor, mask: Tensor | None, scale: Tensor | None, start: int, end: int
) -> Tensor:
    """softmax of `attention_scores` over the keys: (B, H, c, end) float32."""
    return torch.softmax(attention_scores(q, k, mask, scale, start, end), dim=-1)


@dataclass
class AttentionInputs:
    """What one attention layer computes its probabilities from (see `DecoderLM.forward(observe=...)`)."""

    q: Tensor  # (B, H, T, D), rotated by the encoding
    k: Tensor  # (B, H, T, D), rotated by the encoding
    mask: Tensor | None  # (1|B, H, T, T) additive, causal part included, or None (causal only)
    scale: Tensor | None  # (1|B, H, T, T) multiplies q.k / sqrt(D) before the mask, or None

    def probabilities(self, start: int = 0, end: int | None = None) -> Tensor:
        """The layer's attention probabilities of queries start:end over keys 0:end, in float32 from float32
        q and k: (B, H, c, end)."""
        end = self.q.shape[-2] if end is None else end
        return attention_probabilities(self.q.float(), self.k.float(), self.mask, self.scale, start, end)


def scaled_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: Tensor, dropout: float
) -> Tensor:
    """softmax(q k^T / sqrt(d) * scale + mask) v, in float32 for the softmax -> (B, H, T, D)."""
    weights = attention_probabilities(q, k, mask, scale, 0, q.shape[-2])  # (B, H, T, T)
    weights = F.dropout(weights, dropout) if dropout else weights
    return torch.matmul(weights.to(v.dtype), v)


@functools.cache
def compiled_flex_attention() -> Callable[..., Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """FlexAttention with the mask read inside `score_mod` (causal only when there is no mask)."""

    def causal(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return torch.where(q_idx >= kv_idx, score, float("-inf"))

    def shared(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + mask[0, h, q_idx, kv_idx]

    def per_row(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + mask[b, h, q_idx, kv_idx]

    score_mod = causal if mask is None else shared if mask.shape[0] == 1 else per_row
    return compiled_flex_attention()(q, k, v, score_mod=score_mod)


class BiasedAttention(torch.autograd.Function):
    """Flash-kernel attention with a differentiable additive mask (CPU); see the module docstring."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=mask.to(q.dtype)
        )  # out: (B, H, T, D), lse: (B, H, T)
        ctx.save_for_backward(q, k, v, mask, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, d_out: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        q, k, v, mask, out, lse = ctx.saved_tensors
        d_out = d_out.to(q.dtype).contiguous()
        scale = 1.0 / math.sqrt(q.shape[-1])
        delta = (d_out.float() * out.float()).sum(-1, keepdim=True)  # (B, H, T, 1)
        dq = torch.empty_like(q)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        d_mask = torch.empty(mask.shape, dtype=torch.float32, device=mask.device)
        length = q.shape[-2]
        for start in range(0, length, QUERY_CHUNK):
            end = min(length, start + QUERY_CHUNK)  # queries start:end see keys 0:end
            q_c, k_c, v_c, d_out_c = q[:, :, start:end], k[:, :, :end], v[:, :, :end], d_out[:, :, start:end]
            probs = torch.matmul(q_c, k_c.transpose(-1, -2)).float()  # (B, H, c, end)
            probs.mul_(scale).add_(mask[..., start:end, :end]).sub_(lse[:, :, start:end, None]).exp_()
            d_scores = torch.matmul(d_out_c, v_c.transpose(-1, -2)).float()  # dP: (B, H, c, end)
            d_scores.sub_(delta[:, :, start:end]).mul_(probs)  # dS = P * (dP - D)
            d_mask[..., start:end, :end] = d_scores.sum(0, keepdim=True) if mask.shape[0] == 1 else d_scores
            d_mask[..., start:end, end:] = 0.0  # masked keys
            probs_c, d_scores_c = probs.to(q.dtype), d_scores.to(q.dtype)
            dv[:, :, :end] += torch.matmul(probs_c.transpose(-1, -2), d_out_c).float()
            dq[:, :, start:end] = torch.matmul(d_scores_c, k_c) * scale
            dk[:, :, :end] += torch.matmul(d_scores_c.transpose(-1, -2), q_c).float() * scale
        return dq, dk.to(k.dtype), dv.to(v.dtype), d_mask.to(mask.dtype)
