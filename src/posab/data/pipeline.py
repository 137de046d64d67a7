"""The data pipeline: a corpus tokenized once into cached token streams (`prepare_data`), a task's
generated splits (`task_data`), a run's tokenizer (`run_tokenizer`, kept in the run's folder by
`save_run_tokenizer`) and the evaluation corpora's streams (`eval_corpus_stream`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posab.data.bpe import TOKENIZER_FILE, BPETokenizer
from posab.data.config import DataConfig, TaskConfig
from posab.data.corpora import corpus_identity, load_documents, load_eval_documents
from posab.data.streams import (
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
from posab.io import atomic_write, publish_directory

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
    limit = cfg.max_position if cfg.positions == "coupled" else None  # coupled positions, or sequential
    streams = {
        "train": TaskStream(
            task, "train", train, cfg.seed, TRAIN_INDICES, max_position=limit, curriculum=cfg.curriculum
        ),
        "valid": TaskStream(task, "valid", train, cfg.seed, cfg.valid_examples, max_position=limit),
        "test": TaskStream(
            task, "test", test, cfg.seed, TRAIN_INDICES, train_lengths=train, max_position=limit
        ),
    }
    return CorpusData(TaskTokenizer(), streams, Path(f"task-{cfg.name}"))  # type: ignore[arg-type]


def token_cache_folder(cfg: DataConfig, identity: dict[str, Any] | None = None) -> Path:
    """Where `prepare_data` caches the corpus's token streams (and a BPE tokenizer with them)."""
    identity = corpus_identity(cfg) if identity is None else identity
    return Path(cfg.cache_dir).expanduser() / f"tokens-{cache_key(identity, tokenizer_settings(cfg))}"


def run_tokenizer(cfg: DataConfig, run_dir: Path | None = None) -> Tokenizer:
    """A run's tokenizer without loading its corpus where it can: the byte tokenizer (the config says it
    all), or the BPE kept in the run's folder (`save_run_tokenizer`), else the one saved with the cached
    streams; `prepare_data` (tokenizing the corpus) only when neither is there (a run from before)."""
    if cfg.source == "task":
        return TaskTokenizer()
    if cfg.tokenizer == "bytes":
        return ByteTokenizer(anchors=cfg.anchors)
    for folder in ([run_dir] if run_dir is not None else []) + [token_cache_folder(cfg)]:
        if (folder / TOKENIZER_FILE).is_file():
            return load_tokenizer(cfg, folder)
    return prepare_data(cfg).tokenizer


def save_run_tokenizer(tokenizer: Tokenizer, run_dir: Path) -> None:
    """Keep a BPE tokenizer in the run's folder (`TOKENIZER_FILE`, written atomically), so that the folder
    alone decodes and generates; a byte or task tokenizer needs nothing beyond the run's config."""
    if isinstance(tokenizer, BPETokenizer):
        atomic_write(run_dir / TOKENIZER_FILE, tokenizer.save)


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
