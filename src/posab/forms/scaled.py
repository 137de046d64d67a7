"""The form `multiplicative` (the design note's form (2)): softmax(q k^T / sqrt(D) * g + b + causal) V with
g (1, H, c, n) multiplying the logits before the additive bias b. No fused kernel multiplies the logits, so
every path takes the explicit softmax, in float32."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor

from posab.forms.additive import Additive
from posab.forms.base import Form, block_causal, logits


@dataclass(eq=False)
class Scaled(Form):
    scale: Tensor  # (1|B, H, c, n) the factor g on the logits
    shared: Additive | None  # the additive bias b, or None

    def on_cpu(self, q: Tensor, k: Tensor, v: Tensor, dropout: float, backend: str) -> Tensor:
        return self.accelerated(q, k, v, dropout)

    def accelerated(self, q: Tensor, k: Tensor, v: Tensor, dropout: float) -> Tensor:
        weights = self.probabilities(q, k, 0, q.shape[-2])  # (B, H, T, T)
        weights = F.dropout(weights, dropout) if dropout else weights
        return weights.to(v.dtype) @ v

    def dense_bias(self) -> Tensor | None:
        return None if self.shared is None else self.shared.dense_bias()

    def scores(self, q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
        scores = logits(q, k, start, end)  # (B, H, c', stop)
        stop = scores.shape[-1]
        scores = scores * self.scale[..., start:end, :stop]  # (1|B, H, c', stop)
        if self.shared is None:
            return scores + block_causal(q.shape[-2], k.shape[-2], q.device)[start:end, :stop]
        return scores + self.shared.mask[..., start:end, :stop]
