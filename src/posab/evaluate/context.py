"""What every evaluator receives: the model, the validation split, the shared settings, one forward pass."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from posab.data import TokenStream
from posab.data.tokenizer import Tokenizer, byte_lengths
from posab.device import autocast
from posab.distributed import progress_bar
from posab.errors import require
from posab.keys import NAME
from posab.model import DecoderLM, Observer

SPLITS = ("valid", "test")
EVAL_FORMATS = ("text", "wikitext")  # as posab.data.corpora reads them
RESERVED_NAMES = ("windows", "curve")  # runs.csv's own column prefixes (`windows:loss/512`)
T = TypeVar("T")


@dataclass
class EvalCorpus:
    """A further evaluation corpus (`eval.corpora`): scored by the evaluators that read only text
    (`Evaluator.per_corpus`: perplexity) like the run's own `eval.split`, under keys `NAME:...`."""

    name: str  # e.g. wikitext2: the prefix of its keys (`wikitext2:ppl/512`)
    path: str  # a folder, file or glob, relative to the directory train.py is started from
    format: str = "text"  # text: one document per file | wikitext: WikiText articles (` = Title = ` lines)
    # None: the perplexity windows spread evenly over the concatenated documents (a window may span two);
    # k: k windows inside each document at fixed places (`TokenStream.document_windows`), so that each
    # document is its own unit of resampling (pg-books-test: 34 books, issue 56)
    windows_per_document: int | None = None

    def validate(self, where: str) -> None:
        require(
            bool(NAME.fullmatch(self.name)) and self.name not in RESERVED_NAMES,
            f"{where}.name={self.name!r}: use letters, digits, _ and -, starting with a letter, other than "
            f"{' and '.join(RESERVED_NAMES)}",
        )
        formats = " or ".join(EVAL_FORMATS)
        require(self.format in EVAL_FORMATS, f"{where}.format={self.format!r}: use {formats}")
        per = self.windows_per_document
        require(per is None or per > 0, f"{where}.windows_per_document={per}: use a positive count, or null")


@dataclass
class EvalSettings:
    """The `eval` settings every evaluator may read; each evaluator's own section is added beside them
    (`posab.evaluate.EvalConfig`)."""

    lengths: list[int] = field(default_factory=lambda: [512, 1024, 2048, 4096])
    split: str = "valid"  # the text scored: valid (tuning, selection) | test (a study's final numbers)
    batch_tokens: int = 16384  # batch size per length = max(1, batch_tokens // length)
    progress: bool = True  # tqdm bars on stderr (rank 0 only): per length / cell / shift, and inner ones
    corpora: list[EvalCorpus] = field(default_factory=list)  # further corpora scored like `split`

    def validate_settings(self) -> None:
        require(self.split in SPLITS, f"eval.split={self.split!r}: use one of {', '.join(SPLITS)}")
        require(self.batch_tokens > 0, f"eval.batch_tokens={self.batch_tokens} must be positive")
        bad = [n for n in self.lengths if n < 1]
        require(not bad, f"eval.lengths={self.lengths}: every length must be >= 1 (bad: {bad})")
        names = [corpus.name for corpus in self.corpora]
        twice = sorted({n for n in names if names.count(n) > 1})
        require(not twice, f"eval.corpora: each name once; {twice} given more than once")
        for i, corpus in enumerate(self.corpora):
            corpus.validate(f"eval.corpora[{i}]")


@dataclass
class EvalContext:
    model: DecoderLM
    tokenizer: Tokenizer
    valid: TokenStream  # the evaluated split, `eval.split` (the validation split by default)
    device: torch.device
    dtype: torch.dtype | None  # autocast dtype, None for fp32
    train_len: int
    cfg: EvalSettings  # the whole `eval` config (an `EvalConfig`)
    title: str = ""  # names the run on figures (the encoding)
    corpora: dict[str, TokenStream] = field(default_factory=dict)  # `eval.corpora`'s streams, by name

    @cached_property
    def token_bytes(self) -> np.ndarray:
        """(V,) the text bytes each token id stands for (0 for the anchors), computed once."""
        return byte_lengths(self.tokenizer)

    def bar(self, items: Iterable[T], desc: str, inner: bool = False, **options: Any) -> tqdm[T]:
        """A progress bar over `items` when `eval.progress` is on, on rank 0 only; an `inner` bar (the
        forward passes within one length or cell) is cleared when done."""
        return progress_bar(items, desc, self.cfg.progress, leave=not inner, **options)

    def batch_size(self, length: int) -> int:
        """Sequences per forward pass at `length`, so that memory stays bounded at long lengths."""
        return max(1, self.cfg.batch_tokens // length)

    @torch.inference_mode()
    def logits(
        self,
        inputs: Tensor,
        sentence: Tensor | None,
        paragraph: Tensor | None,
        offset: int = 0,
        observe: Observer | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """(B, T) inputs -> (B, T, V) float32 logits, on the model's device, in inference mode.

        `observe` receives each layer's attention inputs; `positions` (T,), the inputs' positions instead
        of `offset` (`DecoderLM.forward`)."""
        self.model.eval()
        to = self.device
        sentence = sentence.to(to) if sentence is not None else None
        paragraph = paragraph.to(to) if paragraph is not None else None
        with autocast(self.device, self.dtype):
            where = {"offset": offset} if positions is None else {"positions": positions}
            out = self.model(inputs.to(to), sentence, paragraph, observe=observe, **where)
        return out.float()
