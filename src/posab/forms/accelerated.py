"""Attention off the CPU (and with `model.attention=flex` in evaluation on it): FlexAttention with a causal
block mask, the bias read inside the kernel from a per-distance table (b[h, q - k]; the Toeplitz matrix is
never formed) or from a mask, and SDPA for everything else.

FlexAttention is compiled per shape (dynamic=False: inductor's CPU code generation fails on some of these
kernels with dynamic shapes, torch 2.13) and every compiled graph is kept: the recompile limit is raised
to FLEX_GRAPHS for these calls only, where dynamo's default (8) made the ninth length of an evaluation fall
back to the unfused eager kernel (measured on the CPU; tests/test_forms.py). Block masks are cached per
(queries, keys, device).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

FLEX_GRAPHS = 64  # compiled graphs kept for FlexAttention: shapes x score kinds of a run's evaluations
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
FLEX_DEVICES = ("cuda", "xpu", "cpu")  # where FlexAttention compiles; elsewhere (meta, mps) SDPA runs


def flex_runs_on(device: torch.device) -> bool:
    return device.type in FLEX_DEVICES


@functools.cache
def compiled_flex() -> Callable[..., Tensor]:
    """FlexAttention compiled per shape (module docstring)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@functools.cache
def causal_blocks(queries: int, keys: int, device: str, window: int | None = None) -> object:
    """The causal block mask of c queries (the last c of n keys) over n keys, with a sliding `window`
    when given: blocks wholly outside are skipped, not computed and masked."""
    from torch.nn.attention.flex_attention import create_block_mask

    offset = keys - queries

    def causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return q_idx + offset >= kv_idx

    def banded(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (q_idx + offset >= kv_idx) & (q_idx + offset - kv_idx < window)

    rule = causal if window is None else banded
    return create_block_mask(rule, None, None, queries, keys, device=device)


def flex(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    score_mod: ScoreMod | None,
    scale: float | None = None,
    window: int | None = None,
) -> Tensor:
    """FlexAttention with the causal (or sliding-window) block mask and `score_mod` (None: causal only);
    `scale` on q.k (default 1 / sqrt(q's channels)): (B, H, c, Dv)."""
    kernel = compiled_flex()
    blocks = causal_blocks(q.shape[-2], k.shape[-2], str(q.device), window)
    with torch._dynamo.config.patch(recompile_limit=FLEX_GRAPHS):
        return kernel(q, k, v, score_mod=score_mod, block_mask=blocks, scale=scale)


def table_score_mod(table: Tensor, zero: int) -> ScoreMod:
    """score + table[h, zero + q - k]: a bias by distance read from its (H, W) table inside the kernel."""

    def bias(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + table[h, zero + q_idx - kv_idx]

    return bias


def mask_score_mod(mask: Tensor) -> ScoreMod:
    """score + mask[b, h, q, k] (mask[0, ...] when shared by the batch)."""

    def shared(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + mask[0, h, q_idx, kv_idx]

    def per_row(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + mask[b, h, q_idx, kv_idx]

    return shared if mask.shape[0] == 1 else per_row


def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout: float) -> Tensor:
    """SDPA: `is_causal` without a mask (the fused flash kernel), else the additive mask (causal part
    included)."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
