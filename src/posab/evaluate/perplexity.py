"""Perplexity at several lengths, per-position loss, and optional sliding-window perplexity.

Protocol: for each length L, the same fixed, non-overlapping windows of L tokens from the validation split
for every run (`TokenStream.fixed_windows`: evenly spread over the split, max(1, token_budget // L) of
them unless `windows` is set); each window is scored from its own start (no context carried over);
perplexity = exp(total loss / total scored tokens). Per-position loss: the mean loss at each position of
the window over all windows, averaged in `position_bins` equal-width bins.

RoPE models (`isinstance(model.encoding, RoPE)`), at each length L past the training length: the same
windows are scored again under each context-extension method of `eval.rope_scaling` (`pi`, `ntk`, `yarn`;
see `posab.encodings.rope`) at scale factor s = L / train_len (or `eval.rope_scaling_factor`), as
`loss@KIND/L`, `ppl@KIND/L` and `position_loss@KIND/L`. `none` is the plain `ppl/L` rows. At L <= train_len
no scaling applies (every method would equal `none`), so those rows are left out.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from posab.encodings.rope import RoPE
from posab.evaluate.context import EvalContext


def window_count(ctx: EvalContext, length: int) -> int:
    p = ctx.cfg.perplexity
    return p.windows if p.windows is not None else max(1, p.token_budget // length)


def token_losses(ctx: EvalContext, starts: np.ndarray, length: int) -> Tensor:
    """Per-token loss of each window: (N, L) float32 on the CPU."""
    rows = []
    for i in range(0, len(starts), ctx.batch_size(length)):
        batch = ctx.valid.batch(starts[i : i + ctx.batch_size(length)], length)
        logits = ctx.logits(batch.inputs, batch.sentence, batch.paragraph)  # (B, L, V)
        loss = F.cross_entropy(
            logits.flatten(0, 1), batch.targets.flatten().to(logits.device), reduction="none"
        )
        rows.append(loss.view(batch.targets.shape).cpu())  # (B*L,) -> (B, L)
    return torch.cat(rows)


def binned(curve: Tensor, bins: int) -> list[float]:
    """(L,) -> `bins` means over equal-width position ranges (fewer when L < bins)."""
    edges = np.linspace(0, len(curve), min(bins, len(curve)) + 1).round().astype(int)
    return [float(curve[a:b].mean()) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def sliding_loss(ctx: EvalContext, length: int, stride: int, span: int) -> float:
    """Mean loss over the first `span` tokens of the split, each scored with up to `length` tokens of context.

    Windows of `length` tokens advance by `stride`; the first window scores all its tokens, every later one
    only its last `stride` tokens (tokens already scored are not scored again).
    """
    span = min(span, len(ctx.valid) - 1)
    starts = np.arange(0, max(1, span - length + 1), stride)
    losses = token_losses(ctx, starts, min(length, span))  # (N, L)
    total = float(losses[0].sum())
    count = losses.shape[1]
    scored_tail = min(stride, losses.shape[1])
    total += float(losses[1:, -scored_tail:].sum())
    count += scored_tail * (len(starts) - 1)
    return total / count


def target_bytes(ctx: EvalContext, starts: np.ndarray, length: int) -> int:
    """How many text bytes the scored tokens of these windows stand for (anchors count 0)."""
    targets = ctx.valid.batch(starts, length).targets.numpy()  # (N, L)
    return int(ctx.token_bytes[targets].sum())


def loss_rows(losses: Tensor, suffix: str, bins: int, n_bytes: int) -> dict[str, Any]:
    """(N, L) per-token losses -> `loss{suffix}`, `ppl{suffix}`, `position_loss{suffix}`, `bpb{suffix}`.

    bpb: bits per text byte, total loss / ln 2 / the bytes the scored tokens stand for; unlike per-token
    loss it compares runs whose token streams differ (anchors on/off, bytes vs BPE)."""
    mean = float(losses.mean())
    return {
        f"loss{suffix}": mean,
        f"ppl{suffix}": math.exp(mean),
        f"bpb{suffix}": float(losses.sum()) / math.log(2) / max(n_bytes, 1),
        f"position_loss{suffix}": binned(losses.mean(dim=0), bins),
    }


def scaled_losses(ctx: EvalContext, starts: np.ndarray, length: int) -> dict[str, Tensor]:
    """Per-token losses (N, L) of the windows under each RoPE scaling of `eval.rope_scaling` but `none`;
    empty for other encodings and at lengths up to the training length."""
    rope = ctx.model.encoding
    if not isinstance(rope, RoPE) or length <= ctx.train_len:
        return {}
    fixed = ctx.cfg.rope_scaling_factor
    factor = length / ctx.train_len if fixed is None else fixed
    out: dict[str, Tensor] = {}
    for kind in ctx.cfg.rope_scaling:
        if kind != "none":
            with rope.scaled(kind, factor, ctx.train_len):
                out[kind] = token_losses(ctx, starts, length)
    return out


def perplexity_eval(ctx: EvalContext) -> dict[str, Any]:
    p = ctx.cfg.perplexity
    out: dict[str, Any] = {}
    for length in tqdm(ctx.cfg.lengths, desc="perplexity", disable=not ctx.cfg.progress):
        started = time.perf_counter()
        count = window_count(ctx, length)
        starts = ctx.valid.fixed_windows(length, count)
        n_bytes = target_bytes(ctx, starts, length)
        out.update(loss_rows(token_losses(ctx, starts, length), f"/{length}", p.position_bins, n_bytes))
        out[f"ppl_windows/{length}"] = len(starts)
        if p.stride is not None:
            out[f"ppl_sliding/{length}"] = math.exp(sliding_loss(ctx, length, p.stride, count * length))
        out[f"time/ppl@{length}_s"] = round(time.perf_counter() - started, 3)
        for kind, losses in scaled_losses(ctx, starts, length).items():
            out.update(loss_rows(losses, f"@{kind}/{length}", p.position_bins, n_bytes))
    return out
