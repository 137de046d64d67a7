"""Where each token is: what every encoding and attention form reads about positions."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Positions:
    """Where each token is.

    token: (T,) absolute token positions, `first + arange(T)`; the same for every row of the batch.
    sentence, paragraph: (B, T) sentence and paragraph indices of each token, or None when unknown.
    first: the first token position, on the host: the last one is `first + T - 1`, known without reading
    `token` back from its device (a synchronisation on an accelerator, an error on the meta device).
    """

    token: Tensor
    first: int  # required: a default would let `last` disagree with `token` unnoticed
    sentence: Tensor | None = None
    paragraph: Tensor | None = None
    largest: int | None = None  # the largest position when `token` is not first + arange(T) (sampled)

    @staticmethod
    def build(
        length: int,
        device: torch.device | str = "cpu",
        offset: int = 0,
        sentence: Tensor | None = None,
        paragraph: Tensor | None = None,
    ) -> Positions:
        token = torch.arange(offset, offset + length, device=device)
        return Positions(token=token, first=offset, sentence=sentence, paragraph=paragraph)

    @property
    def length(self) -> int:
        return self.token.shape[0]

    @property
    def last(self) -> int:
        """The largest token position (host int)."""
        return self.first + self.length - 1 if self.largest is None else self.largest

    def extend(self, new: Positions) -> Positions:
        """These positions followed by `new`'s (the next tokens): the keys of a cached decoding step."""

        def joined(old: Tensor | None, more: Tensor | None) -> Tensor | None:
            return None if old is None or more is None else torch.cat([old, more], dim=1)  # (B, n + c)

        token = torch.cat([self.token, new.token])  # (n + c,)
        sentence, paragraph = joined(self.sentence, new.sentence), joined(self.paragraph, new.paragraph)
        largest = None if self.largest is None and new.largest is None else max(self.last, new.last)
        return Positions(
            token=token, first=self.first, sentence=sentence, paragraph=paragraph, largest=largest
        )
