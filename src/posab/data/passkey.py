"""Passkey examples (needle in a haystack), for the training mix and the needle evaluation.

An example is a contiguous slice of ordinary corpus text (the filler) with a needle paragraph hidden at a
chosen depth, ending with a query paragraph whose last `key_digits` tokens are the key:

    filler[:cut] BLANK "The pass key is 48213. Remember it." BLANK filler[cut:] BLANK
    "What is the pass key? The pass key is 48213"

The needle and the query are encoded by the tokenizer, so they carry PARA and SENT anchors when the
tokenizer has anchors on, and sentence and paragraph indices as real text does. BLANK is a blank line
("\\n\\n"), in the text with anchors on or off, as between the paragraphs of a document: it ends the
paragraph before it (taking its indices; a lone paragraph at the very start), so the text shows the break
even without anchors. Each filler piece's indices are made relative to its start; across the pieces the
indices keep increasing from 0, as `tokenizer.concatenate` does for documents. The fixed part (needle,
query, key, three blank lines) is the same at every depth, so the filler always has the same length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from posab.data.streams import Batch, TokenStream
from posab.data.tokenizer import Encoded, Tokenizer, concatenate
from posab.errors import ConfigError

PARAGRAPH_GAP = "\n\n"
NEEDLE = "The pass key is {key}. Remember it."
QUERY = "What is the pass key? The pass key is {key}"
GAP = np.frombuffer(PARAGRAPH_GAP.encode(), dtype=np.uint8).astype(np.int64)  # a blank line, in bytes
EMPTY = Encoded(*(np.zeros(0, dtype=np.int64) for _ in range(3)))


@dataclass
class PasskeyExample:
    """One example; tokens, sentence, paragraph: (length,) int64; the key is tokens[key_start:]."""

    tokens: np.ndarray
    sentence: np.ndarray
    paragraph: np.ndarray
    key: str
    key_start: int

    def __len__(self) -> int:
        return len(self.tokens)


def random_key(rng: np.random.Generator, key_digits: int) -> str:
    """A uniformly random integer with exactly `key_digits` digits (no leading zero)."""
    return str(int(rng.integers(10 ** (key_digits - 1), 10**key_digits)))


def gap_after(part: Encoded) -> Encoded:
    """`part` followed by a blank line that stays in its last sentence and paragraph, as in documents."""
    sentence = int(part.sentence[-1]) if len(part) else 0
    paragraph = int(part.paragraph[-1]) if len(part) else 0
    return Encoded(
        tokens=np.concatenate([part.tokens, GAP]),
        sentence=np.concatenate([part.sentence, np.full(len(GAP), sentence, dtype=np.int64)]),
        paragraph=np.concatenate([part.paragraph, np.full(len(GAP), paragraph, dtype=np.int64)]),
    )


def end_paragraph(parts: list[Encoded]) -> list[Encoded]:
    """The non-empty `parts`, the last one followed by a blank line (a lone blank line when none is left)."""
    kept = [p for p in parts if len(p)]
    last = kept.pop() if kept else EMPTY
    return [*kept, gap_after(last)]


def encode_paragraph(tokenizer: Tokenizer, template: str, key: str) -> Encoded:
    """`template` with the key filled in, encoded as a paragraph of its own (int64 arrays)."""
    enc = tokenizer.encode(template.format(key=key), document=False)
    return Encoded(*(a.astype(np.int64) for a in (enc.tokens, enc.sentence, enc.paragraph)))


def filler_length(tokenizer: Tokenizer, length: int, key_digits: int) -> int:
    """Filler tokens in an example of `length` tokens; ConfigError when not even one fits."""
    key = "1" * key_digits
    needle, query = (len(encode_paragraph(tokenizer, t, key)) for t in (NEEDLE, QUERY))
    fixed = needle + query + 3 * len(GAP)
    if length < fixed + 1:
        raise ConfigError(
            f"a passkey example of {length} tokens is too short: with {key_digits}-digit keys it needs at "
            f"least {fixed + 1} tokens (needle, query, key and blank lines: {fixed}, plus one filler token)"
        )
    return length - fixed


def check_stream(stream: TokenStream, filler: int, length: int) -> None:
    """ConfigError when `stream` cannot supply `filler` contiguous tokens."""
    if len(stream) < filler:
        raise ConfigError(
            f"the {stream.split} split has {len(stream)} tokens, too few for the {filler} filler tokens of a "
            f"passkey example of {length} tokens; use shorter lengths or more data"
        )


def filler_slice(stream: TokenStream, start: int, stop: int) -> Encoded:
    """stream[start:stop] as int64 arrays, with indices relative to its first token."""
    tokens, sentence, paragraph = (
        np.asarray(a[start:stop], dtype=np.int64) for a in (stream.tokens, stream.sentence, stream.paragraph)
    )
    if stop > start:
        sentence, paragraph = sentence - sentence[0], paragraph - paragraph[0]
    return Encoded(tokens, sentence, paragraph)


def make_passkey_example(
    stream: TokenStream,
    tokenizer: Tokenizer,
    length: int,
    depth: float,
    rng: np.random.Generator,
    key_digits: int = 5,
) -> PasskeyExample:
    """An example of exactly `length` tokens; the needle follows round(depth * filler) filler tokens.

    Draws the key, then the filler's start in `stream`, from `rng`. Depth 0 puts the needle (after its
    blank line) at the very start, depth 1 right before the query (their blank lines in between).
    """
    if not 0 <= depth <= 1:
        raise ConfigError(f"passkey depth={depth} must be in [0, 1]")
    filler = filler_length(tokenizer, length, key_digits)
    check_stream(stream, filler, length)
    key = random_key(rng, key_digits)
    start = int(rng.integers(0, len(stream) - filler + 1))
    cut = start + int(round(depth * filler))
    needle = encode_paragraph(tokenizer, NEEDLE, key)
    parts = end_paragraph([filler_slice(stream, start, cut)])
    parts = end_paragraph([*parts, needle])
    parts = end_paragraph([*parts, filler_slice(stream, cut, start + filler)])
    joined = concatenate([*parts, encode_paragraph(tokenizer, QUERY, key)])
    return PasskeyExample(joined.tokens, joined.sentence, joined.paragraph, key, length - key_digits)


def examples_batch(examples: list[PasskeyExample]) -> Batch:
    """Examples of T + 1 tokens as a batch of T inputs: inputs = tokens[:-1], targets = tokens[1:]."""
    tokens = torch.from_numpy(np.stack([e.tokens for e in examples]))  # (B, T+1)
    sentence = torch.from_numpy(np.stack([e.sentence[:-1] for e in examples]))  # (B, T)
    paragraph = torch.from_numpy(np.stack([e.paragraph[:-1] for e in examples]))  # (B, T)
    return Batch(inputs=tokens[:, :-1], targets=tokens[:, 1:], sentence=sentence, paragraph=paragraph)


def passkey_batch(
    stream: TokenStream,
    tokenizer: Tokenizer,
    count: int,
    length: int,
    rng: np.random.Generator,
    key_digits: int = 5,
) -> Batch:
    """`count` examples of `length + 1` tokens at uniformly random depths: a batch of `length` inputs.

    The last `key_digits` targets of each row are its key; sentence and paragraph start at 0 in each row.
    """
    depths = rng.uniform(0.0, 1.0, size=count)
    return examples_batch(
        [make_passkey_example(stream, tokenizer, length + 1, float(d), rng, key_digits) for d in depths]
    )
