"""Passkey retrieval (needle in a haystack) over a grid of lengths and depths.

Protocol: for every length L and depth d of the grid (`eval.needle.lengths`, or `eval.lengths`, times
`eval.needle.depths`), `trials` passkey examples of L + 1 tokens (`posab.passkey.examples`): filler from the
validation split at random starts, a fresh key per trial, all drawn from
`numpy.random.default_rng([seed, L, depth index])`, so every run and every encoding sees exactly the same
examples (for a given tokenizer setting). The model reads L tokens, inputs = tokens[:-1], as in training
and in the perplexity evaluation.

Scoring: one teacher-forced forward pass per example. Greedy decoding of `key_digits` tokens after the
prompt tokens[:key_start] returns the key exactly iff at every key position the argmax of the
teacher-forced logits is the key's digit. While greedy decoding has produced the key's first i digits, its
context is the teacher-forced context at digit i, so its next token is the teacher-forced argmax there.
Hence if every argmax matches, greedy decoding produces the key (by induction on i); if the first mismatch
is at digit i, it produces digits 0..i-1 and then that wrong argmax. Ties are broken by `argmax` in both.
Also reported: the teacher-forced log-probability of the key (natural log, summed over its digits).

Retrieval control: every example is scored a second time with another key (drawn from
`numpy.random.default_rng([seed, L, depth index, 1])`, never the same) in its needle, the filler, depth and
query unchanged. `gain` = log p(key | needle holding the key) - log p(key | needle holding the other key):
how much the model's belief in the key comes from reading the needle. It is 0 for a model that ignores the
needle, whatever its accuracy, and moves before accuracy does.

Results: `needle/acc`, `needle/logprob` and `needle/gain` (means over all trials), the same per length
(`@L`) and per cell (`@L/depth{d}`), and `needle/grid` ({"lengths", "depths", "acc", "logprob", "gain"}, as
[per length][per depth] lists); the cells as the `needle` table and the `needle_heatmap` figure. Keys:
`posab.keys`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from posab.catalog import needle as needle_columns
from posab.data.streams import Batch
from posab.errors import ConfigError, require
from posab.evaluate.base import Evaluator, SectionConfig
from posab.evaluate.context import EvalContext, EvalSettings
from posab.forms import AttentionInputs
from posab.keys import metric_key
from posab.outputs import EvalOutput, Table
from posab.passkey.examples import (
    PasskeyExample,
    check_stream,
    examples_batch,
    longest_filler,
    make_passkey_example,
    random_key,
    with_needle_key,
)
from posab.plots import needle_heatmap


@dataclass
class NeedleConfig(SectionConfig):
    lengths: list[int] | None = None  # None: eval.lengths
    depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    trials: int = 10
    key_digits: int = 5
    seed: int = 1234

    def validate(self, settings: EvalSettings) -> None:
        lengths, depths = self.lengths or [], self.depths
        bad = [n for n in lengths if n < 1]
        require(not bad, f"eval.needle.lengths={lengths}: every length must be >= 1 (bad: {bad})")
        bad_depths = [d for d in depths if not 0 <= d <= 1]
        require(not bad_depths, f"eval.needle.depths={depths}: depths must be in [0, 1] (bad: {bad_depths})")
        require(self.trials > 0, f"eval.needle.trials={self.trials} must be positive")
        require(1 <= self.key_digits <= 12, f"eval.needle.key_digits={self.key_digits} must be in [1, 12]")


def needle_lengths(cfg: NeedleConfig, settings: EvalSettings) -> list[int]:
    return list(cfg.lengths or settings.lengths)


def check_lengths(ctx: EvalContext, lengths: list[int], key_digits: int) -> None:
    """Fail before any work when a length cannot hold an example or the split cannot fill one."""
    for length in lengths:
        try:
            check_stream(ctx.valid, longest_filler(ctx.tokenizer, length + 1, key_digits), length + 1)
        except ConfigError as err:
            raise ConfigError(
                f"needle evaluation at length {length} (examples of {length + 1}): {err}"
            ) from None


def cell_examples(ctx: EvalContext, n: NeedleConfig, length: int, depth_index: int) -> list[PasskeyExample]:
    """The `trials` examples of one grid cell, the same in every run."""
    rng = np.random.default_rng([n.seed, length, depth_index])
    depth = n.depths[depth_index]
    return [
        make_passkey_example(ctx.valid, ctx.tokenizer, length + 1, depth, rng, n.key_digits)
        for _ in range(n.trials)
    ]


def control_examples(
    ctx: EvalContext, n: NeedleConfig, length: int, depth_index: int, examples: list[PasskeyExample]
) -> list[PasskeyExample]:
    """Each example with another key in its needle (the retrieval control), the same in every run."""
    rng = np.random.default_rng([n.seed, length, depth_index, 1])
    controls = []
    for example in examples:
        other = random_key(rng, n.key_digits)
        while other == example.key:
            other = random_key(rng, n.key_digits)
        controls.append(with_needle_key(ctx.valid, ctx.tokenizer, example, other))
    return controls


@dataclass
class Scores:
    """Teacher-forced scores of B examples (on the CPU)."""

    correct: Tensor  # (B,) bool: greedy decoding returns the key (every key position's argmax is right)
    logprob: Tensor  # (B,) float32: the key's log-probability (natural log, summed over its digits)
    digits: Tensor  # (B, K) bool: the argmax at key position i is digit i
    attention: Tensor | None  # (B, layers, H): attention mass of the key positions on the needle's key

    @staticmethod
    def cat(parts: list[Scores]) -> Scores:
        attention = [p.attention for p in parts]
        return Scores(
            torch.cat([p.correct for p in parts]),
            torch.cat([p.logprob for p in parts]),
            torch.cat([p.digits for p in parts]),
            None if any(a is None for a in attention) else torch.cat(attention),  # type: ignore[arg-type]
        )


def needle_mask(examples: list[PasskeyExample], length: int) -> Tensor:
    """(B, T) bool: the input positions of each example's needle key digits."""
    mask = torch.zeros(len(examples), length, dtype=torch.bool)
    for row, example in enumerate(examples):
        mask[row, example.needle_key_start : example.needle_key_start + len(example.needle_key)] = True
    return mask


def score_batch(ctx: EvalContext, batch: Batch, key_digits: int, needle: Tensor | None = None) -> Scores:
    """Teacher-forced scores of examples whose last `key_digits` targets are the key. With `needle` (B, T),
    the needle key's input positions, also the attention mass every layer and head puts there from the key
    positions (the last `key_digits` queries), mean over those queries, from the model's own attention
    probabilities (`DecoderLM.forward(observe=...)`)."""
    length = batch.inputs.shape[1]
    masses: list[Tensor] = []

    def observe(inputs: AttentionInputs) -> None:
        p = inputs.probabilities(length - key_digits, length)  # (B, H, K, T)
        on_needle = needle.to(p.device)[:, None, None, :]  # type: ignore[union-attr]  # (B, T) -> (B, 1, 1, T)
        masses.append((p * on_needle).sum(-1).mean(-1).cpu())  # (B, H, K, T) -> (B, H)

    logits = ctx.logits(
        batch.inputs, batch.sentence, batch.paragraph, observe=observe if needle is not None else None
    )
    logits = logits[:, -key_digits:]  # (B, T, V) -> (B, K, V)
    key = batch.targets[:, -key_digits:].to(logits.device)  # (B, K)
    digits = logits.argmax(dim=-1) == key  # (B, K)
    key_logprobs = logits.log_softmax(dim=-1).gather(-1, key[..., None])  # (B, K, 1)
    logprob = key_logprobs.squeeze(-1).sum(dim=-1)  # (B, K, 1) -> (B,)
    attention = torch.stack(masses, dim=1) if masses else None  # layers x (B, H) -> (B, layers, H)
    return Scores(digits.all(dim=-1).cpu(), logprob.cpu(), digits.cpu(), attention)


def score_examples(
    ctx: EvalContext, examples: list[PasskeyExample], key_digits: int, attention: bool = False
) -> Scores:
    """`score_batch` over examples of one length, `ctx.batch_size` of them per forward pass (with the
    attention mass on the needle when `attention`), counted by an inner progress bar."""
    length = len(examples[0]) - 1
    size = ctx.batch_size(length)
    parts = []
    for i in ctx.bar(range(0, len(examples), size), f"needle L={length}", inner=True, unit="batch"):
        chunk = examples[i : i + size]
        needle = needle_mask(chunk, length) if attention else None
        parts.append(score_batch(ctx, examples_batch(chunk), key_digits, needle))
    return Scores.cat(parts)


@dataclass
class Cells:
    """Cell means over the trials: acc, logprob, gain (lengths, depths); digits (lengths, depths, K);
    attention (lengths, depths, layers, H), or None when the model reports no attention."""

    acc: np.ndarray
    logprob: np.ndarray
    gain: np.ndarray
    digits: np.ndarray
    attention: np.ndarray | None = None

    def as_dict(self) -> dict[str, np.ndarray]:
        return {"acc": self.acc, "logprob": self.logprob, "gain": self.gain}

    def add(self, i: int, j: int, scores: Scores, control: Scores) -> None:
        """Cell (length i, depth j) from the scores of its trials and of their controls."""
        self.acc[i, j] = float(scores.correct.float().mean())
        self.logprob[i, j] = float(scores.logprob.mean())
        self.gain[i, j] = float((scores.logprob - control.logprob).mean())
        self.digits[i, j] = scores.digits.float().mean(0).numpy()  # (K,)
        if scores.attention is not None:
            if self.attention is None:
                self.attention = np.zeros((*self.acc.shape, *scores.attention.shape[1:]))
            self.attention[i, j] = scores.attention.mean(0).numpy()  # (layers, H)


def diagnostics(lengths: list[int], cells: Cells) -> tuple[dict[str, float], dict[str, Any]]:
    """Per-digit accuracy (`needle/digit_acc[@L]/d{i}`: which digit fails first) and, per length, the
    attention mass on the needle's key of the head that puts the most there (`needle/attn_mass@L`, its
    `needle/attn_layer@L` and `needle/attn_head@L`), mean over depths and trials; the per-head grid as
    data."""
    out: dict[str, float] = {}
    for d, value in enumerate(cells.digits.mean((0, 1))):  # (K,)
        out[metric_key("digit_acc", digit=d)] = float(value)
    for i, length in enumerate(lengths):
        for d, value in enumerate(cells.digits[i].mean(0)):  # (K,)
            out[metric_key("digit_acc", length, digit=d)] = float(value)
    data: dict[str, Any] = {}
    if cells.attention is not None:
        per_head = cells.attention.mean(1)  # (lengths, depths, layers, H) -> (lengths, layers, H)
        for i, length in enumerate(lengths):
            layer, head = np.unravel_index(int(per_head[i].argmax()), per_head[i].shape)
            out[metric_key("attn_mass", length)] = float(per_head[i, layer, head])
            out[metric_key("attn_layer", length)] = int(layer)
            out[metric_key("attn_head", length)] = int(head)
        data["needle/attention"] = {"lengths": [int(n) for n in lengths], "mass": per_head.tolist()}
    return out, data


def needle_metrics(lengths: list[int], depths: list[float], cells: Cells) -> EvalOutput:
    """The output from the (lengths, depths) cell means (every cell has `trials` trials)."""
    out: dict[str, float] = {}
    for name, values in cells.as_dict().items():
        out[metric_key(name)] = float(values.mean())
        for i, length in enumerate(lengths):
            out[metric_key(name, length)] = float(values[i].mean())
            for j, depth in enumerate(depths):
                out[metric_key(name, length, depth=depth)] = float(values[i, j])
    grid = {"lengths": [int(n) for n in lengths], "depths": [float(d) for d in depths]}
    grid |= {name: values.tolist() for name, values in cells.as_dict().items()}
    rows = [
        [length, depth, grid["acc"][i][j], grid["logprob"][i][j], grid["gain"][i][j]]
        for i, length in enumerate(grid["lengths"])
        for j, depth in enumerate(grid["depths"])
    ]
    return EvalOutput(
        scalars=out,
        data={"needle/grid": grid},
        tables={"needle": Table(["length", "depth", "acc", "logprob", "gain"], rows)},
    )


class Needle(Evaluator[NeedleConfig]):
    """Passkey accuracy and key log-probability over the lengths x depths grid (module docstring)."""

    name = "needle"
    config = NeedleConfig
    order = needle_columns.ORDER
    after_stage = True  # retrieval is measured after the passkey stage, when a run has one

    def window_lengths(self, settings: EvalSettings) -> list[int]:
        return needle_lengths(self.cfg, settings)

    def evaluate(self, ctx: EvalContext) -> EvalOutput:
        n = self.cfg
        lengths = needle_lengths(n, ctx.cfg)
        check_lengths(ctx, lengths, n.key_digits)
        shape = (len(lengths), len(n.depths))
        cells = Cells(np.zeros(shape), np.zeros(shape), np.zeros(shape), np.zeros((*shape, n.key_digits)))
        grid = [(i, j) for i in range(len(lengths)) for j in range(len(n.depths))]
        for i, j in ctx.bar(grid, "needle", unit="cell"):
            examples = cell_examples(ctx, n, lengths[i], j)
            scores = score_examples(ctx, examples, n.key_digits, attention=True)
            controls = control_examples(ctx, n, lengths[i], j, examples)
            cells.add(i, j, scores, score_examples(ctx, controls, n.key_digits))
        output = needle_metrics(lengths, list(n.depths), cells)
        scalars, data = diagnostics(lengths, cells)
        output.scalars.update(scalars)
        output.data.update(data)
        output.figures["needle_heatmap"] = needle_heatmap(output.data["needle/grid"], ctx.title)
        return output
