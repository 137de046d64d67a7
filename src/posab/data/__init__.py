"""Data: corpora, the byte tokenizer with anchors, cached token streams and batches."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from posab.config import DataConfig
from posab.data.corpora import corpus_identity, load_documents
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
    """Random training windows of `seq_len` tokens from one stream, reproducible from its seed."""

    def __init__(self, stream: TokenStream, seq_len: int, batch_size: int, seed: int) -> None:
        stream.fixed_windows(seq_len, 1)  # fails clearly when the split cannot hold one window
        self.stream, self.seq_len, self.batch_size = stream, seq_len, batch_size
        self.rng = np.random.default_rng(seed)

    def next_batch(self) -> Batch:
        high = len(self.stream) - self.seq_len - 1
        starts = self.rng.integers(0, high + 1, size=self.batch_size)
        return self.stream.batch(starts, self.seq_len)
