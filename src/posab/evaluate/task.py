"""Exact-match accuracy on an algorithmic task (`data=task`, issue 44), by greedy decoding with the
key/value cache, per instance length.

For every instance length n of `data.task.test_lengths`, `eval.task.examples` examples of the evaluated
split (`eval.split`, test in the task presets) are decoded: the prompt BOS ... SEP is prefilled into a
`KVCache` and the answer written greedily (`posab.decoding.generate`), one token per step, for the
longest answer of the batch plus EOS. An example is right when the first len(answer) + 1 tokens written are
the answer and EOS (a model that does not stop is wrong). Each example starts at position 0, as the
reference's do; the randomized-positions wrappers apply as they are configured.

Keys (`task/...`, `posab.keys`): `task/exact@n` per instance length, `task/exact_seen` (the mean over the
lengths within `data.task.train_lengths`) and `task/exact_unseen` (over the longer ones: the length
generalisation the suite measures), each a mean over lengths of equally many examples. Also the cross-check
the needle evaluator's scoring rests on (`posab.evaluate.needle`: greedy decoding returns the key iff the
teacher-forced argmax is right at every key position): every example is also scored teacher-forced, and
`task/tf_disagree` counts the examples where the two verdicts differ (0 unless cached decoding and the
full forward pass round a near tie differently: bf16). The `task_accuracy` table and the
`task_accuracy_vs_length` figure (accuracy against n, the training range shaded) go with them, and
`task_examples.npz` (each example's instance length and verdict, in the order `TaskStream.examples_at` gives
them: the same examples for every run of a task, so that runs can be paired example by example).

What a number can show: whether the model computes the task exactly at lengths it never trained on. What it
cannot: why (attention analysis does that), nor how close a wrong answer was (exact match is all or
nothing).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from matplotlib.figure import Figure

from posab.catalog import task as task_columns
from posab.data.tasks import TaskExample, TaskStream, TaskTracker, example_batch
from posab.decoding import generate
from posab.device import autocast
from posab.errors import ConfigError, require
from posab.evaluate.base import Evaluator, SectionConfig
from posab.evaluate.context import EvalContext, EvalSettings
from posab.keys import metric_key
from posab.outputs import EvalOutput, Table
from posab.plots import new_figure

COLUMNS = ["length", "seen", "examples", "exact", "teacher_forced_exact", "disagree"]


@dataclass
class TaskEvalConfig(SectionConfig):
    """`eval.task`: on with `data=task` (conf/data/task.yaml), off otherwise."""

    enabled: bool = False
    examples: int = 100  # per instance length: accuracy in steps of 1%
    batch_size: int = 100  # examples decoded together (those of one prompt length)

    def validate(self, settings: EvalSettings) -> None:
        require(self.examples > 0, f"eval.task.examples={self.examples} must be positive")
        require(self.batch_size > 0, f"eval.task.batch_size={self.batch_size} must be positive")


@dataclass
class Scored:
    """Per example of one batch: greedy decoding's verdict and the teacher-forced one."""

    greedy: np.ndarray  # (B,) bool
    forced: np.ndarray  # (B,) bool


def batches(examples: list[TaskExample], size: int) -> Iterator[list[TaskExample]]:
    """The examples in batches of one prompt length (a cache holds one length per batch), in order."""
    for length in sorted({len(e.prompt_tokens) for e in examples}):
        group = [e for e in examples if len(e.prompt_tokens) == length]
        for start in range(0, len(group), size):
            yield group[start : start + size]


def greedy_exact(ctx: EvalContext, examples: list[TaskExample]) -> np.ndarray:
    """(B,) whether cached greedy decoding writes each example's answer and EOS."""
    prompt = torch.from_numpy(np.stack([e.prompt_tokens for e in examples])).to(ctx.device)  # (B, P)
    wanted = [e.answer_tokens for e in examples]
    steps = max(len(w) for w in wanted)
    with autocast(ctx.device, ctx.dtype):
        written = generate(ctx.model, prompt, steps, structure=[TaskTracker() for _ in examples]).cpu()
    return np.array(
        [np.array_equal(row[: len(w)].numpy(), w) for row, w in zip(written, wanted, strict=True)]
    )


def forced_exact(ctx: EvalContext, examples: list[TaskExample]) -> np.ndarray:
    """(B,) whether the teacher-forced argmax is the target at every scored position (answer and EOS)."""
    batch = example_batch(examples, max(len(e.tokens) for e in examples) - 1)
    logits = ctx.logits(batch.inputs, batch.sentence, batch.paragraph)  # (B, T, V)
    right = (logits.argmax(-1).cpu() == batch.targets) | ~batch.loss_mask  # (B, T)
    return right.all(dim=1).numpy()


def score(ctx: EvalContext, examples: list[TaskExample], size: int) -> Scored:
    """Both verdicts, batch by batch, each batch's two passes at the same positions (one plan of the whole
    sequence: `Encoding.planned_positions`, randomized positions evaluated `sampled`)."""
    parts = []
    for group in batches(examples, size):
        ctx.model.eval()
        with ctx.model.encoding.planned_positions(max(len(e.tokens) for e in group)):
            parts.append((greedy_exact(ctx, group), forced_exact(ctx, group)))
    return Scored(np.concatenate([g for g, _ in parts]), np.concatenate([f for _, f in parts]))


def accuracy_figure(table: Table, train: tuple[int, int], title: str) -> Figure:
    """Exact-match accuracy against instance length, the training lengths shaded."""
    fig = new_figure(6, 3.5)
    ax = fig.add_subplot()
    lengths = [row[0] for row in table.rows]
    ax.axvspan(train[0] - 0.5, train[1] + 0.5, color="0.9", label="training lengths")
    ax.plot(lengths, [row[3] for row in table.rows], marker="o", label="greedy, cached")
    ax.set(xlabel="instance length n", ylabel="exact match", ylim=(-0.02, 1.02), title=title)
    ax.legend(loc="lower left")
    return fig


class TaskAccuracy(Evaluator[TaskEvalConfig]):
    """Exact match per instance length by cached greedy decoding (module docstring)."""

    name = "task"
    config = TaskEvalConfig
    order = task_columns.ORDER

    def evaluate(self, ctx: EvalContext) -> EvalOutput:
        stream = ctx.valid
        if not isinstance(stream, TaskStream):
            raise ConfigError("eval.task.enabled=true needs a task's data: data=task task=NAME")
        low, high = stream.lengths
        train = stream.train_lengths
        rows, scalars, verdicts = [], {}, []
        for n in ctx.bar(range(low, high + 1), f"task {stream.task.name}"):
            found = score(ctx, stream.examples_at(n, self.cfg.examples), self.cfg.batch_size)
            exact, forced = float(found.greedy.mean()), float(found.forced.mean())
            disagree = int((found.greedy != found.forced).sum())
            rows.append([n, train[0] <= n <= train[1], len(found.greedy), exact, forced, disagree])
            scalars[metric_key("exact", n)] = exact
            verdicts.append((np.full(len(found.greedy), n), found.greedy))
        scalars.update(summary_scalars(rows))
        table = Table(COLUMNS, rows)
        figure = accuracy_figure(table, train, f"{ctx.title}: {stream.task.name}")
        arrays = {
            "length": np.concatenate([n for n, _ in verdicts]),
            "exact": np.concatenate([g for _, g in verdicts]),
        }
        return EvalOutput(
            scalars=scalars,
            tables={"task_accuracy": table},
            figures={"task_accuracy_vs_length": figure},
            arrays={"task_examples": arrays},
        )


def summary_scalars(rows: list[list]) -> dict[str, float]:
    """`task/exact_seen`, `task/exact_unseen` (means over lengths; absent when no length is such) and
    `task/tf_disagree` (a count)."""
    seen = [row[3] for row in rows if row[1]]
    unseen = [row[3] for row in rows if not row[1]]
    scalars = {metric_key("tf_disagree"): float(sum(row[5] for row in rows))}
    if seen:
        scalars[metric_key("exact_seen")] = float(np.mean(seen))
    if unseen:
        scalars[metric_key("exact_unseen")] = float(np.mean(unseen))
    return scalars
