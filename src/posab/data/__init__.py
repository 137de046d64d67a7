"""Data: corpora, the byte or BPE tokenizer with anchors, cached token streams and batches."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from posab.data.bpe import TOKENIZER_FILE, BPETokenizer
from posab.data.config import DataConfig, SyntheticConfig, TaskConfig
from posab.data.corpora import corpus_identity, load_documents, load_eval_documents
from posab.data.streams import (
    Batch,
    EncodedSplit,
    TokenStream,
    cache_key,
    encode_split,
    encode_splits,
    fill_cache,
    load_cached,
)
from posab.data.tasks import TaskStream, TaskTokenizer, task_named
from posab.data.tasks.stream import TRAIN_INDICES
from posab.data.tokenizer import ByteTokenizer, Tokenizer
from posab.errors import ConfigError
from posab.io import publish_directory

__all__ = [
    "Batch",
    "CorpusData",
    "DataConfig",
    "ExampleMix",
    "SyntheticConfig",
    "TokenStream",
    "TrainSampler",
    "eval_corpus_stream",
    "prepare_data",
    "run_tokenizer",
    "token_cache_folder",
]

log = logging.getLogger(__name__)


@dataclass
class CorpusData:
    tokenizer: Tokenizer
    streams: dict[str, TokenStream]
    cache_dir: Path

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size


def prepare_data(cfg: DataConfig) -> CorpusData:
    """Tokenize the corpus once and memory-map it from the cache afterwards.

    With `data.tokenizer=bpe` a BPE is trained on the training split first; it is saved in the cache
    folder with the streams it encoded, and loaded from there. A task (`data.source=task`) has nothing to
    tokenize: its splits generate their examples (`task_data`).
    """
    if cfg.source == "task":
        return task_data(cfg.task)
    identity = corpus_identity(cfg)
    folder = token_cache_folder(cfg, identity)
    streams = load_cached(folder)
    if streams is None:
        log.info("tokenizing corpus into %s", folder)
        docs = load_documents(cfg)
        tokenizer = build_tokenizer(cfg, docs["train"])
        publish(folder, encode_splits(docs, tokenizer, cfg.progress), identity, tokenizer)
        streams = load_cached(folder)
        assert streams is not None
    return CorpusData(tokenizer=load_tokenizer(cfg, folder), streams=streams, cache_dir=folder)


def task_data(cfg: TaskConfig) -> CorpusData:
    """A task's three splits (`posab.data.tasks.stream`) and its tokenizer; `cache_dir` only names it."""
    task = task_named(cfg.name)
    train, test = tuple(cfg.train_lengths), tuple(cfg.test_lengths)
    streams = {
        "train": TaskStream(task, "train", train, cfg.seed, TRAIN_INDICES),
        "valid": TaskStream(task, "valid", train, cfg.seed, cfg.valid_examples),
        "test": TaskStream(task, "test", test, cfg.seed, TRAIN_INDICES, train_lengths=train),
    }
    return CorpusData(TaskTokenizer(), streams, Path(f"task-{cfg.name}"))  # type: ignore[arg-type]


def token_cache_folder(cfg: DataConfig, identity: dict[str, Any] | None = None) -> Path:
    """Where `prepare_data` caches the corpus's token streams (and a BPE tokenizer with them)."""
    identity = corpus_identity(cfg) if identity is None else identity
    return Path(cfg.cache_dir).expanduser() / f"tokens-{cache_key(identity, tokenizer_settings(cfg))}"


def run_tokenizer(cfg: DataConfig) -> Tokenizer:
    """A run's tokenizer without loading its corpus where it can: the byte tokenizer, or the BPE saved with
    the cached streams; `prepare_data` (tokenizing the corpus) only when that cache is gone."""
    if cfg.source == "task":
        return TaskTokenizer()
    if cfg.tokenizer == "bytes":
        return ByteTokenizer(anchors=cfg.anchors)
    folder = token_cache_folder(cfg)
    if (folder / TOKENIZER_FILE).is_file():
        return load_tokenizer(cfg, folder)
    return prepare_data(cfg).tokenizer


def eval_corpus_stream(
    path: str, fmt: str, tokenizer: Tokenizer, where: str, windows_per_document: int | None = None
) -> TokenStream:
    """An evaluation corpus (`eval.corpora`) encoded with the run's tokenizer into one stream: its
    documents concatenated in file order, each with its own anchors (BOS ... EOS), and the document index
    of every token; `windows_per_document` places its evaluation windows inside documents
    (`TokenStream.document_windows`). Not cached: WikiText-2's test split (1.3 MB) encodes in under a
    second as bytes, pg-books-test (21.9 MB) in a few seconds."""
    encoded = encode_split(where, load_eval_documents(path, fmt, where), tokenizer, progress=False)
    stream = encoded.stream
    return TokenStream(
        stream.tokens,
        stream.sentence,
        stream.paragraph,
        split=where,
        document=encoded.document,
        windows_per_document=windows_per_document,
    )


def tokenizer_settings(cfg: DataConfig) -> dict[str, Any]:
    """What the token streams depend on besides the corpus, for the cache key."""
    if cfg.tokenizer == "bytes":
        return {"tokenizer": "bytes", "anchors": cfg.anchors}
    if cfg.tokenizer == "bpe":
        return {"tokenizer": "bpe", "anchors": cfg.anchors, "vocab_size": cfg.vocab_size}
    raise ConfigError(f"data.tokenizer={cfg.tokenizer!r}: use bytes or bpe")


def build_tokenizer(cfg: DataConfig, train_docs: list[str]) -> Tokenizer:
    """The byte tokenizer, or a BPE trained on the training documents."""
    if cfg.tokenizer == "bytes":
        return ByteTokenizer(anchors=cfg.anchors)
    log.info("training a byte-level BPE of %d ids on %d documents", cfg.vocab_size, len(train_docs))
    tokenizer = BPETokenizer.train(train_docs, cfg.vocab_size, cfg.anchors)
    log.info("the BPE has %d ids", tokenizer.vocab_size)
    return tokenizer


def load_tokenizer(cfg: DataConfig, folder: Path) -> Tokenizer:
    """The tokenizer of the streams cached in `folder`."""
    if cfg.tokenizer == "bytes":
        return ByteTokenizer(anchors=cfg.anchors)
    return BPETokenizer.load(folder / TOKENIZER_FILE, cfg.anchors)


def publish(
    folder: Path, encoded: dict[str, EncodedSplit], identity: dict[str, Any], tokenizer: Tokenizer
) -> None:
    """Cache the streams in `folder`, a BPE tokenizer with them, in one atomic rename.

    When another process has published `folder` first, its cache is kept (and ours dropped).
    """

    def fill(staging: Path) -> None:
        fill_cache(staging, encoded, identity)
        if isinstance(tokenizer, BPETokenizer):
            tokenizer.save(staging / TOKENIZER_FILE)

    publish_directory(folder, fill)


class ExampleMix(Protocol):
    """Examples mixed into the training batches at a `rate` (the passkey wing's `PasskeyMix`)."""

    rate: float  # the share of windows, drawn binomially per batch

    def check(self, length: int) -> None: ...  # fails clearly when a window cannot hold one
    def batch(self, count: int, length: int, rng: np.random.Generator) -> Batch: ...  # drawn from `rng`


class TrainSampler:
    """Random training windows of `seq_len` tokens, reproducible from its seed; a `mix` replaces a share of
    them (binomial per batch) with its own examples of the same length, drawn from the same generator."""

    def __init__(
        self,
        stream: TokenStream,
        seq_len: int,
        batch_size: int,
        seed: int,
        mix: ExampleMix | None = None,
        shard: tuple[int, int] = (0, 1),
    ) -> None:
        """`shard` = (rank, world size): every rank draws the same global batch and keeps its own rows."""
        stream.fixed_windows(seq_len, 1)  # fails clearly when the split cannot hold one window
        self.stream, self.seq_len, self.batch_size = stream, seq_len, batch_size
        self.mix = mix if mix is not None and mix.rate > 0 else None
        self.rank, self.world_size = shard
        self.rng = np.random.default_rng(seed)
        if self.mix is not None:
            self.mix.check(seq_len)

    def state_dict(self) -> dict[str, Any]:
        """The random generator's state, as plain containers (resumable, `weights_only`-loadable)."""
        return self.rng.bit_generator.state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state

    def next_batch(self) -> Batch:
        mixed = int(self.rng.binomial(self.batch_size, self.mix.rate)) if self.mix else 0
        starts = self.stream.random_starts(self.rng, self.batch_size - mixed, self.seq_len)
        batch = self.stream.batch(starts, self.seq_len)
        if self.mix and mixed:
            batch = batch.cat(self.mix.batch(mixed, self.seq_len, self.rng))
        return batch.rows(self.rank, self.world_size)
