"""Data: corpora, the byte tokenizer with anchors, cached token streams and batches."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from posab.config import DataConfig
from posab.data.corpora import corpus_identity, load_documents
from posab.data.passkey import filler_length, passkey_batch
from posab.data.streams import Batch, TokenStream, cache_key, encode_splits, load_cached, write_cache
from posab.data.tokenizer import ByteTokenizer

__all__ = ["Batch", "CorpusData", "TokenStream", "TrainSampler", "prepare_data"]

log = logging.getLogger(__name__)


@dataclass
class CorpusData:
    tokenizer: ByteTokenizer
    streams: dict[str, TokenStream]
    cache_dir: Path

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size


def prepare_data(cfg: DataConfig) -> CorpusData:
    """Tokenize the corpus once and memory-map it from the cache afterwards."""
    tokenizer = ByteTokenizer(anchors=cfg.anchors)
    identity = corpus_identity(cfg)
    folder = Path(cfg.cache_dir).expanduser() / f"tokens-{cache_key(identity, tokenizer)}"
    streams = load_cached(folder)
    if streams is None:
        log.info("tokenizing corpus into %s", folder)
        write_cache(folder, encode_splits(load_documents(cfg), tokenizer), identity)
        streams = load_cached(folder)
        assert streams is not None
    return CorpusData(tokenizer=tokenizer, streams=streams, cache_dir=folder)


class TrainSampler:
    """Random training windows of `seq_len` tokens, reproducible from its seed.

    A share `needle_rate` of the windows (binomial per batch) are passkey examples of the same length, so
    the model learns the retrieval format that the needle evaluation asks for.
    """

    def __init__(
        self,
        stream: TokenStream,
        tokenizer: ByteTokenizer,
        seq_len: int,
        batch_size: int,
        seed: int,
        needle_rate: float = 0.0,
        key_digits: int = 5,
        shard: tuple[int, int] = (0, 1),
    ) -> None:
        """`shard` = (rank, world size): every rank draws the same global batch and keeps its own rows."""
        stream.fixed_windows(seq_len, 1)  # fails clearly when the split cannot hold one window
        self.stream, self.tokenizer = stream, tokenizer
        self.seq_len, self.batch_size, self.needle_rate = seq_len, batch_size, needle_rate
        self.key_digits = key_digits
        self.rank, self.world_size = shard
        self.rng = np.random.default_rng(seed)
        if needle_rate > 0:
            filler_length(
                tokenizer, seq_len + 1, key_digits
            )  # fails clearly when the window cannot hold a passkey

    def state_dict(self) -> dict[str, Any]:
        """The random generator's state, as plain containers (resumable, `weights_only`-loadable)."""
        return self.rng.bit_generator.state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state

    def next_batch(self) -> Batch:
        needles = int(self.rng.binomial(self.batch_size, self.needle_rate)) if self.needle_rate > 0 else 0
        high = len(self.stream) - self.seq_len - 1
        starts = self.rng.integers(0, high + 1, size=self.batch_size - needles)
        batch = self.stream.batch(starts, self.seq_len)
        if needles:
            batch = batch.cat(
                passkey_batch(self.stream, self.tokenizer, needles, self.seq_len, self.rng, self.key_digits)
            )
        return batch.rows(self.rank, self.world_size)
