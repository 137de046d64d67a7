"""What every evaluator receives, and the forward pass they share."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from torch import Tensor

from posab.config import EvalConfig
from posab.data import TokenStream
from posab.data.tokenizer import Tokenizer, byte_lengths
from posab.model import DecoderLM
from posab.train import autocast


@dataclass
class EvalContext:
    model: DecoderLM
    tokenizer: Tokenizer
    valid: TokenStream
    device: torch.device
    dtype: torch.dtype | None  # autocast dtype, None for fp32
    train_len: int
    cfg: EvalConfig

    @cached_property
    def token_bytes(self) -> np.ndarray:
        """(V,) the text bytes each token id stands for (0 for the anchors), computed once."""
        return byte_lengths(self.tokenizer)

    def batch_size(self, length: int) -> int:
        """Sequences per forward pass at `length`, so that memory stays bounded at long lengths."""
        return max(1, self.cfg.batch_tokens // length)

    @torch.inference_mode()
    def logits(
        self, inputs: Tensor, sentence: Tensor | None, paragraph: Tensor | None, offset: int = 0
    ) -> Tensor:
        """(B, T) inputs -> (B, T, V) float32 logits, on the model's device, in inference mode."""
        self.model.eval()
        to = self.device
        sentence = sentence.to(to) if sentence is not None else None
        paragraph = paragraph.to(to) if paragraph is not None else None
        with autocast(self.device, self.dtype):
            out = self.model(inputs.to(to), sentence, paragraph, offset=offset)
        return out.float()
