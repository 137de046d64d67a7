"""The one optimizer of every training, the language model's (`train.*`) and the passkey stage's
(`passkey.*`): AdamW over the same parameter groups, each training giving its own base learning rate,
weight decay and betas; after every step a DecoderLM's encoding puts its parameters back into their valid set
(`Encoding.constrain`). `optimizer_step` is the step both take: clipping, the optimizer, the schedule."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from posab.encodings import EncodingOptimizer
from posab.model import DecoderLM


def param_groups(
    model: nn.Module, enc: EncodingOptimizer, *, lr: float, weight_decay: float
) -> list[dict[str, Any]]:
    """AdamW groups at base learning rate `lr`: the model's matrices (decayed by `weight_decay`), its other
    parameters (norms: not decayed), and the encoding's parameters at lr `lr * enc.lr_mult`, decayed by
    `enc.weight_decay`. A model other than a DecoderLM (the benchmark's peer) has no encoding group. Empty
    groups are left out."""
    encoding = model.encoding if isinstance(model, DecoderLM) else None
    coded_ids = {id(p) for p in encoding.parameters()} if encoding is not None else set()
    params = [p for p in model.parameters() if p.requires_grad]
    own = [p for p in params if id(p) not in coded_ids]
    coded = [p for p in params if id(p) in coded_ids]
    groups = [
        {"params": [p for p in own if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in own if p.dim() < 2], "weight_decay": 0.0},
        {"params": coded, "weight_decay": enc.weight_decay, "lr": lr * enc.lr_mult},
    ]
    return [g for g in groups if g["params"]]


def build_optimizer(
    model: nn.Module,
    enc: EncodingOptimizer | None = None,
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
) -> torch.optim.AdamW:
    """AdamW over `param_groups` (`enc`: the encoding's settings, default lr_mult 1 and no decay); after
    every step a DecoderLM's encoding puts its parameters back into their valid set (`Encoding.constrain`).
    A schedule (LambdaLR) multiplies each group's own initial lr, so the encoding's group keeps its lr_mult
    throughout."""
    groups = param_groups(model, enc or EncodingOptimizer(), lr=lr, weight_decay=weight_decay)
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=betas)
    if isinstance(model, DecoderLM):
        encoding = model.encoding
        optimizer.register_step_post_hook(lambda *_: encoding.constrain())
    return optimizer


def optimizer_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LRScheduler, grad_clip: float
) -> float:
    """Clip the gradients' global norm at `grad_clip`, step the optimizer (then the encoding constrains its
    parameters: `build_optimizer`'s hook) and the schedule; returns the norm before clipping."""
    grad_norm = float(nn.utils.clip_grad_norm_(model.parameters(), grad_clip))
    optimizer.step()
    scheduler.step()
    return grad_norm
