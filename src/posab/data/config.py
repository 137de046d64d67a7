"""The `data` config group's schema, validated where it is consumed."""

from __future__ import annotations

from dataclasses import dataclass, field

from posab.errors import require

SOURCES = ("synthetic", "text", "hub")
TOKENIZERS = ("bytes", "bpe")


@dataclass
class SyntheticConfig:
    seed: int = 0
    vocab_size: int = 2000
    train_docs: int = 400
    valid_docs: int = 40
    test_docs: int = 40


@dataclass
class DataConfig:
    source: str = "synthetic"  # synthetic | text | hub
    path: str | None = None  # text: a folder (with train/valid/test or not), a file, or a glob
    hub_dataset: str | None = None  # hub: e.g. Salesforce/wikitext
    hub_subset: str | None = None  # hub: e.g. wikitext-103-raw-v1
    hub_local_dir: str | None = None  # hub: an offline copy (parquet or text files) instead of the hub
    text_field: str = "text"
    anchors: bool = True
    tokenizer: str = "bytes"  # bytes | bpe (byte-level BPE trained on the train split)
    vocab_size: int = 4096  # bpe: ids in all (256 bytes, 4 anchors, merges); at most 65536
    needle_rate: float = 0.05  # share of training windows that are passkey examples (0 turns it off)
    cache_dir: str = ".cache/posab"
    progress: bool = True  # tqdm bars (rank 0 only) while hashing corpus files and tokenizing
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)

    def validate(self) -> None:
        """Check values that types alone cannot, before any work is done."""
        require(self.source in SOURCES, f"data.source={self.source!r}: use one of {', '.join(SOURCES)}")
        require(
            self.tokenizer in TOKENIZERS,
            f"data.tokenizer={self.tokenizer!r}: use one of {', '.join(TOKENIZERS)}",
        )
        require(
            261 <= self.vocab_size <= 65536,
            f"data.vocab_size={self.vocab_size} must be in [261, 65536]: above the 256 bytes and 4 anchor "
            "tokens, and within 16-bit token ids",
        )
        require(0 <= self.needle_rate <= 1, f"data.needle_rate={self.needle_rate} must be in [0, 1]")
