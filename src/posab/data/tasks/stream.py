"""A task's examples as a stream the training loop reads like text's (`TokenStream`): `batch(indices,
length)` pads examples to `length`, scoring only the answer and its EOS (`Batch.loss_mask`), and every
example is a pure function of (task seed, split, index), so training draws indices, validation fixes them
and nothing is stored.

Splits: `train` draws each example's instance length uniformly from `data.task.train_lengths`; `valid`
is `data.task.valid_examples` fixed examples from the same range (the validation loss); `test` gives
`examples_at(n, count)` for every instance length n of `data.task.test_lengths` (the task evaluator).

Coupled positions (`data.task.positions=coupled`, the task's `Task.coupled`): a batch's positions are
shared by its rows (`Batch.positions`), and an instance's depend on its length, so every example of a batch
has the instance length of its first index (each drawn from its own index's generator, at that length).
A training batch's positions start at an offset drawn from U(1, max_position - n - 1), the reference's
random start, so that training reaches every position up to `max_position`; validation and test start at 1.

A length curriculum (`data.task.curriculum` = C batches): training batch b draws its instance lengths from
U(low, longest_at(b)), the longest rising linearly from `low` at batch 0 to `high` at batch C (the sampler
counts its batches and keeps the count in its state, so a resumed run continues the curriculum). Validation
and test are unchanged: the validation loss reads every training length throughout.
"""

from __future__ import annotations

import numpy as np
import torch

from posab.data.streams import Batch
from posab.data.tasks.example import TaskExample
from posab.data.tasks.generators import Task
from posab.data.tasks.vocab import PAD, structure
from posab.errors import ConfigError

SPLIT_IDS = {"train": 0, "valid": 1, "test": 2}
TRAIN_INDICES = 2**48  # examples the train split can draw: fresh examples throughout training


class TaskStream:
    """One split of a task (module docstring)."""

    def __init__(
        self,
        task: Task,
        split: str,
        lengths: tuple[int, int],
        seed: int,
        count: int,
        train_lengths: tuple[int, int] | None = None,
        max_position: int | None = None,
        curriculum: int = 0,
    ) -> None:
        """`lengths`: the split's inclusive range of instance lengths; `count`: how many examples it
        holds (indices 0 .. count - 1); `train_lengths`: the training split's range (default `lengths`),
        which tells seen lengths from unseen ones; `max_position`: coupled positions, at most this in
        training (module docstring), or None for sequential positions; `curriculum`: the batches of the
        length curriculum (`longest_at`), 0 for none."""
        self.task, self.split, self.lengths, self.seed, self.count = task, split, lengths, seed, count
        self.train_lengths = lengths if train_lengths is None else train_lengths
        self.max_position = max_position
        self.curriculum = curriculum
        self.document = None  # no documents: every example stands alone

    @property
    def coupled(self) -> bool:
        """Whether the split's batches carry coupled positions (module docstring)."""
        return self.max_position is not None

    def __len__(self) -> int:
        return self.count

    @property
    def longest(self) -> int:
        """The model inputs of the split's longest example: its tokens less the last (EOS is no input)."""
        return self.task.tokens(self.lengths[1]) - 1

    def windows_available(self, length: int) -> int:
        """Examples that fit `length` inputs: every one when the longest does, else none."""
        return self.count if length >= self.longest else 0

    def fixed_windows(self, length: int, count: int) -> np.ndarray:
        """The first `count` examples (validation's fixed set); a ConfigError when `length` inputs cannot
        hold the split's longest example."""
        if length < self.longest:
            low, high = self.lengths
            raise ConfigError(
                f"train.seq_len={length} cannot hold task {self.task.name}'s longest {self.split} example "
                f"(instance length {high} of [{low}, {high}]: {self.longest} inputs); use "
                f"train.seq_len={self.longest}, as data.task.seq_len should say"
            )
        return np.arange(min(count, self.count))

    def random_starts(self, rng: np.random.Generator, count: int, length: int, batch: int = 0) -> np.ndarray:
        """`count` example indices drawn uniformly (the training sampler's draw for training batch `batch`);
        with a curriculum each index also carries the longest length of its batch (`longest_at`): index
        = longest x count + i, so that an example stays a pure function of its index."""
        drawn = rng.integers(0, self.count, size=count)
        return drawn + self.longest_at(batch) * self.count if self.curriculum else drawn

    def longest_at(self, batch: int) -> int:
        """The longest instance length of training batch `batch` under the curriculum: the shortest at batch
        0, rising linearly (rounded) to the longest at batch `curriculum` and after."""
        low, high = self.lengths
        if not self.curriculum:
            return high
        return low + round((high - low) * min(1.0, batch / self.curriculum))

    def example(self, index: int, length: int | None = None) -> TaskExample:
        """Example `index` of the split: its instance length uniform over the split's range (up to the
        longest its index carries, under a curriculum), or `length` (the generator's draws after the
        length's are the same)."""
        rng = np.random.default_rng((self.seed, SPLIT_IDS[self.split], int(index)))
        longest = int(index) // self.count if self.curriculum else self.lengths[1]
        drawn = int(rng.integers(self.lengths[0], longest + 1))
        return self.task.example(rng, drawn if length is None else length)

    def examples_at(self, length: int, count: int, test: str | None = None) -> list[TaskExample]:
        """`count` examples of instance length `length` (the evaluator's, per length), by the task's
        generator or by its test distribution `test` (`Task.tests`), from the same generator seeds."""
        rngs = (np.random.default_rng((self.seed, SPLIT_IDS[self.split], length, i)) for i in range(count))
        return [self.task.example(rng, length, test) for rng in rngs]

    def batch(self, starts: np.ndarray | list[int], length: int) -> Batch:
        """Examples `starts` padded to `length` inputs (module docstring), with their coupled positions when
        the split has them (every example at the first one's instance length)."""
        if not self.coupled:
            return example_batch([self.example(int(i)) for i in starts], length)
        first = int(starts[0])
        n = self.example(first).length
        batch = example_batch([self.example(int(i), n) for i in starts], length)
        batch.positions = self.coupled_positions(n, self.first_position(first, n))[:length]
        return batch

    def first_position(self, index: int, n: int) -> int:
        """Where a batch's coupled positions start: 1, or in training U(1, max_position - n - 1) from the
        first example's generator seed (module docstring)."""
        if self.split != "train" or self.max_position is None:
            return 1
        rng = np.random.default_rng((self.seed, SPLIT_IDS[self.split], index, n, 0))
        return int(rng.integers(1, self.max_position - n))

    def coupled_positions(self, n: int, start: int = 1) -> torch.Tensor:
        """The positions of an instance of length n's tokens and of the padding after them (0), as many as
        the split's longest example has tokens: (N,) int64."""
        assert self.task.coupled is not None, f"task {self.task.name} defines no position coupling"
        layout = self.task.coupled(n, start)  # (3n + 5,) for addition_padded
        padded = np.zeros(max(len(layout), self.longest + 1), dtype=np.int64)  # (N,)
        padded[: len(layout)] = layout
        return torch.from_numpy(padded)


def example_batch(examples: list[TaskExample], length: int) -> Batch:
    """Examples as one batch of `length` inputs: inputs = tokens[:-1], targets = tokens[1:], PAD after
    EOS; the loss scores the targets from the answer's first symbol to EOS but the given ones
    (`TaskExample.given`); structure by the task rule."""
    rows = len(examples)
    tokens = np.full((rows, length + 1), PAD, dtype=np.int64)  # (B, T + 1)
    scored = np.zeros((rows, length), dtype=bool)  # (B, T)
    sentence = np.zeros((rows, length), dtype=np.int64)  # (B, T)
    paragraph = np.zeros((rows, length), dtype=np.int64)  # (B, T)
    for row, example in enumerate(examples):
        ids = example.tokens
        if len(ids) - 1 > length:
            raise ConfigError(f"a task example of {len(ids) - 1} inputs does not fit {length}")
        tokens[row, : len(ids)] = ids
        answer_from = len(example.prompt_tokens) - 1  # the target index of the answer's first symbol
        scored[row, answer_from : len(ids) - 1] = True
        scored[row, [answer_from + i for i in example.given]] = False  # supplied, not written
        s, p = structure(ids[:-1])
        sentence[row], paragraph[row] = s[-1], p[-1]  # the padding keeps the last input's indices
        sentence[row, : len(s)], paragraph[row, : len(p)] = s, p
    as_tensor = torch.from_numpy
    return Batch(
        inputs=as_tensor(tokens[:, :-1].copy()),
        targets=as_tensor(tokens[:, 1:].copy()),
        sentence=as_tensor(sentence),
        paragraph=as_tensor(paragraph),
        loss_mask=as_tensor(scored),
    )
