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
from posab.errors import ConfigError

CACHE_FORMAT = 1
FIELDS = ("tokens", "sentence", "paragraph")


@dataclass
class Batch:
    """inputs, targets, sentence, paragraph: (B, T) int64 tensors."""

    inputs: Tensor
    targets: Tensor
    sentence: Tensor
    paragraph: Tensor

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            *(
                t.to(device, non_blocking=True)
                for t in (self.inputs, self.targets, self.sentence, self.paragraph)
            )
        )

    def cat(self, other: Batch) -> Batch:
        """Rows of both batches: (B1 + B2, T)."""
        fields = ("inputs", "targets", "sentence", "paragraph")
        return Batch(*(torch.cat([getattr(self, f), getattr(other, f)]) for f in fields))

    def rows(self, rank: int, world_size: int) -> Batch:
        """Shard `rank` of `world_size` equal shards of the rows (the whole batch for one process)."""
        if world_size == 1:
            return self
        size = self.inputs.shape[0] // world_size
        fields = ("inputs", "targets", "sentence", "paragraph")
        return Batch(*(getattr(self, f)[rank * size : (rank + 1) * size] for f in fields))

    @property
    def num_tokens(self) -> int:
        return self.targets.numel()


class TokenStream:
    """One split: memory-mapped arrays of equal length."""

    def __init__(self, tokens: np.ndarray, sentence: np.ndarray, paragraph: np.ndarray, split: str) -> None:
        self.tokens, self.sentence, self.paragraph, self.split = tokens, sentence, paragraph, split

    def __len__(self) -> int:
        return len(self.tokens)

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
            *(np.load(folder / f"{split}.{f}.npy", mmap_mode="r") for f in FIELDS), split=split
        )
        for split in splits
    }


def fill_cache(folder: Path, encoded: dict[str, Encoded], identity: dict[str, Any]) -> None:
    """Write the streams and their meta.json into an existing `folder` (see `posab.data.publish`)."""
    for split, enc in encoded.items():
        for name in FIELDS:
            np.save(folder / f"{split}.{name}.npy", getattr(enc, name))
    meta = {"splits": list(encoded), "corpus": identity, "sizes": {s: len(e) for s, e in encoded.items()}}
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))


def encode_splits(docs: dict[str, list[str]], tokenizer: Tokenizer) -> dict[str, Encoded]:
    return {split: concatenate([tokenizer.encode(doc) for doc in texts]) for split, texts in docs.items()}
