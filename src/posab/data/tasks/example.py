"""One task example: its instance length, prompt and answer, and the ids the model reads and writes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posab.data.tasks.vocab import BOS, EOS, SEP, symbol_id


@dataclass(frozen=True)
class TaskExample:
    """One example: its instance length, the prompt and answer in symbols, and its ids BOS prompt SEP
    answer EOS (`tokens`, (N,) int64). `given`: the indices of the answer's symbols the reader supplies
    (MQAR's query keys): decoding feeds them, the loss and exact match do not score them."""

    length: int
    prompt: str
    answer: str
    given: tuple[int, ...] = ()

    @property
    def tokens(self) -> np.ndarray:
        ids = [BOS, *map(symbol_id, self.prompt), SEP, *map(symbol_id, self.answer), EOS]
        return np.asarray(ids, dtype=np.int64)

    @property
    def prompt_tokens(self) -> np.ndarray:
        """BOS prompt SEP: what decoding starts from."""
        return self.tokens[: len(self.prompt) + 2]

    @property
    def answer_tokens(self) -> np.ndarray:
        """answer EOS: what decoding must write."""
        return self.tokens[len(self.prompt) + 2 :]

    def given_ids(self, steps: int) -> np.ndarray:
        """(steps,) the id decoding must feed at each step after the prompt (a given answer symbol), -1
        where the model writes its own."""
        fed = np.full(steps, -1, dtype=np.int64)  # (steps,)
        fed[list(self.given)] = self.answer_tokens[list(self.given)]
        return fed
