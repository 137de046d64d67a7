"""Exact-match accuracy on an algorithmic task (`data=task`, issue 44), by greedy decoding with the
key/value cache, per instance length.

For every instance length n of `data.task.test_lengths`, `eval.task.examples` examples of the evaluated
split (`eval.split`, test in the task presets) are decoded: the prompt BOS ... SEP is prefilled into a
`KVCache` and the answer written greedily (`posab.decoding.generate`), one token per step, for the
longest answer of the batch plus EOS. An example is right when the first len(answer) + 1 tokens written are
the answer and EOS (a model that does not stop is wrong). A task's given answer symbols (MQAR's query
keys: `TaskExample.given`) are fed at their steps, not written, so they are always right and exact match
turns on the rest. Each example starts at position 0, as the reference's do; the randomized-positions
wrappers apply as they are configured.

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

Where the errors are (issue 58): each wrong answer is classed by its first wrong token, at position p of the
answer and EOS: `stopped_early` (EOS written at p, before the answer's end), `ran_long` (every token of the
answer right, and no EOS after it) or `wrong_token` (another token at p); `task/stopped_early@n`,
`task/ran_long@n` and `task/wrong_token@n` are their shares of the examples at length n (with `task/exact@n`
they sum to 1). A task with further test distributions (`Task.tests`: flip-flop's `sparse` and `dense`) is
also scored greedily on each, from the same seeds: `task@TEST/exact@n`, `task@TEST/exact_seen`,
`task@TEST/exact_unseen`. The oracle-length reading (`eval.task.oracle`) decodes the same prompts again with
EOS suppressed for the answer's length and scores the answer's tokens alone (`task/oracle_exact@n`, `_seen`,
`_unseen`): a model that fails only at stopping (the length decision training fixes: on copy and reverse,
EOS where training always put it) is right there, one that fails at the content is not.

What a number can show: whether the model computes the task exactly at lengths it never trained on, and
whether a wrong answer went wrong at its content or only at its length. What it cannot: why (attention
analysis does that), nor how close a wrong answer's content was (exact match is all or nothing).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor

from posab.catalog import task as task_columns
from posab.data.tasks import TaskExample, TaskStream, TaskTracker, example_batch
from posab.data.tasks.vocab import EOS
from posab.decoding import generate
from posab.device import autocast
from posab.errors import ConfigError, require
from posab.evaluate.base import Evaluator, SectionConfig
from posab.evaluate.context import EvalContext, EvalSettings
from posab.keys import metric_key
from posab.outputs import EvalOutput, Table
from posab.plots import new_figure

COLUMNS = [
    "length",
    "seen",
    "examples",
    "exact",
    "teacher_forced_exact",
    "disagree",
    "stopped_early",
    "ran_long",
    "wrong_token",
    "oracle_exact",
]
RIGHT, STOPPED_EARLY, RAN_LONG, WRONG_TOKEN = 0, 1, 2, 3  # an example's class (task_examples.npz `error`)
ERRORS = {STOPPED_EARLY: "stopped_early", RAN_LONG: "ran_long", WRONG_TOKEN: "wrong_token"}


@dataclass
class TaskEvalConfig(SectionConfig):
    """`eval.task`: on with `data=task` (conf/data/task.yaml), off otherwise."""

    enabled: bool = False
    examples: int = 100  # per instance length: accuracy in steps of 1%
    batch_size: int = 100  # examples decoded together (those of one prompt length)
    oracle: bool = True  # also decode with EOS suppressed for the answer's length (module docstring)

    def validate(self, settings: EvalSettings) -> None:
        require(self.examples > 0, f"eval.task.examples={self.examples} must be positive")
        require(self.batch_size > 0, f"eval.task.batch_size={self.batch_size} must be positive")


@dataclass
class Scored:
    """Per example: greedy decoding's verdict and the teacher-forced one, the class of a wrong answer and
    where it first went wrong, and the oracle-length verdict."""

    greedy: np.ndarray  # (B,) bool
    forced: np.ndarray  # (B,) bool
    error: np.ndarray  # (B,) int: RIGHT, STOPPED_EARLY, RAN_LONG or WRONG_TOKEN
    first_wrong: np.ndarray  # (B,) int: the position of the first wrong token in answer + EOS, -1 if none
    oracle: np.ndarray  # (B,) bool: the answer's tokens right with EOS suppressed (False when not read)


def error_class(written: np.ndarray, wanted: np.ndarray) -> tuple[int, int]:
    """(class, first wrong position) of one decoded example: `wanted` is the answer and EOS, `written` at
    least as long (module docstring)."""
    wrong = np.flatnonzero(written[: len(wanted)] != wanted)
    if not len(wrong):
        return RIGHT, -1
    first = int(wrong[0])
    if first == len(wanted) - 1:
        return RAN_LONG, first
    return (STOPPED_EARLY if written[first] == EOS else WRONG_TOKEN), first


def batches(examples: list[TaskExample], size: int) -> Iterator[list[TaskExample]]:
    """The examples in batches of one prompt length (a cache holds one length per batch), in order."""
    for length in sorted({len(e.prompt_tokens) for e in examples}):
        group = [e for e in examples if len(e.prompt_tokens) == length]
        for start in range(0, len(group), size):
            yield group[start : start + size]


def written_by(
    ctx: EvalContext,
    examples: list[TaskExample],
    steps: int,
    suppress: tuple[int, ...] = (),
    positions: Tensor | None = None,
) -> np.ndarray:
    """(B, steps) the ids cached greedy decoding writes after each example's prompt, never one of
    `suppress`, each example's given answer symbols fed (`TaskExample.given`); at `positions` (coupled:
    `group_positions`) or sequential ones."""
    prompt = torch.from_numpy(np.stack([e.prompt_tokens for e in examples])).to(ctx.device)  # (B, P)
    given = torch.from_numpy(np.stack([e.given_ids(steps) for e in examples]))  # (B, steps)
    trackers = [TaskTracker() for _ in examples]
    with autocast(ctx.device, ctx.dtype):
        ids = generate(
            ctx.model, prompt, steps, structure=trackers, suppress=suppress, positions=positions, given=given
        )
        return ids.cpu().numpy()


def group_positions(stream: TaskStream, examples: list[TaskExample]) -> Tensor | None:
    """A group's coupled positions (every example of one instance length: `batches`), from position 1,
    for every token the longest decoding reads; None for sequential positions."""
    if not stream.coupled:
        return None
    (length,) = {e.length for e in examples}
    return stream.coupled_positions(length)  # (N,)


def greedy_scores(
    ctx: EvalContext, examples: list[TaskExample], positions: Tensor | None
) -> tuple[np.ndarray, np.ndarray]:
    """(B,) each example's class (`error_class`) and (B,) its first wrong position, greedy and cached."""
    wanted = [e.answer_tokens for e in examples]
    written = written_by(ctx, examples, max(len(w) for w in wanted), positions=positions)
    found = [error_class(row, w) for row, w in zip(written, wanted, strict=True)]
    return np.array([c for c, _ in found]), np.array([p for _, p in found])


def oracle_exact(ctx: EvalContext, examples: list[TaskExample], positions: Tensor | None) -> np.ndarray:
    """(B,) whether decoding with EOS suppressed writes each example's answer (its tokens alone)."""
    answers = [e.answer_tokens[:-1] for e in examples]
    written = written_by(ctx, examples, max(len(a) for a in answers), (EOS,), positions)
    return np.array([np.array_equal(row[: len(a)], a) for row, a in zip(written, answers, strict=True)])


def forced_exact(ctx: EvalContext, examples: list[TaskExample], positions: Tensor | None) -> np.ndarray:
    """(B,) whether the teacher-forced argmax is the target at every scored position (answer and EOS)."""
    batch = example_batch(examples, max(len(e.tokens) for e in examples) - 1)
    given = None if positions is None else positions[: batch.inputs.shape[1]]  # (T,)
    logits = ctx.logits(batch.inputs, batch.sentence, batch.paragraph, positions=given)  # (B, T, V)
    right = (logits.argmax(-1).cpu() == batch.targets) | ~batch.loss_mask  # (B, T)
    return right.all(dim=1).numpy()


def score(
    ctx: EvalContext, stream: TaskStream, examples: list[TaskExample], size: int, oracle: bool
) -> Scored:
    """Every verdict, batch by batch, each batch's passes at the same positions (one plan of the whole
    sequence: `Encoding.planned_positions`, randomized positions evaluated `sampled`; or the group's
    coupled positions)."""
    parts = []
    for group in batches(examples, size):
        ctx.model.eval()
        positions = group_positions(stream, group)
        with ctx.model.encoding.planned_positions(max(len(e.tokens) for e in group)):
            error, first = greedy_scores(ctx, group, positions)
            forced = forced_exact(ctx, group, positions)
            read = oracle_exact(ctx, group, positions) if oracle else np.zeros(len(group), dtype=bool)
            parts.append((error == RIGHT, forced, error, first, read))
    return Scored(*(np.concatenate(part) for part in zip(*parts, strict=True)))


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
            found = score(
                ctx, stream, stream.examples_at(n, self.cfg.examples), self.cfg.batch_size, self.cfg.oracle
            )
            rows.append(length_row(n, train, found, self.cfg.oracle))
            scalars.update(length_scalars(n, found, self.cfg.oracle))
            verdicts.append((np.full(len(found.greedy), n), found))
        scalars.update(summary_scalars(rows, self.cfg.oracle))
        for test in stream.task.tests:
            scalars.update(self.test_distribution(ctx, stream, test))
        table = Table(COLUMNS, rows)
        figure = accuracy_figure(table, train, f"{ctx.title}: {stream.task.name}")
        arrays = {
            "length": np.concatenate([n for n, _ in verdicts]),
            "exact": np.concatenate([f.greedy for _, f in verdicts]),
            "error": np.concatenate([f.error for _, f in verdicts]),
            "first_wrong": np.concatenate([f.first_wrong for _, f in verdicts]),
        }
        if self.cfg.oracle:
            arrays["oracle_exact"] = np.concatenate([f.oracle for _, f in verdicts])
        return EvalOutput(
            scalars=scalars,
            tables={"task_accuracy": table},
            figures={"task_accuracy_vs_length": figure},
            arrays={"task_examples": arrays},
        )

    def test_distribution(self, ctx: EvalContext, stream: TaskStream, test: str) -> dict[str, float]:
        """Exact match on the task's further test distribution `test` at every length (greedy, cached)."""
        low, high = stream.lengths
        exact = {}
        for n in ctx.bar(range(low, high + 1), f"task {stream.task.name}@{test}"):
            found = score(
                ctx, stream, stream.examples_at(n, self.cfg.examples, test), self.cfg.batch_size, False
            )
            exact[n] = float(found.greedy.mean())
        return distribution_scalars(test, exact, stream.train_lengths)


def distribution_scalars(test: str, exact: dict[int, float], train: tuple[int, int]) -> dict[str, float]:
    """`task@TEST/exact@n` per length and their means within and past the training lengths."""
    scalars = {metric_key("exact", n, variant=test): value for n, value in exact.items()}
    for name, lengths in (("exact_seen", [n for n in exact if train[0] <= n <= train[1]]),
                          ("exact_unseen", [n for n in exact if not train[0] <= n <= train[1]])):  # fmt: skip
        if lengths:
            scalars[metric_key(name, variant=test)] = float(np.mean([exact[n] for n in lengths]))
    return scalars


def length_row(n: int, train: tuple[int, int], found: Scored, oracle: bool) -> list:
    """One line of the `task_accuracy` table (COLUMNS)."""
    shares = [float((found.error == kind).mean()) for kind in ERRORS]
    disagree = int((found.greedy != found.forced).sum())
    exact, forced = float(found.greedy.mean()), float(found.forced.mean())
    read = float(found.oracle.mean()) if oracle else float("nan")
    return [n, train[0] <= n <= train[1], len(found.greedy), exact, forced, disagree, *shares, read]


def length_scalars(n: int, found: Scored, oracle: bool) -> dict[str, float]:
    """`task/exact@n`, the shares of each kind of error and, read, `task/oracle_exact@n`."""
    scalars = {metric_key("exact", n): float(found.greedy.mean())}
    scalars |= {metric_key(name, n): float((found.error == kind).mean()) for kind, name in ERRORS.items()}
    if oracle:
        scalars[metric_key("oracle_exact", n)] = float(found.oracle.mean())
    return scalars


def summary_scalars(rows: list[list], oracle: bool = False) -> dict[str, float]:
    """`task/exact_seen`, `task/exact_unseen` (means over lengths; absent when no length is such), the same
    of the oracle-length reading when read, and `task/tf_disagree` (a count)."""
    scalars = {metric_key("tf_disagree"): float(sum(row[5] for row in rows))}
    for column, name in ((3, "exact"), *(((9, "oracle_exact"),) if oracle else ())):
        seen = [row[column] for row in rows if row[1]]
        unseen = [row[column] for row in rows if not row[1]]
        if seen:
            scalars[metric_key(f"{name}_seen")] = float(np.mean(seen))
        if unseen:
            scalars[metric_key(f"{name}_unseen")] = float(np.mean(unseen))
    return scalars
