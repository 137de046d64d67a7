"""The decoder's optional layers, each a `model.*` option that applies with any encoding (issue 59):

- `ScalableSoftmax` (`model.ssmax`): the queries times s_h ln n before attention;
- `Canon` (`model.canon`): a residual causal depthwise convolution at the places of a block the option
  names, keeping its last inputs in the layer's decoding state.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posab.cache import LayerCache
from posab.errors import require

CANON_PLACES = "ABCD"  # before attention, on q/k/v, before the MLP, inside the MLP (Allen-Zhu, 2025)


class ScalableSoftmax(nn.Module):
    """SSMax (Nakanishi, 2025, "Scalable-Softmax Is Superior for Attention", arXiv 2501.19399, eq. 2):
    softmax((s_h ln n) z) over the n keys a query sees, z its logits and s_h learned per head and layer,
    applied as the paper implements it, by multiplying the queries by s_h ln n (so the content logits q . k
    scale; an encoding's additive bias does not). n is the query row's own position plus one under causal
    attention, at most `window` with a sliding window: a cached decoding step computes what the full
    forward pass does. s_h starts at 1 / ln(L_train), so the logits of the training length's last query are
    softmax's (posab's choice: the paper gives no initial value); it is the trained counterpart of SWAN's
    evaluation-time log scaling (`encoding.nope_logit_scaling=swan`)."""

    def __init__(self, n_heads: int, train_len: int, window: int | None) -> None:
        super().__init__()
        require(train_len >= 2, f"model.ssmax=true at train.seq_len={train_len}: ln n needs a length >= 2")
        self.scale = nn.Parameter(torch.full((n_heads,), 1.0 / math.log(train_len)))  # (H,)
        self.window = window

    def forward(self, q: Tensor, keys: int) -> Tensor:
        """q (B, H, c, D), the last c of `keys` positions -> q (B, H, c, D) times s_h ln n."""
        seen = torch.arange(keys - q.shape[-2] + 1, keys + 1, device=q.device, dtype=torch.float32)  # (c,)
        if self.window is not None:
            seen = seen.clamp(max=self.window)
        factor = self.scale[:, None] * seen.log()[None, :]  # (H, c)
        return q * factor[:, :, None].to(q.dtype)  # (H, c) -> (H, c, 1), broadcast over B and D


class Canon(nn.Module):
    """A Canon layer (Allen-Zhu, 2025, "Physics of Language Models: Part 4.1, Architecture Design and the
    Magic of Canon Layers", NeurIPS; reference `facebookresearch/PhysicsLM4`, `canon_helper.py`):
    h_t + sum_{k=0..K-1} w_k * h_{t-K+1+k}, a depthwise causal convolution over the last K tokens (K = 4,
    the reference's default), with the residual, no bias and no activation (the reference's recommended
    settings). Its weight is nn.Conv1d's depthwise one, (C, 1, K), at nn.Conv1d's initialisation (uniform in
    +-1/sqrt(K)), as the reference leaves it. A sequence starts from zeros; in cached decoding the layer's
    `LayerCache.recent` keeps its last K - 1 inputs under `place`, so a step computes what the full
    forward pass does."""

    def __init__(self, channels: int, place: str, kernel: int = 4) -> None:
        super().__init__()
        self.place, self.kernel = place, kernel
        bound = 1.0 / math.sqrt(kernel)  # nn.Conv1d's default: kaiming_uniform(a=sqrt(5)), fan_in = K
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel).uniform_(-bound, bound))  # (C, 1, K)

    def forward(self, x: Tensor, cache: LayerCache | None = None) -> Tensor:
        """x (B, T, C), the tokens after the cached ones -> x plus its causal convolution: (B, T, C)."""
        past = None if cache is None else cache.recent.get(self.place)
        if past is None:
            past = x.new_zeros(x.shape[0], self.kernel - 1, x.shape[2])  # (B, K - 1, C)
        window = torch.cat([past.to(x.dtype), x], dim=1)  # (B, K - 1 + T, C)
        if cache is not None:
            cache.recent[self.place] = window[:, window.shape[1] - (self.kernel - 1) :]
        length, weight = x.shape[1], self.weight[:, 0].to(x.dtype)  # (C, K)
        mixed = sum(window[:, k : k + length] * weight[:, k] for k in range(self.kernel))  # (B, T, C)
        return x + mixed


def canon_at(place: str, places: str, channels: int, kernel: int) -> Canon | None:
    """A Canon layer at `place` when the option's `places` name it, else None."""
    return Canon(channels, place, kernel) if place in places else None
