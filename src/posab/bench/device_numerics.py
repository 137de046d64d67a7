"""What `posab check-device` computes: one encoding's model and batch, its logits and loss gradient on a
device in a precision, and their scale-relative error against the CPU in float64.

The weights are drawn once, on the CPU in float32, from a fixed seed; the float64 reference and the
device's copy are both deep copies of that model (`.double()`, `.to(device)`), so the two differ only in
where and in which precision they compute. Logits are taken in evaluation mode without gradients (as the
evaluation takes them), the gradient in training mode (as training takes it).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from posab.build import build_model
from posab.config import Config
from posab.data.tokenizer import VOCAB_SIZE
from posab.device import autocast
from posab.model import DecoderLM

CPU = torch.device("cpu")
# the marks that open a sentence and a paragraph, as tests/test_encodings.py draws them: frequent enough
# that even a 16-token window has several sentences, so every level of the hierarchical bias is exercised
SENTENCE_RATE, PARAGRAPH_RATE = 0.15, 0.04


@dataclass(frozen=True)
class Inputs:
    """One batch: token ids with their sentence and paragraph indices, (B, T) long each."""

    tokens: Tensor
    sentence: Tensor
    paragraph: Tensor

    @property
    def tokens_count(self) -> int:
        return self.tokens.numel()

    def to(self, device: torch.device) -> Inputs:
        return Inputs(self.tokens.to(device), self.sentence.to(device), self.paragraph.to(device))


@dataclass(frozen=True)
class Outputs:
    """What is compared: logits at each length (length -> (B, T, V)) and the flattened loss gradient."""

    logits: dict[int, Tensor]
    gradient: Tensor


def structured_batch(batch: int, length: int, seed: int) -> Inputs:
    """Seeded random tokens with indices that grow like real text's: each a cumulative sum of Bernoulli marks
    (a new sentence with probability SENTENCE_RATE per token, a new paragraph with PARAGRAPH_RATE)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB_SIZE, (batch, length), generator=generator)
    sentence = torch.cumsum(torch.rand(batch, length, generator=generator) < SENTENCE_RATE, dim=1)
    paragraph = torch.cumsum(torch.rand(batch, length, generator=generator) < PARAGRAPH_RATE, dim=1)
    return Inputs(tokens, sentence, paragraph)


def seeded_model(cfg: Config, seed: int) -> DecoderLM:
    """The run's model for `cfg`, initialised from `seed` on the CPU in float32."""
    torch.manual_seed(seed)
    return build_model(cfg, VOCAB_SIZE)


def reference_copy(model: DecoderLM) -> DecoderLM:
    """The float64 CPU copy of `model`: the reference every device result is compared with."""
    return copy.deepcopy(model).double()


def device_copy(model: DecoderLM, device: torch.device) -> DecoderLM:
    """The device's copy of `model`, in float32 (autocast chooses the precision of each operation)."""
    return copy.deepcopy(model).to(device)


def next_token_loss(logits: Tensor, tokens: Tensor) -> Tensor:
    """Mean cross-entropy of logits (B, T, V) at positions 0..T-2 against the tokens at 1..T-1, in float32
    or better (bf16 logits are promoted, as autocast does for the loss)."""
    vocab = logits.shape[-1]
    scores = logits[:, :-1].reshape(-1, vocab)  # (B, T-1, V) -> (B (T-1), V)
    if scores.dtype in (torch.float16, torch.bfloat16):
        scores = scores.float()
    return F.cross_entropy(scores, tokens[:, 1:].reshape(-1))  # targets (B, T-1) -> (B (T-1),)


def logits_at(model: DecoderLM, inputs: Inputs, device: torch.device, dtype: torch.dtype | None) -> Tensor:
    """Evaluation-mode logits (B, T, V) of `inputs` on `device` under autocast `dtype`, as float64 on the
    CPU."""
    batch = inputs.to(device)
    model.eval()
    with torch.no_grad(), autocast(device, dtype):
        logits = model(batch.tokens, batch.sentence, batch.paragraph)
    return logits.to(CPU, torch.float64)


def loss_gradient(
    model: DecoderLM, inputs: Inputs, device: torch.device, dtype: torch.dtype | None
) -> Tensor:
    """The training-mode gradient of the next-token loss on `inputs` with respect to every parameter, in
    `model.parameters()` order, flattened into one float64 CPU vector (a parameter the loss does not reach
    contributes zeros)."""
    batch = inputs.to(device)
    model.train()
    model.zero_grad(set_to_none=True)
    with autocast(device, dtype):
        logits = model(batch.tokens, batch.sentence, batch.paragraph)  # (B, T, V)
    next_token_loss(logits, batch.tokens).backward()
    parts = [
        (torch.zeros_like(p) if p.grad is None else p.grad).reshape(-1)  # any shape -> (numel,)
        for p in model.parameters()
    ]
    model.zero_grad(set_to_none=True)
    return torch.cat(parts).to(CPU, torch.float64)


def outputs(
    model: DecoderLM,
    batches: dict[int, Inputs],
    train_len: int,
    device: torch.device,
    dtype: torch.dtype | None,
) -> Outputs:
    """Logits at every length of `batches` and the loss gradient at the training length `train_len`."""
    logits = {length: logits_at(model, inputs, device, dtype) for length, inputs in batches.items()}
    return Outputs(logits, loss_gradient(model, batches[train_len], device, dtype))


def scale_error(actual: Tensor, reference: Tensor) -> float:
    """max |actual - reference| / max |reference|, both float64: the error relative to the scale of the
    reference, which holds on every machine (an elementwise relative error blows up where an entry cancels
    to about 0). inf when `actual` has a non-finite entry; 0/0 (an all-zero reference matched) is 0."""
    if not bool(torch.isfinite(actual).all()):
        return float("inf")
    error, scale = float((actual - reference).abs().max()), float(reference.abs().max())
    if scale == 0.0:
        return 0.0 if error == 0.0 else float("inf")
    return error / scale


def finite(result: Outputs) -> bool:
    """Every logit and every gradient entry is finite."""
    tensors = [*result.logits.values(), result.gradient]
    return all(bool(torch.isfinite(t).all()) for t in tensors)
