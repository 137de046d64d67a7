"""The passkey wing's part in language-model training: passkey examples mixed into the training batches
(`data.needle_rate`; the needle evaluation's format and key length, `eval.needle.key_digits`) and the loss
on their keys, logged as `train/needle_loss`. Training knows them only as an `ExampleMix` and a
`BatchMeter`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from posab.data.streams import Batch, TokenStream
from posab.data.tokenizer import Tokenizer
from posab.distributed import sum_across_ranks
from posab.passkey.examples import filler_length, passkey_batch

KEY_LOSS = "train/needle_loss"  # the passkey stage logs its key loss under the same key


@dataclass(frozen=True)
class PasskeyMix:
    """Passkey examples at uniformly random depths, a share `rate` of the training windows."""

    stream: TokenStream
    tokenizer: Tokenizer
    rate: float
    key_digits: int

    def check(self, length: int) -> None:
        """ConfigError when a window of `length` inputs cannot hold a passkey example."""
        filler_length(self.tokenizer, length + 1, self.key_digits)

    def batch(self, count: int, length: int, rng: np.random.Generator) -> Batch:
        return passkey_batch(self.stream, self.tokenizer, count, length, rng, self.key_digits)


class KeyLossMeter:
    """The mean loss on the key digits of the mixed-in examples since the last log line (none: no metric)."""

    def __init__(self) -> None:
        self.loss_sum, self.tokens = 0.0, 0

    def observe(self, losses: torch.Tensor, batch: Batch) -> None:
        """`losses`: (B, T) token losses of `batch`."""
        if batch.key_mask is not None:
            self.loss_sum += float(losses[batch.key_mask].sum())
            self.tokens += int(batch.key_mask.sum())

    def metrics(self) -> dict[str, float]:
        """Over every rank (a collective: every rank calls it at the same step); then reset."""
        loss_sum, tokens = sum_across_ranks(self.loss_sum, self.tokens)
        self.loss_sum, self.tokens = 0.0, 0
        return {KEY_LOSS: loss_sum / tokens} if tokens else {}

    def state_dict(self) -> dict[str, Any]:
        return {"loss_sum": self.loss_sum, "tokens": self.tokens}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loss_sum, self.tokens = float(state["loss_sum"]), int(state["tokens"])
