"""Shift stability: shift the input and see whether the output stays stable.

Protocol: the same `eval.shift.windows` fixed, non-overlapping windows of the training length T for every
run, evenly spread over the evaluated split (`eval.split`, validation by default) less its last
`prefixes` x max(prefix_lengths) tokens (the unrelated prefix texts, which no window reaches). Every input
fed to the model is at most T tokens long, so that a shift never mixes in length extrapolation. Three
kinds of shift, each compared with a reference:

- offset k (`shift/offset{k}/...`): the whole window with every token position offset by k
  (`model(..., offset=k)`), same tokens, against the window at offset 0. An encoding whose `relative_only`
  is True must give the reference outputs (RoPE: up to float rounding of its angles).
- prefix k (`shift/prefix{k}/...`, 0 < k < T): the window's last T - k tokens scored alone (the reference,
  positions 0..T-k-1) against the same tokens after k tokens of unrelated text (an input of exactly T
  tokens), averaged over `eval.shift.prefixes` different texts: the j-th (j = 0, 1, ...) ends
  j x max(prefix_lengths) tokens before the end of the split. Prefix sentence and paragraph indices count
  from 0 and the window's continue after them (+1). Delta loss > 0: unrelated text distracts. (Before the
  context kind existed, prefix k meant k tokens prepended to the whole window, an input of T + k tokens.)
- context k (`shift/context{k}/...`): the same last T - k tokens after the k tokens that really precede
  them in the split (the whole window, scored on its last T - k positions) against the same reference.
  Delta loss < 0: the model uses the real context.

Each shift is compared with its reference over the scored positions: max |delta logit| (over positions,
windows, vocabulary and prefix texts), mean KL(p_ref || p_shift) of the next-token distributions (from
float32 log_softmax; per-position values clamped at 0 against rounding), top-1 agreement (share of
positions with the same argmax), and delta loss (mean cross-entropy on the scored targets, shifted minus
reference); the means run over every (prefix text, window, position). Keys: `posab.keys`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from posab.catalog import shift as shift_columns
from posab.data import Batch, TokenStream
from posab.errors import ConfigError, require
from posab.evaluate.base import Evaluator, SectionConfig
from posab.evaluate.context import EvalContext, EvalSettings
from posab.keys import SHIFT_KINDS, SHIFT_METRICS, metric_key
from posab.outputs import EvalOutput, Table

METRICS = SHIFT_METRICS  # the columns of the `shift` table, in this order
KINDS = SHIFT_KINDS  # its rows: offset, prefix, context


@dataclass
class ShiftConfig(SectionConfig):
    offsets: list[int] = field(default_factory=lambda: [1, 64, 512, 4096])
    prefix_lengths: list[int] = field(default_factory=lambda: [64, 128, 256])  # each below the train length
    prefixes: int = 4  # unrelated prefix texts per prefix length, averaged over
    windows: int = 8  # validation windows of the training length

    def validate(self, settings: EvalSettings) -> None:
        require(self.windows > 0, f"eval.shift.windows={self.windows} must be positive")
        require(self.prefixes > 0, f"eval.shift.prefixes={self.prefixes} must be positive (texts per length)")
        bad = [k for k in self.offsets if k < 0]
        require(not bad, f"eval.shift.offsets={self.offsets}: every offset must be >= 0 (bad: {bad})")
        bad = [k for k in self.prefix_lengths if k < 1]
        require(
            not bad,
            f"eval.shift.prefix_lengths={self.prefix_lengths}: every prefix length must be >= 1 and below "
            f"the training length (bad: {bad})",
        )

    def check_prefix_lengths(self, train_len: int) -> None:
        """Every prefix length in 1..train_len - 1: prefix and scored tokens fill one training input."""
        bad = [k for k in self.prefix_lengths if not 0 < k < train_len]
        require(
            not bad,
            f"eval.shift.prefix_lengths={self.prefix_lengths}: every prefix length must be in "
            f"1..{train_len - 1}, below the training length train.seq_len={train_len} (prefix + scored "
            f"tokens = one input of that length); bad: {bad}",
        )


@dataclass
class Prefix:
    """Tokens before every row, with sentence and paragraph indices counted from 0: 3 x (k,)."""

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


def reserved(cfg: ShiftConfig) -> int:
    """Tokens at the end of the split kept for the prefix texts: `prefixes` blocks of the longest prefix."""
    return cfg.prefixes * max(cfg.prefix_lengths, default=0)


def check_split_size(valid: TokenStream, length: int, cfg: ShiftConfig) -> None:
    needed = cfg.windows * length + 1 + reserved(cfg)
    if len(valid) < needed:
        raise ConfigError(
            f"eval.shift needs {needed} tokens of the {valid.split} split: eval.shift.windows={cfg.windows} "
            f"windows of {length} tokens (+1 target) and {reserved(cfg)} tokens of prefix text "
            f"(eval.shift.prefixes={cfg.prefixes} texts of the longest of "
            f"eval.shift.prefix_lengths={cfg.prefix_lengths}), but the split has {len(valid)}; "
            f"lower eval.shift.windows, prefixes or the prefix lengths, or use more data"
        )


def shift_windows(valid: TokenStream, length: int, cfg: ShiftConfig) -> Batch:
    """The fixed windows, (W, T) each, spread over the split less its reserved prefix text (`reserved`)."""
    check_split_size(valid, length, cfg)
    end = len(valid) - reserved(cfg)
    head = TokenStream(valid.tokens[:end], valid.sentence[:end], valid.paragraph[:end], valid.split)
    return head.batch(head.fixed_windows(length, cfg.windows), length)


def prefix_text(valid: TokenStream, k: int, end: int | None = None) -> Prefix:
    """The k tokens before `end` (default: the end of the split), structure indices from their first token."""
    end = len(valid) if end is None else end
    rows = slice(end - k, end)
    tokens, sentence, paragraph = (
        torch.from_numpy(a[rows].astype(np.int64)) for a in (valid.tokens, valid.sentence, valid.paragraph)
    )
    return Prefix(tokens, sentence - sentence[:1], paragraph - paragraph[:1])


def prefix_texts(valid: TokenStream, k: int, cfg: ShiftConfig) -> list[Prefix]:
    """`cfg.prefixes` disjoint texts of k tokens; the j-th ends j x max(prefix_lengths) before the end."""
    block = max(cfg.prefix_lengths)
    return [prefix_text(valid, k, len(valid) - j * block) for j in range(cfg.prefixes)]


def no_prefix() -> Prefix:
    empty = torch.zeros(0, dtype=torch.long)
    return Prefix(empty, empty, empty)


def tail(windows: Batch, k: int) -> Batch:
    """The last T - k positions of every window, structure indices restarting at 0: 4 x (W, T - k)."""
    inputs, targets, sentence, paragraph = (
        t[:, k:] for t in (windows.inputs, windows.targets, windows.sentence, windows.paragraph)
    )  # (W, T) -> (W, T - k)
    return Batch(inputs, targets, sentence - sentence[:, :1], paragraph - paragraph[:, :1])


def next_index(indices: Tensor) -> int:
    """The structure index after the last of (k,) `indices`: 0 after an empty prefix."""
    return int(indices[-1]) + 1 if len(indices) else 0


def joined(head: Tensor, rows: Tensor, shift: int) -> Tensor:
    """head: (k,) before every row of rows: (B, n) plus `shift` -> (B, k + n)."""
    return torch.cat([head.expand(len(rows), -1), rows + shift], dim=1)  # (k,) -> (B, k); (B, k + n)


def with_prefix(prefix: Prefix, windows: Batch) -> tuple[Tensor, Tensor, Tensor]:
    """Inputs, sentence and paragraph indices of the prefix followed by each window: 3 x (B, k + n)."""
    return (
        joined(prefix.tokens, windows.inputs, 0),
        joined(prefix.sentence, windows.sentence, next_index(prefix.sentence)),
        joined(prefix.paragraph, windows.paragraph, next_index(prefix.paragraph)),
    )


def rows_of(batch: Batch, rows: slice) -> Batch:
    return Batch(batch.inputs[rows], batch.targets[rows], batch.sentence[rows], batch.paragraph[rows])


def forward_rows(
    ctx: EvalContext, batch: Batch, prefix: Prefix, offset: int
) -> Iterator[tuple[slice, Tensor]]:
    """`prefix` + rows of `batch` at `offset`, batched: (rows, logits (B, n, V) of the batch's positions)."""
    k, n = len(prefix), batch.inputs.shape[1]
    size = ctx.batch_size(k + n)
    for start in range(0, len(batch.inputs), size):
        rows = slice(start, start + size)
        logits = ctx.logits(*with_prefix(prefix, rows_of(batch, rows)), offset=offset)  # (B, k + n, V)
        yield rows, logits[:, k:]  # (B, k + n, V) -> (B, n, V)


def alone(ctx: EvalContext, batch: Batch) -> Tensor:
    """Every row of `batch` scored alone at offset 0: (W, n, V)."""
    return torch.cat([logits for _, logits in forward_rows(ctx, batch, no_prefix(), 0)])  # (W, n, V)


def compared(
    result: Agreement, reference: Tensor, batch: Batch, shifted: Iterator[tuple[slice, Tensor]]
) -> Agreement:
    """Add each batch of `shifted` logits, compared with the same rows of `reference` (W, n, V)."""
    for rows, logits in shifted:
        result.add(reference[rows], logits, batch.targets[rows].to(logits.device))
    return result


def prefix_metrics(
    ctx: EvalContext, windows: Batch, full: Tensor, k: int, cfg: ShiftConfig
) -> dict[str, Agreement]:
    """The prefix and context kinds at prefix length k; `full`: (W, T, V) logits of the whole windows."""
    scored = tail(windows, k)
    reference = alone(ctx, scored)  # (W, T - k, V)
    unrelated = Agreement()
    for prefix in prefix_texts(ctx.valid, k, cfg):
        compared(unrelated, reference, scored, forward_rows(ctx, scored, prefix, 0))
    context = Agreement()
    context.add(reference, full[:, k:], scored.targets.to(full.device))  # (W, T, V) -> (W, T - k, V)
    return {"prefix": unrelated, "context": context}


@torch.inference_mode()
def shift_metrics(ctx: EvalContext, cfg: ShiftConfig) -> dict[tuple[str, int], dict[str, float]]:
    """(kind, k) -> metrics, kind `offset`, `prefix` or `context` (module docstring), in that order."""
    cfg.check_prefix_lengths(ctx.train_len)
    windows = shift_windows(ctx.valid, ctx.train_len, cfg)
    full = alone(ctx, windows)  # (W, T, V)
    out: dict[tuple[str, int], Agreement] = {}
    shifts = [("offset", k) for k in cfg.offsets] + [("prefix", k) for k in cfg.prefix_lengths]
    # a step: 1 (offset) or 1 + prefixes (prefix) passes over the windows, at the training length: quick
    for kind, k in ctx.bar(shifts, "shift", unit="shift"):
        if kind == "offset":
            out[kind, k] = compared(Agreement(), full, windows, forward_rows(ctx, windows, no_prefix(), k))
        else:
            out.update({(name, k): a for name, a in prefix_metrics(ctx, windows, full, k, cfg).items()})
    ordered = sorted(out, key=lambda key: KINDS.index(key[0]))  # offset, prefix, context rows
    return {key: out[key].values() for key in ordered}


class Shift(Evaluator[ShiftConfig]):
    """Offset, unrelated-prefix and real-context stability: `shift/{offset,prefix,context}{k}/{metric}` and
    the `shift` table."""

    name = "shift"
    config = ShiftConfig
    order = shift_columns.ORDER

    def positions(self, settings: EvalSettings, train_len: int) -> int:
        self.cfg.check_prefix_lengths(train_len)  # before training: prefixes must fit in the training length
        return max([0, *self.cfg.offsets]) + train_len + 1

    def evaluate(self, ctx: EvalContext) -> EvalOutput:
        metrics = shift_metrics(ctx, self.cfg)
        scalars = {
            metric_key(name, shift=kind, k=k): value
            for (kind, k), values in metrics.items()
            for name, value in values.items()
        }
        rows = [[kind, k, *(values[m] for m in METRICS)] for (kind, k), values in metrics.items()]
        return EvalOutput(scalars=scalars, tables={"shift": Table(["kind", "k", *METRICS], rows)})
