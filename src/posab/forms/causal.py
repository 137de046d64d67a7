"""The form `none`: causal attention only (NoPE, and the rotary and absolute encodings, whose work is in
`embed` and `rotate`)."""

from __future__ import annotations

import torch
from torch import Tensor

from posab.forms.accelerated import flex, sdpa
from posab.forms.base import Form, block_causal, logits
from posab.forms.kernels import BiasedAttention


class Causal(Form):
    """softmax(q k^T / sqrt(D) + causal) V."""

    def on_cpu(self, q: Tensor, k: Tensor, v: Tensor, dropout: float, backend: str) -> Tensor:
        if dropout == 0.0 and backend == "flex" and not torch.is_grad_enabled():
            return flex(q, k, v, None)
        if dropout == 0.0 and torch.is_grad_enabled():
            return BiasedAttention.apply(q, k, v)  # faster than SDPA's flash backward (forms.kernels)
        return sdpa(q, k, v, None, dropout)

    def accelerated(self, q: Tensor, k: Tensor, v: Tensor, dropout: float) -> Tensor:
        return sdpa(q, k, v, None, dropout)

    def scores(self, q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
        scores = logits(q, k, start, end)  # (B, H, c', stop)
        return scores + block_causal(q.shape[-2], k.shape[-2], q.device)[start:end, : scores.shape[-1]]
