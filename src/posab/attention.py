"""The one attention function, on `scaled_dot_product_attention`.

- Evaluation, and training off the CPU: SDPA, with `is_causal` when there is no bias (the fused flash
  kernel), else with one additive float mask holding the causal mask and the bias (the flash kernel
  accepts a mask).
- Training on the CPU, with or without a mask: `BiasedAttention` below, the same flash forward and its
  own backward, measured 9-12% faster per training step than SDPA's flash backward (docs/performance.md).
- A bias that needs a gradient (the learned biases): SDPA would fall back to its unfused math kernel,
  which materialises and differentiates (B, H, L, L) tensors op by op. `BiasedAttention` instead runs the
  fused flash kernel forward with the mask as a constant (or is_causal without one), and computes
  every gradient in one pass over query chunks, recomputing the attention probabilities from the saved
  log-sum-exp (no (B, H, L, L) tensor lives longer than one chunk, and keys past the chunk are skipped by
  causality): with P = softmax(S), dP = dO V^T, D = rowsum(dO * O) and dS = P * (dP - D),
  dQ = dS K / sqrt(d), dK = dS^T Q / sqrt(d), dV = P^T dO and dMask = dS (summed over the batch when the
  mask is shared; only when the mask needs a gradient). Autograd then carries dMask into the bias (for a
  Toeplitz bias: the sum of dS along each diagonal).
- A per-sample bias of low rank (`BiasFactors` U, E: the hierarchical bias's sentence and paragraph
  levels): the whole mask, the shared mask plus U E^T, is built once per forward pass in the attention
  dtype (`full_mask`; one matmul of R channels) and the flash kernel reads it. `BiasedAttention`'s backward
  recomputes P from it and carries dS into the factors directly, dU = dS E per query chunk: the
  (B, H, L, L) gradient of the per-sample part is never formed, nor any L x L index.
- A score mixer (DAPE, form (4): S = A + B + f([A; B]) with an MLP f across heads at every pair):
  `MixedAttention` runs f over query chunks and the keys they see, forward and backward, recomputing f's
  hidden layer in the backward pass from the saved log-sum-exp; no (B, width, L, L) tensor lives longer
  than one chunk, in training or in a 4,096-token evaluation.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posab.encodings import BiasFactors

QUERY_CHUNK = 64  # measured fastest on 2 CPU cores at L=512 (64: 0.081 s, 128: 0.086 s, 256: 0.117 s)


def causal_mask(length: int, device: torch.device) -> Tensor:
    """(L, L) float: 0 on and below the diagonal, -inf above."""
    return torch.full((length, length), float("-inf"), device=device).triu(1)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    dropout: float = 0.0,
    backend: str = "sdpa",
    scale: Tensor | None = None,
    factors: BiasFactors | None = None,
    whole: Tensor | None = None,
    mixer: PairMLP | None = None,
) -> Tensor:
    """q, k, v: (B, H, T, D); mask: (1|B, H, T, T) additive, causal part included, or None -> (B, H, T, D).

    backend `flex` runs FlexAttention (compiled) where it can: on a GPU, and on the CPU without gradients
    (PyTorch has no FlexAttention backward on the CPU); everything else takes the SDPA paths. `scale`
    (1|B, H, T, T) multiplies q.k / sqrt(d) before the mask is added (form (2) of the design note): no
    fused kernel does that, so it takes an explicit softmax. `factors` add U E^T to the mask; `whole` is
    `full_mask(mask, factors, q.dtype)` when the caller already built it (once for all layers). `mixer`
    (DAPE's `ScoreMixer`) replaces the logits plus the bias by its function of both (`mixed_attention`).
    """
    if mixer is not None:
        return mixed_attention(q, k, v, mask, mixer, dropout)
    if factors is not None:
        trained = [t for t in (mask, factors.query) if t is not None and t.requires_grad]
        learned = torch.is_grad_enabled() and bool(trained)
        if learned and q.device.type == "cpu" and dropout == 0.0 and scale is None:
            whole = full_mask(mask, factors, q.dtype) if whole is None else whole
            return BiasedAttention.apply(q, k, v, mask, whole, factors.query, factors.key)
        if learned or whole is None:  # elsewhere with gradients: the whole mask through autograd
            whole = full_mask(mask, factors, q.dtype)
        mask = whole
    if scale is not None:
        return scaled_attention(q, k, v, mask, scale, dropout)
    if backend == "flex" and dropout == 0.0 and (q.device.type == "cuda" or not torch.is_grad_enabled()):
        return flex(q, k, v, mask)
    if torch.is_grad_enabled() and q.device.type == "cpu" and dropout == 0.0:
        return BiasedAttention.apply(q, k, v, mask)  # faster than SDPA's flash backward (module docstring)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)


def full_mask(mask: Tensor | None, factors: BiasFactors, dtype: torch.dtype) -> Tensor:
    """The mask (or the causal mask) plus the factors' product U E^T, in `dtype`: (B, H, T, T).

    In bf16 the product's entry (a sum of one term per level) is rounded once and the mask added to it:
    the roundings of a gathered bias summed over its levels."""
    t = factors.query.shape[-2]
    product = torch.matmul(factors.query.to(dtype), factors.key.to(dtype).transpose(-1, -2))  # (B, H, T, T)
    base = (causal_mask(t, product.device) if mask is None else mask).to(dtype)
    return product + base if product.requires_grad else product.add_(base)  # in place: one (B, H, T, T)


def attention_scores(
    q: Tensor,
    k: Tensor,
    mask: Tensor | None,
    scale: Tensor | None,
    start: int,
    end: int,
    mixer: PairMLP | None = None,
) -> Tensor:
    """Float32 scores of queries start:end over keys 0:end (later keys are masked anyway): (B, H, c, end).

    q k^T / sqrt(D), times `scale` (1|B, H, T, T) when given, plus `mask` (1|B, H, T, T) additive with its
    causal part, or the causal mask when there is none; with a `mixer`, its function of the logits and the
    bias (`mixed_scores`). The matmul runs in q's dtype."""
    if mixer is not None:
        return mixed_scores(q, k, mask, mixer, start, end)
    scores = torch.matmul(q[:, :, start:end], k[:, :, :end].transpose(-1, -2)).float()  # (B, H, c, end)
    scores = scores / math.sqrt(q.shape[-1])
    if scale is not None:
        scores = scores * scale[..., start:end, :end]  # (1|B, H, c, end)
    if mask is None:  # -inf where key j > query i = start + row
        return scores + causal_mask(end, q.device)[start:end]  # (c, end)
    return scores + mask[..., start:end, :end]  # (1|B, H, c, end)


def attention_probabilities(
    q: Tensor,
    k: Tensor,
    mask: Tensor | None,
    scale: Tensor | None,
    start: int,
    end: int,
    mixer: PairMLP | None = None,
) -> Tensor:
    """softmax of `attention_scores` over the keys: (B, H, c, end) float32."""
    return torch.softmax(attention_scores(q, k, mask, scale, start, end, mixer), dim=-1)


@dataclass
class AttentionInputs:
    """What one attention layer computes its probabilities from (see `DecoderLM.forward(observe=...)`)."""

    q: Tensor  # (B, H, T, D), rotated by the encoding
    k: Tensor  # (B, H, T, D), rotated by the encoding
    mask: Tensor | None  # (1|B, H, T, T) additive, causal part included, or None (causal only)
    scale: Tensor | None  # (1|B, H, T, T) multiplies q.k / sqrt(D) before the mask, or None
    mixer: PairMLP | None = None  # the layer's function of logits and bias (DAPE), or None

    def probabilities(self, start: int = 0, end: int | None = None) -> Tensor:
        """The layer's attention probabilities of queries start:end over keys 0:end, in float32 from float32
        q and k: (B, H, c, end)."""
        end = self.q.shape[-2] if end is None else end
        q, k = self.q.float(), self.k.float()
        return attention_probabilities(q, k, self.mask, self.scale, start, end, self.mixer)


def scaled_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: Tensor, dropout: float
) -> Tensor:
    """softmax(q k^T / sqrt(d) * scale + mask) v, in float32 for the softmax -> (B, H, T, D)."""
    weights = attention_probabilities(q, k, mask, scale, 0, q.shape[-2])  # (B, H, T, T)
    weights = F.dropout(weights, dropout) if dropout else weights
    return torch.matmul(weights.to(v.dtype), v)


@functools.cache
def compiled_flex_attention() -> Callable[..., Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """FlexAttention with the mask read inside `score_mod` (causal only when there is no mask)."""

    def causal(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return torch.where(q_idx >= kv_idx, score, float("-inf"))

    def shared(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + mask[0, h, q_idx, kv_idx]

    def per_row(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + mask[b, h, q_idx, kv_idx]

    score_mod = causal if mask is None else shared if mask.shape[0] == 1 else per_row
    return compiled_flex_attention()(q, k, v, score_mod=score_mod)


class BiasedAttention(torch.autograd.Function):
    """Flash-kernel attention with a differentiable additive mask and/or bias factors, or causal only (CPU);
    see the module docstring. `whole` is the mask the scores get (mask + U E^T, `full_mask`), or None:
    `mask` itself, or with no mask either the causal mask alone."""

    @staticmethod
    def forward(
        ctx: Any,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        whole: Tensor | None = None,
        factor_query: Tensor | None = None,
        factor_key: Tensor | None = None,
    ) -> Tensor:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        scores_mask = mask if whole is None else whole  # None: causal only
        attn_mask = None if scores_mask is None else scores_mask.to(q.dtype)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, scores_mask is None, attn_mask=attn_mask
        )  # out: (B, H, T, D), lse: (B, H, T)
        ctx.mask_shape = None if mask is None or not ctx.needs_input_grad[3] else (mask.shape, mask.dtype)
        ctx.factor_dtype = None if factor_query is None else factor_query.dtype
        ctx.save_for_backward(q, k, v, scores_mask, factor_key, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, d_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, scores_mask, factor_key, out, lse = ctx.saved_tensors
        d_out = d_out.to(q.dtype).contiguous()
        scale = 1.0 / math.sqrt(q.shape[-1])
        delta = (d_out.float() * out.float()).sum(-1, keepdim=True)  # (B, H, T, 1)
        dq = torch.empty_like(q)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        d_mask = None if ctx.mask_shape is None else torch.zeros(ctx.mask_shape[0], device=q.device)
        d_factor = None
        if factor_key is not None and ctx.needs_input_grad[5]:
            factor_key = factor_key.to(q.dtype)
            d_factor = torch.empty(*q.shape[:3], factor_key.shape[-1], device=q.device)  # (B, H, T, R)
        length = q.shape[-2]
        causal = causal_mask(length, q.device) if scores_mask is None else None  # (L, L)
        for start in range(0, length, QUERY_CHUNK):
            end = min(length, start + QUERY_CHUNK)  # queries start:end see keys 0:end
            q_c, k_c, v_c, d_out_c = q[:, :, start:end], k[:, :, :end], v[:, :, :end], d_out[:, :, start:end]
            chunk_mask = causal[start:end, :end] if causal is not None else scores_mask[..., start:end, :end]
            probs = torch.matmul(q_c, k_c.transpose(-1, -2)).float()  # (B, H, c, end)
            probs.mul_(scale).add_(chunk_mask).sub_(lse[:, :, start:end, None]).exp_()
            d_scores = torch.matmul(d_out_c, v_c.transpose(-1, -2)).float()  # dP: (B, H, c, end)
            d_scores.sub_(delta[:, :, start:end]).mul_(probs)  # dS = P * (dP - D)
            if d_mask is not None:  # keys past `end` are masked: their gradient stays 0
                shared = d_mask.shape[0] == 1
                d_mask[..., start:end, :end] = d_scores.sum(0, keepdim=True) if shared else d_scores
            probs_c, d_scores_c = probs.to(q.dtype), d_scores.to(q.dtype)
            if d_factor is not None:  # dU = dS E, in q's dtype as dq: (B, H, c, end) @ (B, 1, end, R)
                d_factor[:, :, start:end] = torch.matmul(d_scores_c, factor_key[:, :, :end])
            dv[:, :, :end] += torch.matmul(probs_c.transpose(-1, -2), d_out_c).float()
            dq[:, :, start:end] = torch.matmul(d_scores_c, k_c) * scale
            dk[:, :, :end] += torch.matmul(d_scores_c.transpose(-1, -2), q_c).float() * scale
        d_mask = None if d_mask is None else d_mask.to(ctx.mask_shape[1])
        d_factor = None if d_factor is None else d_factor.to(ctx.factor_dtype)
        return dq, dk.to(k.dtype), dv.to(v.dtype), d_mask, None, d_factor, None


class PairMLP(Protocol):
    """What `mixed_attention` reads of a score mixer (DAPE's `ScoreMixer`): f = second(leaky(first(.)))."""

    first: nn.Linear  # 2H -> width, over [logits; bias]
    second: nn.Linear  # width -> H
    slope: float  # the LeakyReLU's negative slope


MIX_CHUNK = 16  # queries per chunk of `mixed_attention`: measured fastest on 2 CPU cores at L=512, B=16
# (one layer forward and backward, f channels first: 16: 0.83 s, 32: 0.97 s; f channels last at 32: 1.40 s)


def compute_dtype(q: Tensor) -> torch.dtype:
    """The scores' dtype: float32, or float64 for float64 inputs (the exactness tests)."""
    return torch.promote_types(q.dtype, torch.float32)


def future_keys(start: int, end: int, device: torch.device) -> Tensor:
    """(c, end) bool: True where key j is after query i, for queries start:end."""
    return torch.arange(end, device=device)[None, :] > torch.arange(start, end, device=device)[:, None]


def batched(weight: Tensor, batch: int) -> Tensor:
    """A (m, n) weight as a (batch, m, n) view for `bmm` (`matmul` of 2-D by 3-D would copy the 3-D one)."""
    return weight.expand(batch, -1, -1)


@dataclass
class MixedChunk:
    """One query chunk of DAPE's scores, with what the backward pass differentiates through. f runs
    channels first over the c * n pairs of the chunk: its first layer is W1_A A + (W1_B B + b1), the
    bias's half once for the whole batch when the bias is shared, and its second layer lands in the
    scores' layout."""

    logits: Tensor  # (B, H, c * n) A = q k^T / sqrt(D)
    bias: Tensor  # (1|B, H, c * n) B, 0 at future keys (the reference's tril)
    activation: Tensor  # (B, W, c * n) g(W1 [A; B] + b1), g the LeakyReLU
    scores: Tensor  # (B, H, c, n) A + B + f([A; B]), -inf at future keys
    future: Tensor  # (c, n) bool, key after query


def mixed_chunk(
    q: Tensor, k: Tensor, mask: Tensor | None, mixer: PairMLP, start: int, end: int
) -> MixedChunk:
    """DAPE's scores of queries start:end over keys 0:end. The bias is the mask with its causal part set to
    0 (the reference's tril), the causal mask is applied after f. f runs in the scores' dtype under any
    autocast: autocast would run its bmm in bf16 in the forward pass while the backward pass, outside
    autocast, recomputes it in float32 against the forward's log-sum-exp."""
    with torch.autocast(q.device.type, enabled=False):
        dtype, (batch, heads), pairs = compute_dtype(q), q.shape[:2], (end - start) * end
        logits = torch.matmul(q[:, :, start:end], k[:, :, :end].transpose(-1, -2)).to(dtype)  # (B, H, c, n)
        logits = logits.div_(math.sqrt(q.shape[-1])).view(batch, heads, pairs)  # (B, H, c, n) -> (B, H, c*n)
        future = future_keys(start, end, q.device)  # (c, n)
        if mask is None:
            bias = logits.new_zeros(1, heads, pairs)  # (1, H, c*n)
        else:
            bias = mask[..., start:end, :end].to(dtype).masked_fill(future, 0.0)  # (1|B, H, c, n)
            bias = bias.view(-1, heads, pairs)  # (1|B, H, c, n) -> (1|B, H, c*n)
        w1, b1 = mixer.first.weight.to(dtype), mixer.first.bias.to(dtype)
        # the bias's half of f's first layer, with b1: (1|B, W, c*n)
        from_bias = torch.baddbmm(b1[None, :, None], batched(w1[:, heads:], bias.shape[0]), bias)
        hidden = torch.bmm(batched(w1[:, :heads], batch), logits).add_(from_bias)  # (B, W, c*n)
        activation = F.leaky_relu_(hidden, mixer.slope)
        w2, b2 = mixer.second.weight.to(dtype), mixer.second.bias.to(dtype)
        scores = torch.bmm(batched(w2, batch), activation)  # (B, H, c*n)
        scores = scores.add_(logits).add_(bias).add_(b2[:, None])
        scores = scores.view(batch, heads, end - start, end)  # (B, H, c*n) -> (B, H, c, n)
        return MixedChunk(logits, bias, activation, scores.masked_fill_(future, float("-inf")), future)


def mixed_scores(q: Tensor, k: Tensor, mask: Tensor | None, mixer: PairMLP, start: int, end: int) -> Tensor:
    """`mixed_chunk`'s scores alone: (B, H, c, end)."""
    return mixed_chunk(q, k, mask, mixer, start, end).scores


def mixed_forward(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, mixer: PairMLP
) -> tuple[Tensor, Tensor]:
    """softmax(A + B + f([A; B]) + causal) V by query chunks -> the output (B, H, T, D) in v's dtype and the
    log-sum-exp of every row (B, H, T) in the scores' dtype."""
    length, dtype = q.shape[-2], compute_dtype(q)
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    lse = torch.empty(q.shape[:3], dtype=dtype, device=q.device)
    for start in range(0, length, MIX_CHUNK):
        end = min(length, start + MIX_CHUNK)
        scores = mixed_scores(q, k, mask, mixer, start, end)  # (B, H, c, end)
        lse[:, :, start:end] = torch.logsumexp(scores, dim=-1)
        probs = scores.sub_(lse[:, :, start:end, None]).exp_()  # (B, H, c, end)
        out[:, :, start:end] = torch.matmul(probs.to(v.dtype), v[:, :, :end])
    return out, lse


def mixed_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, mixer: PairMLP, dropout: float = 0.0
) -> Tensor:
    """Attention with DAPE's scores (module docstring): (B, H, T, D). No attention dropout: DAPE's scores
    have no fused kernel to drop from, and the reference runs none."""
    if dropout:
        raise ValueError(f"model.dropout={dropout}: attention with a score mixer (DAPE) runs without dropout")
    weights = (mixer.first.weight, mixer.first.bias, mixer.second.weight, mixer.second.bias)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, mask, *weights)):
        return MixedAttention.apply(q, k, v, mask, *weights, mixer)
    return mixed_forward(q, k, v, mask, mixer)[0]


class MixedAttention(torch.autograd.Function):
    """`mixed_forward` with its own backward over the same query chunks: with P = softmax(S), dS = P * (dP
    - rowsum(dO * O)) as in `BiasedAttention`, then through S = A + B + W2 g(W1 [A; B] + b1) + b2:
    dW2 = dS g^T, dH = (W2^T dS) * g'(H), dW1 = dH [A; B]^T, dA = dS + W1_A^T dH (into dq, dk),
    dB = dS + W1_B^T dH (into the mask, summed over the batch when it is shared)."""

    @staticmethod
    def forward(
        ctx: Any,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        w1: Tensor,
        b1: Tensor,
        w2: Tensor,
        b2: Tensor,
        mixer: PairMLP,
    ) -> Tensor:
        out, lse = mixed_forward(q, k, v, mask, mixer)
        ctx.mixer = mixer
        ctx.save_for_backward(q, k, v, mask, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, d_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, mask, out, lse = ctx.saved_tensors
        mixer, dtype, (batch, heads) = ctx.mixer, compute_dtype(q), q.shape[:2]
        d_out = d_out.to(dtype)
        delta = (d_out * out.to(dtype)).sum(-1, keepdim=True)  # (B, H, T, 1)
        grads = MixedGrads.zeros(q, k, v, mask if ctx.needs_input_grad[3] else None, mixer, dtype)
        w1, w2 = mixer.first.weight.to(dtype), mixer.second.weight.to(dtype)
        scale = 1.0 / math.sqrt(q.shape[-1])  # the logits' scale
        for start in range(0, q.shape[-2], MIX_CHUNK):
            end = min(q.shape[-2], start + MIX_CHUNK)
            chunk = mixed_chunk(q, k, mask, mixer, start, end)
            probs = chunk.scores.sub_(lse[:, :, start:end, None]).exp_()  # P: (B, H, c, end)
            d_out_c, v_c = d_out[:, :, start:end], v[:, :, :end].to(dtype)
            grads.v[:, :, :end] += torch.matmul(probs.transpose(-1, -2), d_out_c)
            d_scores = torch.matmul(d_out_c, v_c.transpose(-1, -2))  # dP: (B, H, c, end)
            d_scores = d_scores.sub_(delta[:, :, start:end]).mul_(probs)  # dS: (B, H, c, end)
            d_scores = d_scores.view(batch, heads, -1)  # (B, H, c, end) -> (B, H, c*end)
            d_logits, d_bias = grads.add_mlp(chunk, d_scores, w1, w2, mixer.slope)
            d_logits = d_logits.mul_(scale).view_as(probs)  # dA / sqrt(D): (B, H, c*end) -> (B, H, c, end)
            grads.q[:, :, start:end] = torch.matmul(d_logits, k[:, :, :end].to(dtype))
            grads.k[:, :, :end] += torch.matmul(d_logits.transpose(-1, -2), q[:, :, start:end].to(dtype))
            if grads.mask is not None:
                d_bias = d_bias.view(-1, heads, end - start, end)  # (1|B, H, c*end) -> (1|B, H, c, end)
                grads.mask[..., start:end, :end] = d_bias.masked_fill_(chunk.future, 0)
        return grads.cast(q, k, v, mask, mixer)


@dataclass
class MixedGrads:
    """The gradients `MixedAttention.backward` accumulates, in the scores' dtype."""

    q: Tensor
    k: Tensor
    v: Tensor
    mask: Tensor | None
    w1: Tensor
    b1: Tensor
    w2: Tensor
    b2: Tensor

    @staticmethod
    def zeros(
        q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, mixer: PairMLP, dtype: torch.dtype
    ) -> MixedGrads:
        def zero(t: Tensor) -> Tensor:
            return torch.zeros(t.shape, dtype=dtype, device=q.device)

        layers = (mixer.first.weight, mixer.first.bias, mixer.second.weight, mixer.second.bias)
        return MixedGrads(zero(q), zero(k), zero(v), None if mask is None else zero(mask), *map(zero, layers))

    def add_mlp(
        self, chunk: MixedChunk, d_scores: Tensor, w1: Tensor, w2: Tensor, slope: float
    ) -> tuple[Tensor, Tensor]:
        """Accumulate f's weight gradients from dS (B, H, c*n), and return the gradients with respect to
        the logits, dA = dS + W1_A^T dH (B, H, c*n), and to the bias, dB = dS + W1_B^T dH (1|B, H, c*n),
        summed over the batch when the bias is shared."""
        batch, heads = d_scores.shape[:2]
        self.w2 += torch.bmm(d_scores, chunk.activation.transpose(1, 2)).sum(0)  # (B, H, W) -> (H, W)
        self.b2 += d_scores.sum((0, 2))
        d_activation = torch.bmm(batched(w2.t(), batch), d_scores)  # (B, W, c*n)
        # dH = dg * g'(H) from g(H) itself (its sign is H's): aten's fused LeakyReLU backward
        d_hidden = torch.ops.aten.leaky_relu_backward(d_activation, chunk.activation, slope, True)
        self.w1[:, :heads] += torch.bmm(d_hidden, chunk.logits.transpose(1, 2)).sum(0)  # (B, W, H) -> (W, H)
        d_logits = torch.baddbmm(d_scores, batched(w1[:, :heads].t(), batch), d_hidden)  # (B, H, c*n)
        if chunk.bias.shape[0] == 1:  # a shared bias: its terms summed over the batch first
            d_hidden, d_scores = d_hidden.sum(0, keepdim=True), d_scores.sum(0, keepdim=True)
        self.w1[:, heads:] += torch.bmm(d_hidden, chunk.bias.transpose(1, 2)).sum(0)  # (1|B, W, H) -> (W, H)
        self.b1 += d_hidden.sum((0, 2))
        d_bias = torch.baddbmm(d_scores, batched(w1[:, heads:].t(), d_hidden.shape[0]), d_hidden)
        return d_logits, d_bias

    def cast(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, mixer: PairMLP) -> tuple:
        """The gradients in their inputs' dtypes, in `MixedAttention.forward`'s argument order."""
        layers = (mixer.first.weight, mixer.first.bias, mixer.second.weight, mixer.second.bias)
        mixed = [g.to(t.dtype) for g, t in zip((self.w1, self.b1, self.w2, self.b2), layers, strict=True)]
        d_mask = None if self.mask is None or mask is None else self.mask.to(mask.dtype)
        return (self.q.to(q.dtype), self.k.to(k.dtype), self.v.to(v.dtype), d_mask, *mixed, None)
