"""Training batches: random windows of a token stream, reproducible from a seed, with a share of them
replaced by mixed-in examples (`ExampleMix`, the passkey wing's)."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from posab.data.streams import Batch, TokenStream


class ExampleMix(Protocol):
    """Examples mixed into the training batches at a `rate` (the passkey wing's `PasskeyMix`)."""

    rate: float  # the share of windows, drawn binomially per batch

    def check(self, length: int) -> None: ...  # fails clearly when a window cannot hold one
    def batch(self, count: int, length: int, rng: np.random.Generator) -> Batch: ...  # drawn from `rng`


class TrainSampler:
    """Random training windows of `seq_len` tokens, reproducible from its seed; a `mix` replaces a share of
    them (binomial per batch) with its own examples of the same length, drawn from the same generator."""

    def __init__(
        self,
        stream: TokenStream,
        seq_len: int,
        batch_size: int,
        seed: int,
        mix: ExampleMix | None = None,
        shard: tuple[int, int] = (0, 1),
    ) -> None:
        """`shard` = (rank, world size): every rank draws the same global batch and keeps its own rows."""
        stream.fixed_windows(seq_len, 1)  # fails clearly when the split cannot hold one window
        self.stream, self.seq_len, self.batch_size = stream, seq_len, batch_size
        self.mix = mix if mix is not None and mix.rate > 0 else None
        self.rank, self.world_size = shard
        self.rng = np.random.default_rng(seed)
        self.drawn = 0  # batches drawn: what a task's length curriculum reads
        if self.mix is not None:
            self.mix.check(seq_len)

    def state_dict(self) -> dict[str, Any]:
        """The random generator's state and the batches drawn, as plain containers (resumable,
        `weights_only`-loadable)."""
        return {"rng": self.rng.bit_generator.state, "drawn": self.drawn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A state of `state_dict`, or of a checkpoint written before it counted batches (the generator's
        state alone: no curriculum ran, so the count is not read)."""
        if "rng" not in state:
            state = {"rng": state, "drawn": 0}
        self.rng.bit_generator.state = state["rng"]
        self.drawn = int(state["drawn"])

    def next_batch(self) -> Batch:
        mixed = int(self.rng.binomial(self.batch_size, self.mix.rate)) if self.mix else 0
        starts = self.stream.random_starts(self.rng, self.batch_size - mixed, self.seq_len, self.drawn)
        self.drawn += 1
        batch = self.stream.batch(starts, self.seq_len)
        if self.mix and mixed:
            batch = batch.cat(self.mix.batch(mixed, self.seq_len, self.rng))
        return batch.rows(self.rank, self.world_size)
