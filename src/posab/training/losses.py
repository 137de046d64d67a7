"""The language-model loss: per target token, per batch, and over fixed validation windows (under torchrun
summed across ranks). Shared by the training loop and the passkey stage."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from posab.data import Batch, TokenStream
from posab.device import autocast
from posab.distributed import sum_across_ranks, world


def token_losses(model: nn.Module, batch: Batch) -> torch.Tensor:
    """The cross-entropy of every target token, in float32: (B, T)."""
    where = {} if batch.positions is None else {"positions": batch.positions}  # a task's coupled positions
    logits = model(batch.inputs, batch.sentence, batch.paragraph, **where)  # (B, T, V)
    losses = F.cross_entropy(logits.float().flatten(0, 1), batch.targets.flatten(), reduction="none")
    return losses.view_as(batch.targets)  # (B*T,) -> (B, T)


def scored_loss(losses: torch.Tensor, batch: Batch, reduction: str = "mean") -> torch.Tensor:
    """The mean (or sum) of the token losses (B, T) over the targets the batch scores (`Batch.loss_mask`:
    a task's answers; every target of text)."""
    scored = losses if batch.loss_mask is None else losses[batch.loss_mask]  # (B, T) or (scored,)
    return scored.mean() if reduction == "mean" else scored.sum()


def lm_loss(model: nn.Module, batch: Batch, reduction: str = "mean") -> torch.Tensor:
    return scored_loss(token_losses(model, batch), batch, reduction)


def batches(stream: TokenStream, starts: np.ndarray, length: int, batch_size: int) -> Iterator[Batch]:
    for i in range(0, len(starts), batch_size):
        yield stream.batch(starts[i : i + batch_size], length)


@torch.inference_mode()
def validation_loss(
    model: nn.Module,
    stream: TokenStream,
    starts: np.ndarray,
    length: int,
    batch_size: int,
    device: torch.device,
    dtype: torch.dtype | None,
) -> float:
    """Mean per-token loss over fixed windows; under torchrun each rank scores its share of the windows
    and the summed losses and token counts are reduced (no window counted twice)."""
    was_training = model.training
    model.eval()
    w = world()
    total, count = 0.0, 0
    with autocast(device, dtype):
        for batch in batches(stream, starts[w.rank :: w.size], length, batch_size):
            batch = batch.to(device)
            total += float(lm_loss(model, batch, reduction="sum"))
            count += batch.scored_tokens
    model.train(was_training)
    total, count = sum_across_ranks(total, count)
    return total / count
