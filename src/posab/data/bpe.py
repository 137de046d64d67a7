"""Byte-level BPE tokenizer (Hugging Face `tokenizers`), trained offline on the training split, with anchors.

The interface is `ByteTokenizer`'s, and so are the low ids: 0..255 are the single bytes, 256..259 BOS,
EOS, PARA and SENT (special tokens), and the merged tokens follow in the order they were learnt, up to
`vocab_size` ids in all. A blank line is therefore bytes 10 10 with either tokenizer, as the passkey
examples assume. Digits are pre-tokenized one by one and never merged, so a number is one token per digit
(a passkey of k digits is its last k tokens).

Text is segmented into paragraphs and sentences exactly as `ByteTokenizer` does; each sentence, with the
whitespace after it, is encoded on its own (and the BPE is trained on these sentences), so no token
crosses a sentence boundary, and anchors and indices have the same structure as with bytes.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from posab.data.tokenizer import SPECIAL_NAMES, Encoded, assemble, decode_pieces, segment
from posab.errors import ConfigError

TOKENIZER_FILE = "tokenizer.json"
SPECIAL_TOKENS = list(SPECIAL_NAMES.values())  # <bos>, <eos>, <para>, <sent>: ids 256..259


def byte_chars() -> list[str]:
    """The printable character that `ByteLevel` uses for each byte (GPT-2's table), indexed by byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    others = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(others)) for b in range(256)]


BYTE_CHARS = byte_chars()
CHAR_BYTES = {c: b for b, c in enumerate(BYTE_CHARS)}


def sentences(text: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The sentences of `text` (each with the whitespace after it), and which of them start a paragraph.

    Returns (sentences, sentence byte offsets, paragraph byte offsets), as `segment` finds them.
    """
    data = text.encode("utf-8")
    para_starts, sent_starts = segment(data)
    bounds = [*sent_starts.tolist(), len(data)]
    pieces = [data[a:b].decode("utf-8") for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return pieces, sent_starts, para_starts


def renumbered(hf: Tokenizer) -> Tokenizer:
    """A trained tokenizer with ids 0..255 for the single bytes and 256..259 for the special tokens."""
    spec = json.loads(hf.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    fixed = [*BYTE_CHARS, *SPECIAL_TOKENS]
    merged = sorted(set(vocab) - set(fixed), key=vocab.__getitem__)
    ids = {token: i for i, token in enumerate([*fixed, *merged])}
    spec["model"]["vocab"] = ids
    for added in spec["added_tokens"]:
        added["id"] = ids[added["content"]]
    return Tokenizer.from_str(json.dumps(spec))


class BPETokenizer:
    """Byte-level BPE with anchors; build it with `train` or `load`."""

    def __init__(self, hf: Tokenizer, anchors: bool = True) -> None:
        self.hf = hf
        self.hf.encode_special_tokens = True  # text such as "<para>" stays text, never an anchor
        self.anchors = anchors
        self.vocab_size = hf.get_vocab_size()
        vocab = hf.get_vocab()
        self.pieces: list[bytes | None] = [None] * self.vocab_size  # each id's bytes; None for anchors
        for token, i in vocab.items():
            if token not in SPECIAL_TOKENS:
                self.pieces[i] = bytes(CHAR_BYTES[c] for c in token)

    @classmethod
    def train(cls, documents: Iterable[str], vocab_size: int, anchors: bool = True) -> BPETokenizer:
        """Learn merges from the sentences of `documents` until `vocab_size` ids (fewer if text runs out)."""
        hf = Tokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        hf.train_from_iterator(_all_sentences(documents), trainer)
        return cls(renumbered(hf), anchors)

    @classmethod
    def load(cls, path: Path, anchors: bool = True) -> BPETokenizer:
        if not path.is_file():
            raise ConfigError(
                f"the BPE tokenizer {path} is missing; delete {path.parent} to rebuild the cache"
            )
        return cls(Tokenizer.from_file(str(path)), anchors)

    def save(self, path: Path) -> None:
        self.hf.save(str(path))

    def encode(self, text: str, document: bool = True) -> Encoded:
        """Encode text; with `document`, anchors include BOS and EOS around it."""
        pieces, sent_starts, para_starts = sentences(text)
        ids = [e.ids for e in self.hf.encode_batch(pieces, add_special_tokens=False)]
        lengths = np.array([len(x) for x in ids], dtype=np.int64)
        tokens = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.uint16, count=int(lengths.sum()))
        starts = np.cumsum(lengths) - lengths  # token offset of each sentence
        return assemble(tokens, starts[np.isin(sent_starts, para_starts)], starts, self.anchors, document)

    def decode(self, ids: list[int] | np.ndarray, show_special: bool = False) -> str:
        """Tokens back to text; anchor tokens are dropped, or shown as <bos>, <para>, ..."""
        return decode_pieces(ids, self.pieces, show_special)


def _all_sentences(documents: Iterable[str]) -> Iterator[str]:
    for doc in documents:
        yield from sentences(doc)[0]
