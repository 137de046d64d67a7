"""The tasks' own tokenizer: one id per symbol, four specials, and the structure rule of a task sequence.

A task example is the sequence BOS, the prompt's symbols, SEP, the answer's symbols, EOS (then PAD to the
batch's length). Ids: PAD 0, BOS 1, EOS 2, SEP 3, then one per symbol of `SYMBOLS` (digits, lower-case
letters, '+' and ','), the same for every task, so one tokenizer reads every task's examples.

Sentence and paragraph indices (what the hierarchical bias reads): the prompt is paragraph 0 and the answer
paragraph 1; SEP opens the answer (it takes the answer's indices, as posab's text anchors take the indices
of the unit they open), and within the prompt each item separator ('+' between addends, ',' between list
items) opens a new sentence, so an operand or list item is a sentence. BOS has indices 0, 0; EOS, PAD and
every other symbol keep the previous token's. `TaskTracker` applies the rule one token at a time (cached
decoding), `structure` to a whole sequence; both give the same indices (tests/test_tasks.py).
"""

from __future__ import annotations

import string
from collections.abc import Iterable

import numpy as np

from posab.data.tokenizer import Encoded, IndexTracker
from posab.errors import ConfigError

PAD, BOS, EOS, SEP = 0, 1, 2, 3
SPECIALS = {PAD: "<pad>", BOS: "<bos>", EOS: "<eos>", SEP: "="}  # SEP is written '=' in text
SYMBOLS = tuple(string.digits + string.ascii_lowercase + "+,")  # ',': unused since MQAR's first form, kept
# so that every task run has the same vocabulary
FIRST_SYMBOL = 4
ITEM_SEPARATORS = ("+", ",")  # each opens a sentence within the prompt


def symbol_id(symbol: str) -> int:
    """The id of one symbol of `SYMBOLS` ('=' is SEP)."""
    if symbol == SPECIALS[SEP]:
        return SEP
    if symbol not in SYMBOLS:
        raise ConfigError(f"{symbol!r} is no task symbol: use digits, lower-case letters, '+', ',' and '='")
    return FIRST_SYMBOL + SYMBOLS.index(symbol)


SENTENCE_OPENERS = frozenset(symbol_id(s) for s in ITEM_SEPARATORS)


class TaskTokenizer:
    """The `Tokenizer` of task data: ids as the module docstring gives them; `encode` reads a prompt
    written in symbols ('12+7=' or '12+7'), `decode` writes ids back."""

    vocab_size = FIRST_SYMBOL + len(SYMBOLS)
    anchors = True  # BOS, SEP and EOS are anchors: they carry structure, not text

    def __init__(self) -> None:
        self.pieces: list[bytes | None] = [None] * FIRST_SYMBOL + [s.encode() for s in SYMBOLS]

    def encode(self, text: str, document: bool = True) -> Encoded:
        """A prompt as the model sees it: with `document`, BOS first and SEP last (added unless `text`
        ends with '='), so that the next token is the answer's first."""
        ids = [symbol_id(symbol) for symbol in text]
        if document:
            ids = [BOS, *ids, *([] if ids and ids[-1] == SEP else [SEP])]
        tokens = np.asarray(ids, dtype=np.uint16)
        sentence, paragraph = structure(tokens)
        return Encoded(tokens, sentence, paragraph)

    def decode(self, ids: Iterable[int] | np.ndarray, show_special: bool = False) -> str:
        """Symbols back to text; SEP is '=', the other specials dropped or shown as <bos>, <eos>, <pad>."""
        out = []
        for token in (int(i) for i in ids):
            if token >= FIRST_SYMBOL:
                out.append(SYMBOLS[token - FIRST_SYMBOL])
            elif token == SEP or show_special:
                out.append(SPECIALS[token])
        return "".join(out)


class TaskTracker(IndexTracker):
    """The structure rule (module docstring) for one growing sequence, as
    `posab.data.structure.StructureTracker` is for text."""

    def _opens(self, token: int) -> tuple[int, int]:
        if self._last is None:
            return 0, 0  # the first token opens nothing
        if token == SEP:
            return 1, 1
        return (1, 0) if token in SENTENCE_OPENERS and self.paragraph[-1] == 0 else (0, 0)


def structure(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(N,) ids -> their sentence and paragraph indices (N,) int32 each, by the module docstring's rule."""
    opens_answer = tokens == SEP
    opens_answer[:1] = False  # the first token opens nothing
    paragraph = np.cumsum(opens_answer, dtype=np.int32)
    opens_item = np.isin(tokens, list(SENTENCE_OPENERS)) & (paragraph == 0)
    opens_item[:1] = False
    sentence = np.cumsum(opens_item | opens_answer, dtype=np.int32)
    return sentence, paragraph
