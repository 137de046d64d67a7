"""The `data` config group's schema, validated where it is consumed."""

from __future__ import annotations

from dataclasses import dataclass, field

from posab.data.tasks import TASKS, Task, task_named
from posab.errors import require

SOURCES = ("synthetic", "text", "hub", "task")
POSITION_OPTIONS = ("sequential", "coupled")  # data.task.positions
TOKENIZERS = ("bytes", "bpe")


@dataclass
class SyntheticConfig:
    seed: int = 0
    vocab_size: int = 2000
    train_docs: int = 400
    valid_docs: int = 40
    test_docs: int = 40


@dataclass
class TaskConfig:
    """`data.task` (`data=task task=NAME`, conf/task/): an algorithmic task whose examples are generated
    on the fly (`posab.data.tasks`); lengths are instance lengths (the task's own unit: symbols, digits,
    operands), each drawn uniformly from its split's inclusive range."""

    name: str = "copy"
    train_lengths: list[int] = field(default_factory=lambda: [1, 20])  # [low, high], inclusive
    test_lengths: list[int] = field(default_factory=lambda: [1, 40])  # scored by `eval.task`
    seq_len: int = 42  # the longest training sequence in tokens (train.seq_len): checked against the task
    valid_examples: int = 256  # the validation loss's fixed examples (train lengths, their own seed)
    seed: int = 0  # the examples' generator; the run's `seed` draws which training examples it sees
    positions: str = "sequential"  # sequential | coupled (position coupling: the task's `Task.coupled`)
    max_position: int | None = None  # coupled: a training batch's positions are shifted to at most this
    # a length curriculum: the training batches over which the longest training length rises, linearly,
    # from the shortest to train_lengths' longest (`TaskStream.longest_at`; Zaremba & Sutskever, 2014,
    # "Learning to Execute", section 4; Garg et al., NeurIPS 2022, section 3); 0: none, every training length
    # from the first batch
    curriculum: int = 0

    def validate(self) -> None:
        for name in ("train_lengths", "test_lengths"):
            low_high = getattr(self, name)
            require(
                len(low_high) == 2 and 1 <= low_high[0] <= low_high[1],
                f"data.task.{name}={low_high}: give [low, high] with 1 <= low <= high",
            )
        require(self.valid_examples > 0, f"data.task.valid_examples={self.valid_examples} must be positive")
        require(
            self.curriculum >= 0,
            f"data.task.curriculum={self.curriculum}: give the length curriculum's batches, or 0 for none",
        )
        task = task_named(self.name)
        task.check_lengths(*self.train_lengths, "data.task.train_lengths")
        task.check_lengths(*self.test_lengths, "data.task.test_lengths")
        self.validate_positions(task)
        longest = task.tokens(self.train_lengths[1]) - 1
        require(
            self.seq_len == longest,
            f"data.task.seq_len={self.seq_len}: task {self.name}'s longest training example at instance "
            f"length {self.train_lengths[1]} has {longest} inputs; use {longest}",
        )

    def validate_positions(self, task: Task) -> None:
        """`positions` and `max_position`: coupled needs a task that defines its coupling, and room for the
        longest test instance (its positions reach n + 2 from the first start, 1)."""
        require(
            self.positions in POSITION_OPTIONS,
            f"data.task.positions={self.positions!r}: use one of {', '.join(POSITION_OPTIONS)}",
        )
        if self.positions == "sequential":
            return
        coupling = [name for name, other in TASKS.items() if other.coupled is not None]
        require(
            task.coupled is not None,
            f"data.task.positions=coupled: task {self.name} defines no position coupling; tasks that do: "
            f"{', '.join(coupling)}",
        )
        least = self.test_lengths[1] + 2
        require(
            self.max_position is not None and self.max_position >= least,
            f"data.task.max_position={self.max_position}: coupled positions of the longest test instance "
            f"(n = {self.test_lengths[1]}) reach {least}; use an integer >= {least}",
        )

    @property
    def test_positions(self) -> int:
        """Positions a test example needs: its tokens (the model reads every one but the EOS it writes)."""
        return task_named(self.name).tokens(self.test_lengths[1])


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
    task: TaskConfig = field(default_factory=TaskConfig)  # source task only

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
        if self.source == "task":
            require(
                self.needle_rate == 0,
                f"data.needle_rate={self.needle_rate} with data.source=task: passkeys are text; use 0",
            )
            self.task.validate()
