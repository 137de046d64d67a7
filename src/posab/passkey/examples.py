"""Passkey examples (needle in a haystack), for the training mix and the needle evaluation.

An example is a contiguous slice of ordinary corpus text (the filler) with a needle paragraph hidden at a
chosen depth, ending with a query paragraph whose last `key_digits` tokens are the key:

    filler[:cut] BLANK "The pass key is 48213. Remember it." BLANK filler[cut:] BLANK
    "What is the pass key? The pass key is 48213"

At depth 0 the first filler piece is empty and at depth 1 the second: the empty piece and its blank line
are left out (no run of blank lines), and the filler is one blank line longer, so every example has
exactly the length asked for. The filler starts at a word boundary of the corpus text (the first within
`WORD_SEARCH` tokens of the drawn start), and the needle's cut is the word boundary nearest round(depth *
filler) within `WORD_SEARCH` tokens (kept where there is none): no word is split around the needle.

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
WORD_SEARCH = 32  # tokens searched on each side for a word boundary
WHITESPACE = frozenset(b" \t\n\r")


@dataclass
class PasskeyExample:
    """One example; tokens, sentence, paragraph: (length,) int64; the key is tokens[key_start:]."""

    tokens: np.ndarray
    sentence: np.ndarray
    paragraph: np.ndarray
    key: str  # the key the query asks for: the last tokens
    key_start: int
    filler_start: int = 0  # where the filler starts in the stream
    depth: float = 0.0
    needle_key: str = ""  # the key the needle holds ("" = `key`; another key for the retrieval control)
    needle_key_start: int = 0  # where the needle's key digits start (one token per digit)

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


def encode_paragraph(tokenizer: Tokenizer, template: str, key: str) -> Encoded:
    """`template` with the key filled in, encoded as a paragraph of its own (int64 arrays)."""
    enc = tokenizer.encode(template.format(key=key), document=False)
    return Encoded(*(a.astype(np.int64) for a in (enc.tokens, enc.sentence, enc.paragraph)))


def filler_length(tokenizer: Tokenizer, length: int, key_digits: int) -> int:
    """Filler tokens in an example of `length` tokens with a needle inside the filler (three blank lines;
    at depth 0 or 1 the filler is one blank line longer); ConfigError when not even one fits."""
    key = "1" * key_digits
    needle, query = (len(encode_paragraph(tokenizer, t, key)) for t in (NEEDLE, QUERY))
    fixed = needle + query + 3 * len(GAP)
    if length < fixed + 1:
        raise ConfigError(
            f"a passkey example of {length} tokens is too short: with {key_digits}-digit keys it needs at "
            f"least {fixed + 1} tokens (needle, query, key and blank lines: {fixed}, plus one filler token)"
        )
    return length - fixed


def longest_filler(tokenizer: Tokenizer, length: int, key_digits: int) -> int:
    """The most filler tokens an example of `length` tokens takes (depth 0 or 1: one blank line fewer)."""
    return filler_length(tokenizer, length, key_digits) + len(GAP)


def between_words(tokenizer: Tokenizer, tokens: np.ndarray) -> np.ndarray:
    """(N - 1,) bool: whether the cut between tokens[i] and tokens[i + 1] falls between words: next to
    whitespace or an anchor."""
    table = tokenizer.pieces  # anchors: None, or ids past the table
    pieces = [table[int(t)] if int(t) < len(table) else None for t in tokens]
    ends = np.asarray([not p or p[-1] in WHITESPACE for p in pieces[:-1]], dtype=bool)
    starts = np.asarray([not p or p[0] in WHITESPACE for p in pieces[1:]], dtype=bool)
    return ends | starts


def word_start(tokenizer: Tokenizer, stream: TokenStream, start: int, latest: int) -> int:
    """The first position p in start..min(start + WORD_SEARCH, latest) where a word begins (p = 0, or the
    cut before stream[p] is between words); `start` when there is none."""
    if start == 0:
        return 0
    window = np.asarray(stream.tokens[start - 1 : min(latest, start + WORD_SEARCH) + 1])
    cuts = between_words(tokenizer, window)  # cut i: before stream position start + i
    return start + int(np.argmax(cuts)) if cuts.any() else start


def nearest_cut(cuts: np.ndarray, target: int) -> int:
    """The cut c in 1..len(cuts) (before token c; `cuts[c - 1]` says whether it is between words) nearest to
    `target` within WORD_SEARCH (ties: the earlier one), or `target` when there is none."""
    for step in range(WORD_SEARCH + 1):
        for c in (target - step, target + step):
            if 1 <= c <= len(cuts) and cuts[c - 1]:
                return c
    return target


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
    """An example of exactly `length` tokens with the needle at `depth` of the filler (module docstring).

    Draws the key, then the filler's start in `stream`, from `rng`. Depth 0 puts the needle at the very
    start, depth 1 right before the query (a blank line in between).
    """
    if not 0 <= depth <= 1:
        raise ConfigError(f"passkey depth={depth} must be in [0, 1]")
    filler = longest_filler(tokenizer, length, key_digits)
    check_stream(stream, filler, length)
    key = random_key(rng, key_digits)
    start = int(rng.integers(0, len(stream) - filler + 1))
    return passkey_example(stream, tokenizer, length, depth, start, key)


def passkey_example(
    stream: TokenStream,
    tokenizer: Tokenizer,
    length: int,
    depth: float,
    start: int,
    key: str,
    needle_key: str = "",
) -> PasskeyExample:
    """The example with its filler drawn from `stream` at `start` (moved to a word boundary), the query's
    key `key` and the needle's key `needle_key` ("" = the same)."""
    inside = filler_length(tokenizer, length, len(key))  # the filler with the needle inside it
    whole = depth in (0.0, 1.0) or inside < 2  # one filler piece: one blank line fewer, its bytes to filler
    filler = inside + (len(GAP) if whole else 0)
    start = word_start(tokenizer, stream, start, len(stream) - filler)
    if whole:
        cut = 0 if depth < 0.5 else filler
    else:
        target = min(max(int(round(depth * filler)), 1), filler - 1)  # both pieces non-empty
        cut = nearest_cut(between_words(tokenizer, np.asarray(stream.tokens[start : start + filler])), target)
    needle = encode_paragraph(tokenizer, NEEDLE, needle_key or key)
    pieces = [
        filler_slice(stream, start, start + cut),
        needle,
        filler_slice(stream, start + cut, start + filler),
    ]
    parts = [gap_after(p) for p in pieces if len(p)]
    joined = concatenate([*parts, encode_paragraph(tokenizer, QUERY, key)])
    assert len(joined) == length, (len(joined), length)
    needle_at = len(parts[0]) if cut > 0 else 0  # the first filler piece and its blank line come first
    digits_at = needle_at + token_at_byte(tokenizer, needle.tokens, len(NEEDLE.split("{key}")[0].encode()))
    return PasskeyExample(
        joined.tokens,
        joined.sentence,
        joined.paragraph,
        key,
        length - len(key),
        start,
        depth,
        needle_key or key,
        digits_at,
    )


def token_at_byte(tokenizer: Tokenizer, tokens: np.ndarray, offset: int) -> int:
    """The index of the first text token whose bytes start at byte `offset` of the tokens' text (anchors
    stand for no bytes)."""
    table, position = tokenizer.pieces, 0
    for index, token in enumerate(int(t) for t in tokens):
        piece = table[token] if token < len(table) else None
        if piece and position == offset:
            return index
        position += len(piece or b"")
    raise ValueError(f"no token starts at byte {offset}")


def with_needle_key(
    stream: TokenStream, tokenizer: Tokenizer, example: PasskeyExample, key: str
) -> PasskeyExample:
    """The same example (filler, depth, query) with `key` in the needle instead: the retrieval control."""
    return passkey_example(
        stream, tokenizer, len(example), example.depth, example.filler_start, example.key, needle_key=key
    )


def examples_batch(examples: list[PasskeyExample]) -> Batch:
    """Examples of T + 1 tokens as a batch of T inputs: inputs = tokens[:-1], targets = tokens[1:]."""
    tokens = torch.from_numpy(np.stack([e.tokens for e in examples]))  # (B, T+1)
    sentence = torch.from_numpy(np.stack([e.sentence[:-1] for e in examples]))  # (B, T)
    paragraph = torch.from_numpy(np.stack([e.paragraph[:-1] for e in examples]))  # (B, T)
    key_mask = torch.zeros(len(examples), tokens.shape[1] - 1, dtype=torch.bool)  # (B, T)
    for row, example in enumerate(examples):
        key_mask[row, -len(example.key) :] = True  # the key is the last targets
    return Batch(tokens[:, :-1], tokens[:, 1:], sentence, paragraph, key_mask)


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
