"""Perplexity at several lengths, per-position loss, and optional sliding-window perplexity.

Protocol: for each length L, the same fixed, non-overlapping windows of L tokens from the validation split
for every run (`TokenStream.fixed_windows`: evenly spread over the split, max(1, token_budget // L) of
them unless `windows` is set); each window is scored from its own start (no context carried over);
perplexity = exp(total loss / total scored tokens). Per-position loss: the mean loss at each position of
the window over all windows, averaged in `position_bins` equal-width bins.

Encodings with evaluation-time variants (`Encoding.variants`: RoPE's context-extension methods `pi`, `ntk`,
`yarn`; see `posab.encodings.rope`), at each length L past the training length: the same windows are
scored again under each variant listed in `eval.rope_scaling` at scale factor s = L / train_len (or
`eval.rope_scaling_factor`), as `loss@KIND/L`, `ppl@KIND/L` and `position_loss@KIND/L`. `none` is the plain
`ppl/L` rows. At L <= train_len no scaling applies (every method would equal `none`), so those rows are
left out.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from posab.errors import require
from posab.evaluate.base import Evaluator, SectionConfig
from posab.evaluate.context import EvalContext, EvalSettings
from posab.outputs import Column, Curves, EvalOutput, Table
from posab.results import bin_centres, bin_edges


@dataclass
class PerplexityConfig(SectionConfig):
    token_budget: int = 32768  # tokens scored per length: windows = max(1, budget // length)
    windows: int | None = None  # a fixed number of windows per length instead of the budget
    position_bins: int = 32  # per-position loss: equal-width bins over each window
    stride: int | None = None  # also report sliding-window perplexity with this stride

    def validate(self, settings: EvalSettings) -> None:
        p = "eval.perplexity"
        require(self.token_budget > 0, f"{p}.token_budget={self.token_budget} must be positive")
        require(self.windows is None or self.windows > 0, f"{p}.windows={self.windows} must be positive")
        require(self.position_bins > 0, f"{p}.position_bins={self.position_bins} must be positive")
        require(self.stride is None or self.stride > 0, f"{p}.stride={self.stride} must be positive")


def window_count(cfg: PerplexityConfig, length: int) -> int:
    return cfg.windows if cfg.windows is not None else max(1, cfg.token_budget // length)


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
    """(L,) -> `bins` means over equal-width position ranges (`bin_edges`; fewer when L < bins)."""
    edges = bin_edges(len(curve), bins)
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
    """Per-token losses (N, L) of the windows under each evaluation-time variant of the encoding listed in
    `eval.rope_scaling` (`none` excluded); empty for encodings without variants and up to the training
    length."""
    encoding = ctx.model.encoding
    kinds = [kind for kind in ctx.cfg.rope_scaling if kind in encoding.variants]
    if not kinds or length <= ctx.train_len:
        return {}
    fixed = ctx.cfg.rope_scaling_factor
    factor = length / ctx.train_len if fixed is None else fixed
    out: dict[str, Tensor] = {}
    for kind in kinds:
        with encoding.variant(kind, factor, ctx.train_len):
            out[kind] = token_losses(ctx, starts, length)
    return out


def length_rows(ctx: EvalContext, cfg: PerplexityConfig, length: int) -> dict[str, Any]:
    """Every result of one length: plain, sliding-window and per-variant rows."""
    started = time.perf_counter()
    count = window_count(cfg, length)
    starts = ctx.valid.fixed_windows(length, count)
    n_bytes = target_bytes(ctx, starts, length)
    out = loss_rows(token_losses(ctx, starts, length), f"/{length}", cfg.position_bins, n_bytes)
    out[f"ppl_windows/{length}"] = len(starts)
    if cfg.stride is not None:
        out[f"ppl_sliding/{length}"] = math.exp(sliding_loss(ctx, length, cfg.stride, count * length))
    out[f"time/ppl@{length}_s"] = round(time.perf_counter() - started, 3)
    for kind, losses in scaled_losses(ctx, starts, length).items():
        out.update(loss_rows(losses, f"@{kind}/{length}", cfg.position_bins, n_bytes))
    return out


def perplexity_table(results: dict[str, Any], lengths: list[int], sliding: bool) -> Table:
    columns, keys = ["length", "loss", "ppl", "windows"], ["loss", "ppl", "ppl_windows"]
    if sliding:
        columns, keys = [*columns, "ppl_sliding"], [*keys, "ppl_sliding"]
    return Table(columns, [[n, *(results[f"{key}/{n}"] for key in keys)] for n in lengths])


def perplexity_curves(results: dict[str, Any], lengths: list[int]) -> dict[str, Curves]:
    """Perplexity against length, and the binned loss over the window's positions at each length."""
    ppl = ([float(n) for n in lengths], [results[f"ppl/{n}"] for n in lengths])
    curves = {f"L={n}": (bin_centres(n, len(c)), c) for n in lengths if (c := results[f"position_loss/{n}"])}
    return {
        "ppl_vs_length": Curves("Perplexity vs evaluation length", "length", {"ppl": ppl}),
        "position_loss": Curves("Loss per position", "position", curves),
    }


class Perplexity(Evaluator[PerplexityConfig]):
    """Perplexity at every `eval.lengths`, per-position loss, sliding-window and variant rows."""

    name = "perplexity"
    config = PerplexityConfig
    order = 10

    def window_lengths(self, settings: EvalSettings) -> list[int]:
        return list(settings.lengths)

    def evaluate(self, ctx: EvalContext) -> EvalOutput:
        lengths = list(ctx.cfg.lengths)
        results: dict[str, Any] = {}
        for length in tqdm(lengths, desc="perplexity", disable=not ctx.cfg.progress):
            results.update(length_rows(ctx, self.cfg, length))
        data = {k: v for k, v in results.items() if isinstance(v, list)}
        return EvalOutput(
            scalars={k: v for k, v in results.items() if k not in data},
            data=data,
            tables={"perplexity": perplexity_table(results, lengths, self.cfg.stride is not None)},
            curves=perplexity_curves(results, lengths),
        )

    @staticmethod
    def report_columns(keys: Collection[str]) -> list[Column]:
        lengths = sorted({int(m[1]) for k in keys if (m := re.fullmatch(r"ppl/(\d+)", k))})
        return [
            Column(
                f"ppl@{n}",
                f"ppl/{n}",
                ".2f",
                f"perplexity over fixed non-overlapping windows of {n} tokens, each scored from its own "
                f"start (`ppl/{n}`)",
            )
            for n in lengths
        ]
