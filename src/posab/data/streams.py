"""Packed token streams, cached on disk and memory-mapped; training and validation windows.

Each split is one stream: the concatenated documents' token ids with the sentence and paragraph index of
every token. The cache is keyed by a hash of the corpus contents and the tokenizer settings, so a change
to either builds a new one and nothing stale is read.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from posab.data.tokenizer import Encoded, Tokenizer, concatenate
from posab.distributed import progress_bar
from posab.errors import ConfigError

CACHE_FORMAT = 2  # 2: the document index of every token (`<split>.document.npy`)
FIELDS = ("tokens", "sentence", "paragraph")


@dataclass
class Batch:
    """inputs, targets, sentence, paragraph: (B, T) int64 tensors; key_mask: (B, T) bool, True at the
    targets that are a passkey's digits (passkey examples), or None when no row is one; loss_mask: (B, T)
    bool, True at the targets the loss scores (a task's answer tokens: `posab.data.tasks`), or None when
    it scores every target (text); positions: (T,) the inputs' positions, shared by every row (a task's
    coupled positions: `posab.data.tasks`), or None for 0 .. T - 1."""

    inputs: Tensor
    targets: Tensor
    sentence: Tensor
    paragraph: Tensor
    key_mask: Tensor | None = None
    loss_mask: Tensor | None = None
    positions: Tensor | None = None

    def masks(self) -> tuple[Tensor, Tensor]:
        """The key and loss masks made explicit: (no key, every target scored) where they are None."""
        keys = (
            self.key_mask if self.key_mask is not None else torch.zeros_like(self.targets, dtype=torch.bool)
        )
        scored = (
            self.loss_mask if self.loss_mask is not None else torch.ones_like(self.targets, dtype=torch.bool)
        )
        return keys, scored

    def tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """The six tensors, the masks made explicit (`masks`)."""
        return self.inputs, self.targets, self.sentence, self.paragraph, *self.masks()

    def with_tensors(self, tensors: list[Tensor], like: list[Batch]) -> Batch:
        """A batch of these six tensors, keeping a mask only where one of `like` had it."""
        has_keys = any(b.key_mask is not None for b in like)
        has_loss = any(b.loss_mask is not None for b in like)
        return Batch(
            *tensors[:4],
            key_mask=tensors[4] if has_keys else None,
            loss_mask=tensors[5] if has_loss else None,
            positions=self.positions,
        )

    def to(self, device: torch.device | str) -> Batch:
        moved = self.with_tensors([t.to(device, non_blocking=True) for t in self.tensors()], [self])
        moved.positions = None if self.positions is None else self.positions.to(device, non_blocking=True)
        return moved

    def cat(self, other: Batch) -> Batch:
        """Rows of both batches: (B1 + B2, T); their positions must be the same."""
        mine, theirs = self.positions, other.positions
        if (mine is None) != (theirs is None) or (mine is not None and not torch.equal(mine, theirs)):
            raise ValueError("batches of different positions cannot share rows: a batch shares its positions")
        joined = [torch.cat([a, b]) for a, b in zip(self.tensors(), other.tensors(), strict=True)]
        return self.with_tensors(joined, [self, other])

    def rows(self, rank: int, world_size: int) -> Batch:
        """Shard `rank` of `world_size` equal shards of the rows (the whole batch for one process)."""
        if world_size == 1:
            return self
        size = self.inputs.shape[0] // world_size
        return self.with_tensors([t[rank * size : (rank + 1) * size] for t in self.tensors()], [self])

    @property
    def num_tokens(self) -> int:
        return self.targets.numel()

    @property
    def scored_tokens(self) -> int:
        """The targets the loss scores: every one, or those of `loss_mask`."""
        return self.num_tokens if self.loss_mask is None else int(self.loss_mask.sum())


class TokenStream:
    """One split: memory-mapped arrays of equal length; `document` (the document index of every token) is
    there for streams built from documents, None otherwise."""

    def __init__(
        self,
        tokens: np.ndarray,
        sentence: np.ndarray,
        paragraph: np.ndarray,
        split: str,
        document: np.ndarray | None = None,
        windows_per_document: int | None = None,
    ) -> None:
        """`windows_per_document`: the evaluation windows lie within documents, that many in each
        (`evaluation_windows`); None: spread evenly over the whole stream (`fixed_windows`)."""
        self.tokens, self.sentence, self.paragraph, self.split = tokens, sentence, paragraph, split
        self.document = document
        self.windows_per_document = windows_per_document

    def __len__(self) -> int:
        return len(self.tokens)

    def random_starts(self, rng: np.random.Generator, count: int, length: int, batch: int = 0) -> np.ndarray:
        """`count` window starts of `length` inputs drawn uniformly (the training sampler's draw; `batch`,
        the training batch it is for, is read by a task's length curriculum, not by text)."""
        return rng.integers(0, len(self) - length, size=count)

    def windows_available(self, length: int) -> int:
        """How many non-overlapping windows of `length` inputs (plus one target) fit."""
        return max(0, (len(self) - 1) // length)

    def batch(self, starts: np.ndarray | list[int], length: int) -> Batch:
        """Windows of `length` inputs starting at `starts`; structure indices restart at 0 in each window."""
        rows = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(length + 1)[None, :]  # (B, T+1)
        tokens = torch.from_numpy(self.tokens[rows].astype(np.int64))  # (B, T+1)
        sentence = torch.from_numpy(self.sentence[rows[:, :-1]].astype(np.int64))  # (B, T)
        paragraph = torch.from_numpy(self.paragraph[rows[:, :-1]].astype(np.int64))  # (B, T)
        return Batch(
            inputs=tokens[:, :-1],
            targets=tokens[:, 1:],
            sentence=sentence - sentence[:, :1],
            paragraph=paragraph - paragraph[:, :1],
        )

    def target_documents(self, starts: np.ndarray, length: int) -> np.ndarray | None:
        """(B, T) document index of each target of the windows (`batch(starts, length).targets`), or None
        when the stream has no document index."""
        if self.document is None:
            return None
        rows = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(1, length + 1)[None, :]  # (B, T)
        return np.asarray(self.document[rows])

    def window_documents(self, starts: np.ndarray, length: int) -> np.ndarray | None:
        """(N,) the document each window of `length` tokens belongs to: the one holding most of its targets
        (the lower index on a tie); None when the stream has no document index."""
        documents = self.target_documents(starts, length)  # (N, L) or None
        if documents is None:
            return None
        return np.asarray([np.bincount(row).argmax() for row in documents.astype(np.int64)], dtype=np.int64)

    def fixed_windows(self, length: int, count: int) -> np.ndarray:
        """Starts of `count` non-overlapping windows spread evenly over the split (all if fewer fit)."""
        available = self.windows_available(length)
        if available == 0:
            raise ConfigError(
                f"the {self.split} split has {len(self)} tokens, too few for one window of {length} tokens "
                f"(needs {length + 1}); use a shorter length or more data"
            )
        picks = np.unique(np.linspace(0, available - 1, min(count, available)).round().astype(np.int64))
        return picks * length

    def evaluation_windows(self, length: int, count: int) -> np.ndarray:
        """The perplexity evaluation's windows of `length` inputs: `document_windows` when the stream sets
        `windows_per_document`, else `count` windows spread over the stream (`fixed_windows`)."""
        if self.windows_per_document is None:
            return self.fixed_windows(length, count)
        return self.document_windows(length, self.windows_per_document)

    def document_windows(self, length: int, per_document: int) -> np.ndarray:
        """Starts of up to `per_document` non-overlapping windows of `length` inputs (plus one target) inside
        each document, none crossing a document's end: at the fractions (i + 1/2) / k of the span where a
        window fits (k = `per_document`, or as many as the document holds), the same places in every run.
        A document too short for one window has none. Document by document, in stream order: (N,)."""
        if self.document is None:
            raise ConfigError(f"the {self.split} stream records no documents to place windows in")
        bounds = document_bounds(self.document)  # (D + 1,)
        starts = [
            place_windows(int(begin), int(end), length, per_document)
            for begin, end in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        found = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
        if len(found) == 0:
            raise ConfigError(
                f"no document of the {self.split} stream holds a window of {length} tokens "
                f"(needs {length + 1}); use a shorter length or longer documents"
            )
        return found


def document_bounds(document: np.ndarray) -> np.ndarray:
    """(D + 1,) the first token of each document, then the stream's end (documents are contiguous runs of
    one index in `document`)."""
    changes = np.flatnonzero(np.diff(document)) + 1  # (D - 1,)
    return np.concatenate([[0], changes, [len(document)]]).astype(np.int64)


def place_windows(begin: int, end: int, length: int, per_document: int) -> np.ndarray:
    """Starts of k non-overlapping windows of `length` + 1 tokens in [begin, end): the room is the span of
    starts that fit (end - begin - length - 1 tokens), k = min(per_document, room // length), at least 1
    where one fits, and window i starts at (i + 1/2) / k of the room, so that consecutive starts are at least
    room / k >= `length` apart: (k,)."""
    room = end - begin - length - 1
    if room < 0:
        return np.zeros(0, dtype=np.int64)
    count = min(per_document, max(1, room // length))
    return begin + np.floor((np.arange(count) + 0.5) * room / count).astype(np.int64)  # (k,)


def cache_key(identity: dict[str, Any], tokenizer: dict[str, Any]) -> str:
    """The cache folder's key, from the corpus identity and the tokenizer settings.

    `tokenizer`: e.g. {"tokenizer": "bytes", "anchors": True}, or with "bpe" also its "vocab_size".
    """
    payload = {"format": CACHE_FORMAT, "corpus": identity, **tokenizer}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def load_cached(folder: Path) -> dict[str, TokenStream] | None:
    if not (folder / "meta.json").exists():
        return None
    splits = json.loads((folder / "meta.json").read_text())["splits"]
    return {
        split: TokenStream(
            *(np.load(folder / f"{split}.{f}.npy", mmap_mode="r") for f in FIELDS),
            split=split,
            document=np.load(folder / f"{split}.document.npy", mmap_mode="r"),
        )
        for split in splits
    }


def fill_cache(folder: Path, encoded: dict[str, EncodedSplit], identity: dict[str, Any]) -> None:
    """Write the streams, their document index and meta.json into an existing `folder` (see
    `posab.data.publish`)."""
    for split, enc in encoded.items():
        for name in FIELDS:
            np.save(folder / f"{split}.{name}.npy", getattr(enc.stream, name))
        np.save(folder / f"{split}.document.npy", enc.document)
    sizes = {s: len(e.stream) for s, e in encoded.items()}
    meta = {"splits": list(encoded), "corpus": identity, "sizes": sizes}
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))


@dataclass
class EncodedSplit:
    """A split's documents encoded into one stream, and the document index of every token: (N,) int32."""

    stream: Encoded
    document: np.ndarray


def encode_splits(
    docs: dict[str, list[str]], tokenizer: Tokenizer, progress: bool
) -> dict[str, EncodedSplit]:
    """Each split's documents encoded; a progress bar per split (`data.progress`) counts the characters."""
    return {split: encode_split(split, texts, tokenizer, progress) for split, texts in docs.items()}


def encode_split(split: str, texts: list[str], tokenizer: Tokenizer, progress: bool) -> EncodedSplit:
    parts = []
    size, desc = sum(map(len, texts)), f"tokenizing {split}"
    with progress_bar(None, desc, progress and size > 0, total=size, unit="char", unit_scale=True) as bar:
        for doc in texts:
            parts.append(tokenizer.encode(doc))
            bar.update(len(doc))
    document = np.repeat(np.arange(len(parts), dtype=np.int32), [len(p) for p in parts])  # (N,)
    return EncodedSplit(concatenate(parts), document)
