"""Byte-level tokenizer with anchor tokens and per-token sentence and paragraph indices.

Ids 0..255 are bytes; BOS, EOS, PARA and SENT follow. With anchors on, a document becomes
BOS, then for each paragraph PARA, its bytes with SENT before every sentence but the first, and EOS.
With anchors off the bytes stand alone. Either way every token gets the index of its sentence and of its
paragraph, so the hierarchical bias works in both settings. Segmentation: paragraphs are separated by
blank lines; a sentence ends after '.', '!' or '?' (and closing quotes or brackets) followed by whitespace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

BOS, EOS, PARA, SENT = 256, 257, 258, 259
SPECIAL_NAMES = {BOS: "<bos>", EOS: "<eos>", PARA: "<para>", SENT: "<sent>"}
VOCAB_SIZE = 260

PARAGRAPH_BREAK = re.compile(rb"\n[ \t\r]*\n\s*")
SENTENCE_END = re.compile(rb"[.!?][\"')\]]*\s+")


@dataclass
class Encoded:
    """Token ids (uint16) with the sentence and paragraph index of each token (int32), all (N,)."""

    tokens: np.ndarray
    sentence: np.ndarray
    paragraph: np.ndarray

    def __len__(self) -> int:
        return len(self.tokens)


def _starts(pattern: re.Pattern[bytes], data: bytes) -> np.ndarray:
    """Byte offsets where a new unit starts: after each match that is not at the very end."""
    ends = [m.end() for m in pattern.finditer(data) if m.end() < len(data)]
    return np.asarray(ends, dtype=np.int64)


class ByteTokenizer:
    vocab_size = VOCAB_SIZE

    def __init__(self, anchors: bool = True) -> None:
        self.anchors = anchors

    def encode(self, text: str, document: bool = True) -> Encoded:
        """Encode text; with `document`, anchors include BOS and EOS around it."""
        data = text.encode("utf-8")
        tokens = np.frombuffer(data, dtype=np.uint8).astype(np.uint16)  # (N,)
        para_starts = np.concatenate([[0], _starts(PARAGRAPH_BREAK, data)]) if data else np.zeros(0, np.int64)
        sent_starts = np.union1d(para_starts, _starts(SENTENCE_END, data)).astype(np.int64)
        paragraph = self._running_index(para_starts, len(data))
        sentence = self._running_index(sent_starts, len(data))
        if not self.anchors:
            return Encoded(tokens, sentence, paragraph)
        return self._with_anchors(tokens, sentence, paragraph, para_starts, sent_starts, document)

    @staticmethod
    def _running_index(starts: np.ndarray, length: int) -> np.ndarray:
        marks = np.zeros(length, dtype=np.int32)
        marks[starts] = 1
        return np.maximum(np.cumsum(marks, dtype=np.int32) - 1, 0)

    @staticmethod
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
        # an anchor takes the indices of the byte it precedes
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

    def decode(self, ids: list[int] | np.ndarray, show_special: bool = False) -> str:
        """Bytes back to text; anchor tokens are dropped, or shown as <bos>, <para>, ..."""
        pieces: list[str] = []
        run = bytearray()
        for i in (int(x) for x in ids):
            if i < 256:
                run.append(i)
                continue
            pieces.append(run.decode("utf-8", errors="replace"))
            run = bytearray()
            if show_special:
                pieces.append(SPECIAL_NAMES.get(i, f"<{i}>"))
        pieces.append(run.decode("utf-8", errors="replace"))
        return "".join(pieces)


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
