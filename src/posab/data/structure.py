"""The data pipeline's sentence and paragraph rule (`posab.data.tokenizer`: `segment`, `assemble`), one token
at a time: the indices of tokens a model writes, for decoding (`posab.decoding`).

A tracker per row assigns the sentence and paragraph indices (what the hierarchical encoding reads) of the
tokens a model writes, one token at a time, never changing an earlier token's indices:

- with anchors (`data.anchors=true`) the indices change only at anchor tokens, as in the training data: an
  anchor takes the indices of the token it precedes, which opens its unit. SENT opens a sentence (sentence
  + 1), PARA a paragraph (both + 1), BOS a document (both + 1, as `concatenate` numbers documents on); but
  the PARA right after BOS, and a SENT right after BOS or PARA, open the unit the anchor before them
  opened (BOS PARA <text> all share one index). EOS and text tokens keep the previous token's indices; the
  very first token has indices 0, 0.
- without anchors the indices come from the text, as `segment` and `assemble` give them: a sentence starts
  after '.', '!' or '?' (and closing quotes or brackets) followed by whitespace, a paragraph after a blank
  line, each at the first byte that follows the whitespace. Such a start is known as soon as that byte is
  written, and it falls in the token that holds it: that token opens the new unit (sentence + 1, paragraph
  + 1 for a paragraph start; a token holding several starts counts them all). The text's matches are
  re-scanned from the last start on (a match never straddles a start: it ends at the first non-whitespace
  byte). Anchor ids, which such a model never saw, keep the indices. Documents are not told apart: the
  data separates them (`concatenate`), the text alone cannot.

Replaying the tokens of encoded text through a tracker gives the indices `assemble` gave them (with anchors,
also for a stream of documents): tests/test_decoding.py.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from posab.data.tasks import TaskTokenizer, TaskTracker
from posab.data.tokenizer import (
    BOS,
    PARA,
    PARAGRAPH_BREAK,
    SENT,
    SENTENCE_END,
    IndexTracker,
    Tokenizer,
    unit_starts,
)


class StructureTracker(IndexTracker):
    """Sentence and paragraph indices of one growing token sequence, assigned as the data pipeline assigns
    them (the rule: this module's docstring). `extend` tracks the next tokens and returns their indices;
    `seed` takes tokens whose indices are already known (a window of a token stream); without anchors the
    text rule then sees only the seeded tokens' text."""

    def __init__(self, pieces: Sequence[bytes | None], anchors: bool) -> None:
        """`pieces`: each id's text bytes, None for the anchors (`Tokenizer.pieces`); `anchors`: whether the
        model's data had anchor tokens (`data.anchors`)."""
        super().__init__()
        self.pieces = pieces
        self.anchors = anchors
        self._text = bytearray()  # without anchors: the text so far
        self._scan = 0  # without anchors: the last unit start in `_text`, where the next scan begins

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer) -> StructureTracker:
        return cls(tokenizer.pieces, tokenizer.anchors)

    def _opens(self, token: int) -> tuple[int, int]:
        if self.anchors:
            return (0, 0) if self._last is None else self._anchor_starts(token)
        return self._text_starts(token)  # the text's own start (offset 0) opens nothing

    def _seen(self, token: int) -> None:
        if not self.anchors:
            self._text += self._piece(token)

    def _anchor_starts(self, token: int) -> tuple[int, int]:
        """(sentences, paragraphs) the anchor `token` opens after `self._last`; (0, 0) for any other."""
        if token == BOS:
            return 1, 1
        if token == PARA:
            return (0, 0) if self._last == BOS else (1, 1)
        if token == SENT:
            return (0, 0) if self._last in (BOS, PARA) else (1, 0)
        return 0, 0

    def _text_starts(self, token: int) -> tuple[int, int]:
        """(sentences, paragraphs) starting within `token`'s bytes, once they are appended to the text."""
        before = len(self._text)
        self._text += self._piece(token)
        paragraphs = self._new_starts(PARAGRAPH_BREAK, before)
        sentences = self._new_starts(SENTENCE_END, before) | paragraphs
        if sentences:
            self._scan = max(sentences)
        return len(sentences), len(paragraphs)

    def _new_starts(self, pattern: re.Pattern[bytes], before: int) -> set[int]:
        """Unit starts at byte offsets `before` .. the text's end, by the pipeline's rule (`unit_starts`),
        scanning from the last known start."""
        return {start for start in unit_starts(pattern, self._text, self._scan) if start >= before}

    def _piece(self, token: int) -> bytes:
        piece = self.pieces[token] if 0 <= token < len(self.pieces) else None
        return piece or b""


def structure_tracker(tokenizer: Tokenizer) -> IndexTracker:
    """A tracker of the tokenizer's own rule: a task's (`posab.data.tasks.vocab`) or text's (above)."""
    return (
        TaskTracker() if isinstance(tokenizer, TaskTokenizer) else StructureTracker.for_tokenizer(tokenizer)
    )
