"""Byte-level tokenizer with anchor tokens and per-token sentence and paragraph indices.

Ids 0..255 are bytes; BOS, EOS, PARA and SENT follow. With anchors on, a document becomes
BOS, then for each paragraph PARA, its bytes with SENT before every sentence but the first, and EOS.
With anchors off the bytes stand alone. Either way every token gets the index of its sentence and of its
paragraph, so the hierarchical bias works in both settings. Segmentation: paragraphs are separated by
blank lines; a sentence ends after '.', '!' or '?' (and closing quotes or brackets) followed by whitespace.

The segmentation (`segment`), the anchors and indices (`assemble`) and decoding (`decode_pieces`) are shared
with the subword tokenizer (`posab.data.bpe`), which encodes each sentence into BPE tokens instead of bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from posab.errors import ConfigError

BOS, EOS, PARA, SENT = 256, 257, 258, 259
SPECIAL_NAMES = {BOS: "<bos>", EOS: "<eos>", PARA: "<para>", SENT: "<sent>"}
VOCAB_SIZE = 260

PARAGRAPH_BREAK = re.compile(rb"\n[ \t\r]*\n\s*")
SENTENCE_END = re.compile(rb"[.!?][\"')\]]*\s+")
BYTE_PIECES: list[bytes | None] = [bytes([b]) for b in range(256)]


@dataclass
class Encoded:
    """Token ids (uint16) with the sentence and paragraph index of each token (int32), all (N,)."""

    tokens: np.ndarray
    sentence: np.ndarray
    paragraph: np.ndarray

    def __len__(self) -> int:
        return len(self.tokens)


def unit_starts(pattern: re.Pattern[bytes], data: bytes | bytearray, since: int = 0) -> list[int]:
    """The rule: byte offsets where a new unit starts, right after each match of `pattern` (from offset
    `since` on) that is not at the very end of `data`. `segment` applies it to a whole text,
    `posab.data.structure.StructureTracker` to the text a model writes, as it grows."""
    return [m.end() for m in pattern.finditer(data, since) if m.end() < len(data)]


def _starts(pattern: re.Pattern[bytes], data: bytes) -> np.ndarray:
    """`unit_starts` over the whole of `data`, as an array."""
    return np.asarray(unit_starts(pattern, data), dtype=np.int64)


def segment(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Byte offsets where the paragraphs start and where the sentences start (paragraph starts included).

    Both are sorted and start at 0 (empty for empty data); the boundaries fall right after ASCII
    whitespace, so each sentence slice is valid UTF-8 when `data` is.
    """
    if not data:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    para_starts = np.concatenate([[0], _starts(PARAGRAPH_BREAK, data)])
    sent_starts = np.union1d(para_starts, _starts(SENTENCE_END, data)).astype(np.int64)
    return para_starts, sent_starts


def assemble(
    tokens: np.ndarray, para_starts: np.ndarray, sent_starts: np.ndarray, anchors: bool, document: bool
) -> Encoded:
    """Tokens with their sentence and paragraph indices, and the anchors when `anchors` is on.

    `para_starts` and `sent_starts` are the token offsets where paragraphs and sentences start, as
    `segment` gives them in bytes; with `document`, anchors include BOS and EOS around the text.
    """
    paragraph = _running_index(para_starts, len(tokens))
    sentence = _running_index(sent_starts, len(tokens))
    if not anchors:
        return Encoded(tokens, sentence, paragraph)
    return _with_anchors(tokens, sentence, paragraph, para_starts, sent_starts, document)


def _running_index(starts: np.ndarray, length: int) -> np.ndarray:
    marks = np.zeros(length, dtype=np.int32)
    marks[starts] = 1
    return np.maximum(np.cumsum(marks, dtype=np.int32) - 1, 0)


def _with_anchors(
    tokens: np.ndarray,
    sentence: np.ndarray,
    paragraph: np.ndarray,
    para_starts: np.ndarray,
    sent_starts: np.ndarray,
    document: bool,
) -> Encoded:
    inner_sentences = np.setdiff1d(sent_starts, para_starts)
    where = np.concatenate([para_starts, inner_sentences])
    what = np.concatenate([np.full(len(para_starts), PARA), np.full(len(inner_sentences), SENT)])
    order = np.argsort(where, kind="stable")
    where, what = where[order], what[order]
    # an anchor takes the indices of the token it precedes
    tokens = np.insert(tokens, where, what.astype(np.uint16))
    sentence = np.insert(sentence, where, sentence[where] if len(sentence) else [])
    paragraph = np.insert(paragraph, where, paragraph[where] if len(paragraph) else [])
    if document:
        last_s = sentence[-1] if len(sentence) else 0
        last_p = paragraph[-1] if len(paragraph) else 0
        tokens = np.concatenate([[BOS], tokens, [EOS]]).astype(np.uint16)
        sentence = np.concatenate([[0], sentence, [last_s]]).astype(np.int32)
        paragraph = np.concatenate([[0], paragraph, [last_p]]).astype(np.int32)
    return Encoded(tokens, sentence.astype(np.int32), paragraph.astype(np.int32))


def decode_pieces(ids: list[int] | np.ndarray, pieces: list[bytes | None], show_special: bool) -> str:
    """Join the bytes `pieces[id]` of the ids and decode them as UTF-8 (invalid bytes replaced).

    Ids without bytes (None, or beyond `pieces`) are anchors: dropped, or shown as <bos>, <para>, ...
    """
    out: list[str] = []
    run = bytearray()
    for i in (int(x) for x in ids):
        piece = pieces[i] if 0 <= i < len(pieces) else None
        if piece is not None:
            run += piece
            continue
        out.append(run.decode("utf-8", errors="replace"))
        run = bytearray()
        if show_special:
            out.append(SPECIAL_NAMES.get(i, f"<{i}>"))
    out.append(run.decode("utf-8", errors="replace"))
    return "".join(out)


class IndexTracker:
    """Sentence and paragraph indices of one growing token sequence, one token at a time, by a rule its
    subclass gives (`_opens`): text's (`posab.data.structure.StructureTracker`) or a task's
    (`posab.data.tasks.TaskTracker`). `extend` tracks the next tokens and returns their indices; `seed`
    takes tokens whose indices are already known."""

    def __init__(self) -> None:
        self.sentence: list[int] = []
        self.paragraph: list[int] = []
        self._last: int | None = None  # the previous token's id

    def __len__(self) -> int:
        return len(self.sentence)

    def extend(self, ids: Iterable[int]) -> tuple[list[int], list[int]]:
        """Track the next tokens; returns their sentence and paragraph indices."""
        start = len(self.sentence)
        for token in ids:
            token = int(token)
            sentence, paragraph = (self.sentence[-1], self.paragraph[-1]) if self.sentence else (0, 0)
            opened = self._opens(token)
            self.sentence.append(sentence + opened[0])
            self.paragraph.append(paragraph + opened[1])
            self._last = token
        return self.sentence[start:], self.paragraph[start:]

    def seed(self, ids: Sequence[int], sentence: Sequence[int], paragraph: Sequence[int]) -> None:
        """Take tokens with known indices; later tokens continue from them."""
        if not len(ids) == len(sentence) == len(paragraph):
            raise ConfigError(
                f"seed: {len(ids)} ids with {len(sentence)} sentence and {len(paragraph)} paragraph indices"
            )
        for token, s, p in zip(ids, sentence, paragraph, strict=True):
            self._seen(int(token))
            self.sentence.append(int(s))
            self.paragraph.append(int(p))
            self._last = int(token)

    def _opens(self, token: int) -> tuple[int, int]:
        """(sentences, paragraphs) that `token`, appended now, opens."""
        raise NotImplementedError

    def _seen(self, token: int) -> None:
        """A seeded token, for a rule that reads more than the indices (text's bytes). Nothing by default."""


class Tokenizer(Protocol):
    """What the data pipeline asks of a tokenizer: `ByteTokenizer` or `posab.data.bpe.BPETokenizer`."""

    vocab_size: int
    anchors: bool
    pieces: list[bytes | None]  # each id's text bytes; None for the anchors

    def encode(self, text: str, document: bool = True) -> Encoded: ...

    def decode(self, ids: list[int] | np.ndarray, show_special: bool = False) -> str: ...


class ByteTokenizer:
    vocab_size = VOCAB_SIZE

    def __init__(self, anchors: bool = True) -> None:
        self.anchors = anchors
        self.pieces = BYTE_PIECES

    def encode(self, text: str, document: bool = True) -> Encoded:
        """Encode text; with `document`, anchors include BOS and EOS around it."""
        data = text.encode("utf-8")
        tokens = np.frombuffer(data, dtype=np.uint8).astype(np.uint16)  # (N,)
        return assemble(tokens, *segment(data), self.anchors, document)

    def decode(self, ids: list[int] | np.ndarray, show_special: bool = False) -> str:
        """Bytes back to text; anchor tokens are dropped, or shown as <bos>, <para>, ..."""
        return decode_pieces(ids, self.pieces, show_special)


def byte_lengths(tokenizer: Tokenizer) -> np.ndarray:
    """(V,) the number of text bytes each id stands for: 0 for the anchors."""
    lengths = np.zeros(tokenizer.vocab_size, dtype=np.int64)
    for i, piece in enumerate(tokenizer.pieces[: tokenizer.vocab_size]):
        lengths[i] = len(piece) if piece is not None else 0
    return lengths


def concatenate(parts: list[Encoded]) -> Encoded:
    """Join encoded documents into one stream; indices keep growing across documents."""
    tokens, sentence, paragraph = [], [], []
    next_sentence = next_paragraph = 0
    for part in parts:
        if not len(part):
            continue
        tokens.append(part.tokens)
        sentence.append(part.sentence + next_sentence)
        paragraph.append(part.paragraph + next_paragraph)
        next_sentence += int(part.sentence[-1]) + 1
        next_paragraph += int(part.paragraph[-1]) + 1
    if not tokens:
        return Encoded(np.zeros(0, np.uint16), np.zeros(0, np.int32), np.zeros(0, np.int32))
    return Encoded(np.concatenate(tokens), np.concatenate(sentence), np.concatenate(paragraph))
