"""Shift stability: shift the input and see whether the output stays stable.

Protocol: the same `eval.shift.windows` fixed, non-overlapping windows of the training length for every
run, evenly spread over the validation split less its last max(prefix_lengths) tokens (the prefix text,
which no window reaches). Each window is scored alone at offset 0 (the reference), then shifted two ways:

- offset k: every token position offset by k (`model(..., offset=k)`), same tokens. An encoding whose
  `relative_only` is True must give the reference outputs (RoPE: up to float rounding of its angles).
- prefix k: the last k tokens of the split prepended to every window, with their sentence and paragraph
  indices counted from 0 and the window's continuing after them (+1); scored on the window's positions.

Each shift is compared with the reference over all window positions: max |delta logit| (over positions,
windows and vocabulary), mean KL(p_ref || p_shift) of the next-token distributions (from float32
log_softmax; per-position values clamped at 0 against rounding), top-1 agreement (share of positions with
the same argmax), and delta loss (mean cross-entropy on the window's targets, shifted minus reference).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from posab.data import Batch, TokenStream
from posab.errors import ConfigError, require
from posab.evaluate.base import Evaluator, SectionConfig
from posab.evaluate.context import EvalContext, EvalSettings
from posab.outputs import Column, EvalOutput, Table

METRICS = ("max_abs_logit", "kl", "top1_agree", "dloss")


@dataclass
class ShiftConfig(SectionConfig):
    offsets: list[int] = field(default_factory=lambda: [1, 64, 512, 4096])
    prefix_lengths: list[int] = field(default_factory=lambda: [64, 256, 1024])
    windows: int = 8  # validation windows of the training length

    def validate(self, settings: EvalSettings) -> None:
        require(self.windows > 0, f"eval.shift.windows={self.windows} must be positive")
        bad = [k for k in self.offsets + self.prefix_lengths if k < 0]
        require(not bad, f"eval.shift offsets/prefix_lengths must be >= 0 (bad: {bad})")


@dataclass
class Prefix:
    """Tokens prepended to every window, with sentence and paragraph indices counted from 0: 3 x (k,)."""

    tokens: Tensor
    sentence: Tensor
    paragraph: Tensor

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class Agreement:
    """Running comparison of shifted with reference logits, over next-token positions."""

    positions: int = 0
    max_abs_logit: float = 0.0
    kl_sum: float = 0.0
    agree: int = 0
    loss_reference_sum: float = 0.0
    loss_shifted_sum: float = 0.0

    def add(self, reference: Tensor, shifted: Tensor, targets: Tensor) -> None:
        """reference, shifted: (B, T, V) float32 logits of the same positions; targets: (B, T)."""
        ref_logp, shift_logp = reference.log_softmax(-1), shifted.log_softmax(-1)
        kl = (ref_logp.exp() * (ref_logp - shift_logp)).sum(-1).clamp_min(0)  # (B, T)
        self.positions += targets.numel()
        self.max_abs_logit = max(self.max_abs_logit, float((shifted - reference).abs().max()))
        self.kl_sum += float(kl.double().sum())
        self.agree += int((ref_logp.argmax(-1) == shift_logp.argmax(-1)).sum())
        self.loss_reference_sum += summed_loss(ref_logp, targets)
        self.loss_shifted_sum += summed_loss(shift_logp, targets)

    def values(self) -> dict[str, float]:
        """The four metrics (`METRICS`) over every position compared."""
        n = self.positions
        return {
            "max_abs_logit": self.max_abs_logit,
            "kl": self.kl_sum / n,
            "top1_agree": self.agree / n,
            "dloss": (self.loss_shifted_sum - self.loss_reference_sum) / n,
        }


def summed_loss(log_probs: Tensor, targets: Tensor) -> float:
    """log_probs: (B, T, V), targets: (B, T) -> total cross-entropy."""
    picked = log_probs.gather(-1, targets[..., None])  # (B, T, 1)
    return -float(picked.double().sum())


def check_split_size(valid: TokenStream, length: int, cfg: ShiftConfig) -> None:
    reserved = max(cfg.prefix_lengths, default=0)
    needed = cfg.windows * length + 1 + reserved
    if len(valid) < needed:
        raise ConfigError(
            f"eval.shift needs {needed} tokens of the {valid.split} split: eval.shift.windows={cfg.windows} "
            f"windows of {length} tokens (+1 target) and {reserved} tokens of prefix text (the longest of "
            f"eval.shift.prefix_lengths={cfg.prefix_lengths}), but the split has {len(valid)}; "
            f"lower eval.shift.windows or the prefix lengths, or use more data"
        )


def shift_windows(valid: TokenStream, length: int, cfg: ShiftConfig) -> Batch:
    """The fixed windows, (W, T) each, spread over the split less its last max(prefix_lengths) tokens."""
    check_split_size(valid, length, cfg)
    end = len(valid) - max(cfg.prefix_lengths, default=0)
    head = TokenStream(valid.tokens[:end], valid.sentence[:end], valid.paragraph[:end], valid.split)
    return head.batch(head.fixed_windows(length, cfg.windows), length)


def prefix_text(valid: TokenStream, k: int) -> Prefix:
    """The last k tokens of the split, with structure indices relative to their first token."""
    rows = slice(len(valid) - k, len(valid))
    tokens, sentence, paragraph = (
        torch.from_numpy(a[rows].astype(np.int64)) for a in (valid.tokens, valid.sentence, valid.paragraph)
    )
    return Prefix(tokens, sentence - sentence[:1], paragraph - paragraph[:1])


def next_index(indices: Tensor) -> int:
    """The structure index after the last of (k,) `indices`: 0 after an empty prefix."""
    return int(indices[-1]) + 1 if len(indices) else 0


def joined(head: Tensor, tail: Tensor, shift: int) -> Tensor:
    """head: (k,) before every row of tail: (B, T) plus `shift` -> (B, k + T)."""
    return torch.cat([head.expand(len(tail), -1), tail + shift], dim=1)  # (k,) -> (B, k); (B, k + T)


def with_prefix(prefix: Prefix, windows: Batch) -> tuple[Tensor, Tensor, Tensor]:
    """Inputs, sentence and paragraph indices of the prefix followed by each window: 3 x (B, k + T)."""
    return (
        joined(prefix.tokens, windows.inputs, 0),
        joined(prefix.sentence, windows.sentence, next_index(prefix.sentence)),
        joined(prefix.paragraph, windows.paragraph, next_index(prefix.paragraph)),
    )


def rows_of(batch: Batch, rows: slice) -> Batch:
    return Batch(batch.inputs[rows], batch.targets[rows], batch.sentence[rows], batch.paragraph[rows])


def window_logits(
    ctx: EvalContext, windows: Batch, prefix: Prefix, offset: int
) -> Iterator[tuple[slice, Tensor]]:
    """Batches of windows after `prefix` at `offset`: (rows, logits (B, T, V) of the window's positions)."""
    k = len(prefix)
    size = ctx.batch_size(k + ctx.train_len)
    for start in range(0, len(windows.inputs), size):
        rows = slice(start, start + size)
        logits = ctx.logits(*with_prefix(prefix, rows_of(windows, rows)), offset=offset)  # (B, k + T, V)
        yield rows, logits[:, k:]  # (B, k + T, V) -> (B, T, V)


def agreement(ctx: EvalContext, windows: Batch, reference: Tensor, prefix: Prefix, offset: int) -> Agreement:
    result = Agreement()
    for rows, logits in window_logits(ctx, windows, prefix, offset):
        result.add(reference[rows], logits, windows.targets[rows].to(logits.device))
    return result


@torch.inference_mode()
def shift_metrics(ctx: EvalContext, cfg: ShiftConfig) -> dict[tuple[str, int], dict[str, float]]:
    """(kind, k) -> metrics, kind `offset` or `prefix`, for the validation windows (module docstring)."""
    windows = shift_windows(ctx.valid, ctx.train_len, cfg)
    no_prefix = prefix_text(ctx.valid, 0)
    reference = torch.cat([logits for _, logits in window_logits(ctx, windows, no_prefix, 0)])  # (W, T, V)
    shifts = [("offset", k, no_prefix, k) for k in cfg.offsets]
    shifts += [("prefix", k, prefix_text(ctx.valid, k), 0) for k in cfg.prefix_lengths]
    out: dict[tuple[str, int], dict[str, float]] = {}
    for kind, k, prefix, offset in tqdm(shifts, desc="shift", disable=not ctx.cfg.progress):
        out[kind, k] = agreement(ctx, windows, reference, prefix, offset).values()
    return out


class Shift(Evaluator[ShiftConfig]):
    """Offset and prefix stability: `shift/{offset,prefix}{k}/{metric}` and the `shift` table."""

    name = "shift"
    config = ShiftConfig
    order = 30

    def positions(self, settings: EvalSettings, train_len: int) -> int:
        return max([0, *self.cfg.offsets, *self.cfg.prefix_lengths]) + train_len + 1

    def evaluate(self, ctx: EvalContext) -> EvalOutput:
        metrics = shift_metrics(ctx, self.cfg)
        scalars = {
            f"shift/{kind}{k}/{name}": value
            for (kind, k), values in metrics.items()
            for name, value in values.items()
        }
        rows = [[kind, k, *(values[m] for m in METRICS)] for (kind, k), values in sorted(metrics.items())]
        return EvalOutput(scalars=scalars, tables={"shift": Table(["kind", "k", *METRICS], rows)})

    @staticmethod
    def report_columns(keys: Collection[str]) -> list[Column]:
        columns = []
        if (k := _largest(keys, r"shift/offset(\d+)/kl")) is not None:
            columns.append(
                Column(
                    f"KL offset {k}",
                    f"shift/offset{k}/kl",
                    ".3g",
                    f"mean KL(p_ref ‖ p_shift) of next-token distributions when every position is offset "
                    f"by {k}, the largest offset evaluated (`shift/offset{k}/kl`; 0 = offset-invariant)",
                )
            )
        if (k := _largest(keys, r"shift/prefix(\d+)/dloss")) is not None:
            columns.append(
                Column(
                    f"Δloss prefix {k}",
                    f"shift/prefix{k}/dloss",
                    ".3f",
                    f"mean loss change on the same window when {k} tokens of context are prepended, the "
                    f"largest prefix evaluated (`shift/prefix{k}/dloss`; < 0: the extra context helps)",
                )
            )
        return columns


def _largest(keys: Collection[str], pattern: str) -> int | None:
    """The largest integer `pattern` captures in any of `keys`, or None."""
    found = [int(m[1]) for key in keys if (m := re.fullmatch(pattern, key))]
    return max(found) if found else None
