"""The form `none`: causal attention only (NoPE, and the rotary and absolute encodings, whose work is in
`embed` and `rotate`), or with a `window`, sliding-window attention (each query sees itself and the
window - 1 keys before it; the hybrids' local layers, `model.window`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from posab.forms.accelerated import flex, flex_runs_on, sdpa
from posab.forms.base import Form, block_causal, logits
from posab.forms.kernels import biased_attention


@dataclass(eq=False)
class Causal(Form):
    """softmax(q k^T / sqrt(D) + causal) V; with a `window`, the band mask instead of the causal one."""

    window: int | None = None

    def band(self, q: Tensor, k: Tensor) -> Tensor | None:
        """The window's (1, 1, c, n) mask, or None without a window (the fused causal kernels)."""
        if self.window is None:
            return None
        return block_causal(q.shape[-2], k.shape[-2], q.device, self.window).to(q.dtype)[None, None]

    def on_cpu(self, q: Tensor, k: Tensor, v: Tensor, dropout: float, backend: str) -> Tensor:
        if dropout == 0.0 and backend == "flex" and not torch.is_grad_enabled():
            return flex(q, k, v, None, window=self.window)
        # the chunked core: faster than SDPA's flash backward in training, and where q is wider than v
        # (PoPE) SDPA's fallback would hold every (L, L) score
        if dropout == 0.0 and (torch.is_grad_enabled() or q.shape[-1] != v.shape[-1]):
            return biased_attention(q, k, v, self.band(q, k))
        return sdpa(q, k, v, self.band(q, k), dropout)

    def accelerated(self, q: Tensor, k: Tensor, v: Tensor, dropout: float) -> Tensor:
        if self.window is None or dropout or not flex_runs_on(q.device):
            return sdpa(q, k, v, self.band(q, k), dropout)
        return flex(q, k, v, None, window=self.window)

    def scores(self, q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
        scores = logits(q, k, start, end)  # (B, H, c', stop)
        mask = block_causal(q.shape[-2], k.shape[-2], q.device, self.window)
        return scores + mask[start:end, : scores.shape[-1]]
