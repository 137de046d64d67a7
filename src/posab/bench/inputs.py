"""Seeded synthetic inputs and the models measured: random tokens with the sentence and paragraph
structure of the synthetic corpus, as a token stream (what the Trainer's sampler draws from) or a batch."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from posab.build import build_model
from posab.config import Config
from posab.data import Batch, TokenStream
from posab.data.tokenizer import VOCAB_SIZE
from posab.model import DecoderLM

SENTENCE_TOKENS, PARAGRAPH_TOKENS = 60, 600  # mean sentence and paragraph lengths of the synthetic text


def document_structure(batch: int, length: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Sentence and paragraph indices (B, L): a sentence every ~60 tokens, a paragraph every ~600."""
    new_sentence = torch.rand(batch, length, generator=generator) < 1 / SENTENCE_TOKENS
    opens_paragraph = torch.rand(batch, length, generator=generator) < SENTENCE_TOKENS / PARAGRAPH_TOKENS
    return new_sentence.cumsum(1), (new_sentence & opens_paragraph).cumsum(1)


def synthetic_stream(size: int) -> TokenStream:
    """`size` random tokens with sentence and paragraph indices (seeded), as one split."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB_SIZE, (size,), generator=generator)
    sentence, paragraph = document_structure(1, size, generator)  # (1, size) each
    return TokenStream(tokens.numpy(), sentence[0].numpy(), paragraph[0].numpy(), split="bench")


def synthetic_batch(batch: int, length: int) -> Batch:
    """`batch` consecutive windows of `length` tokens of a synthetic stream: (B, L)."""
    stream = synthetic_stream(batch * (length + 1))
    return stream.batch(np.arange(batch) * (length + 1), length)


def posab_model(cfg: Config) -> DecoderLM:
    """The run's model for `cfg`, initialised from seed 0."""
    torch.manual_seed(0)
    return build_model(cfg, VOCAB_SIZE)
