"""What every attention form shares: the block convention, the scores' dtype and the causal mask.

A form is how position enters one layer's attention in one forward pass. Its queries are the last c of
its n keys (c = n in a forward pass over a window; c < n in a cached decoding step, where the keys are the
cache plus the new tokens), so query row r sits at key position n - c + r and sees keys 0 .. n - c + r.
Each form provides
- `reference`: all pairs, explicit softmax, in the inputs' dtype promoted to float32 (float64 inputs stay
  float64: the definition its tests compare against);
- `on_cpu`: the fast CPU path (fused kernels, chunked backward passes);
- `accelerated`: the path on any other device (FlexAttention or SDPA);
- `scores`: the scores of a block of query rows against the keys they see, which chunked evaluation, the
  attention analysis and cached decoding read.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from torch import Tensor

QUERY_CHUNK = 64  # query rows per chunk: the additive and FoX kernels' (and explicit softmaxes'), by the
# chunked core's rule, measured in bench section 7 (`posab.bench.chunks`; results/bench/chunks: 1.000x and
# 1.035x the fastest)


def compute_dtype(q: Tensor) -> torch.dtype:
    """The scores' dtype: float32, or float64 for float64 inputs (the exactness tests)."""
    return torch.promote_types(q.dtype, torch.float32)


def without_autocast(device: torch.device) -> contextlib.AbstractContextManager[None]:
    """Autocast off on `device` (nothing to turn off on a device autocast does not know, such as meta)."""
    if torch.amp.is_autocast_available(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def causal_mask(length: int, device: torch.device) -> Tensor:
    """(L, L) float: 0 on and below the diagonal, -inf above."""
    return torch.full((length, length), float("-inf"), device=device).triu(1)


def block_causal(queries: int, keys: int, device: torch.device, window: int | None = None) -> Tensor:
    """(c, n) float: 0 where key j <= n - c + r (query row r's own position), -inf after it; for c = n the
    causal mask itself. With a `window` W, also -inf at keys j <= n - c + r - W (sliding-window attention:
    each query sees itself and the W - 1 keys before it)."""
    offset = keys - queries
    mask = torch.full((queries, keys), float("-inf"), device=device).triu(offset + 1)
    if window is None:
        return mask
    return mask + torch.full((queries, keys), float("-inf"), device=device).tril(offset - window)


def key_offset(q: Tensor, k: Tensor) -> int:
    """n - c: the key position of query row 0."""
    return k.shape[-2] - q.shape[-2]


def logits(q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
    """q k^T / sqrt(D) of query rows start:end over the keys they see, 0 .. n - c + end - 1, in the scores'
    dtype (the matmul in q's): (B, H, end - start, n - c + end)."""
    stop = key_offset(q, k) + end
    scores = torch.matmul(q[:, :, start:end], k[:, :, :stop].transpose(-1, -2)).to(compute_dtype(q))
    return scores / math.sqrt(q.shape[-1])  # (B, H, c', stop)


class Form:
    """How position enters one layer's attention in one forward pass (module docstring)."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, dropout: float = 0.0, backend: str = "sdpa") -> Tensor:
        """q: (B, H, c, D), k, v: (B, H, n, D) -> (B, H, c, D). `backend` `flex`: FlexAttention where the form
        has it, in evaluation on the CPU too."""
        if q.shape[-2] != k.shape[-2]:
            return self.block(q, k, v)
        if q.device.type == "cpu":
            return self.on_cpu(q, k, v, dropout, backend)
        return self.accelerated(q, k, v, dropout)

    def on_cpu(self, q: Tensor, k: Tensor, v: Tensor, dropout: float, backend: str) -> Tensor:
        raise NotImplementedError

    def accelerated(self, q: Tensor, k: Tensor, v: Tensor, dropout: float) -> Tensor:
        raise NotImplementedError

    def scores(self, q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
        """Scores of query rows start:end over keys 0 .. n - c + end - 1, -inf at keys after each query, in
        the scores' dtype: (B, H, end - start, n - c + end)."""
        raise NotImplementedError

    def probabilities(self, q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
        """softmax of `scores` over the keys: (B, H, end - start, n - c + end)."""
        return torch.softmax(self.scores(q, k, start, end), dim=-1)

    def reference(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """All pairs, explicit softmax in the scores' dtype: (B, H, c, D) in that dtype."""
        weights = self.probabilities(q, k, 0, q.shape[-2])  # (B, H, c, n)
        return torch.matmul(weights, v.to(weights.dtype))

    def block(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Queries against a longer prefix of keys (cached decoding), by query chunks: (B, H, c, D)."""
        out = q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=v.dtype, device=v.device)  # (B, H, c, Dv)
        for start in range(0, q.shape[-2], QUERY_CHUNK):
            end = min(q.shape[-2], start + QUERY_CHUNK)
            weights = self.probabilities(q, k, start, end)  # (B, H, c', n - c + end)
            out[:, :, start:end] = torch.matmul(weights.to(v.dtype), v[:, :, : key_offset(q, k) + end])
        return out

    def dense_bias(self) -> Tensor | None:
        """The additive bias this form adds to the logits, without the causal mask: (1|B, H, c, n) in
        float32, or None. For checking and analysis; the fast paths never form it unless they must."""
        return None

    def content_statistics(
        self, q: Tensor, k: Tensor, trained: dict[str, Tensor] | None = None
    ) -> dict[str, Tensor]:
        """Statistics of a position that depends on the content (a forget gate's decay, CoPE's position
        counts), for the extrapolation audit: name -> (H,) per head, from the layer's q (B, H, c, D) and
        k (B, H, n, D) over a window. `trained`: the same layer's statistics at the training length, for
        those read against what training reached. None to report by default (a position fixed by i - j)."""
        return {}


@dataclass(eq=False)
class PerLayer(Form):
    """Forms that differ between layers (a hybrid's global and windowed layers), built once per pass;
    `Encoding.layer_form` picks each layer's. Not a form to attend with itself."""

    forms: tuple[Form, ...]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, dropout: float = 0.0, backend: str = "sdpa") -> Tensor:
        raise TypeError("PerLayer holds one form per kind of layer: attend with `Encoding.layer_form`'s")


@dataclass
class AttentionInputs:
    """What one attention layer computes its probabilities from (see `DecoderLM.forward(observe=...)`)."""

    q: Tensor  # (B, H, c, D), rotated by the encoding
    k: Tensor  # (B, H, n, D), rotated by the encoding
    form: Form  # the layer's attention form

    def probabilities(self, start: int = 0, end: int | None = None) -> Tensor:
        """The layer's attention probabilities of query rows start:end over the keys they see, in float32
        from float32 q and k: (B, H, end - start, n - c + end)."""
        end = self.q.shape[-2] if end is None else end
        return self.form.probabilities(self.q.float(), self.k.float(), start, end)
