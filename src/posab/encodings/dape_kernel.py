"""DAPE's attention kernel (the form "a function of the logits and the bias"): S = A + B + f([A; B]) with an
MLP f across heads at every pair (`posab.encodings.dape`). `Mixing`, on the chunked core (`forms.chunked`),
runs f over query chunks and the keys they see, forward and backward, recomputing f's hidden layer in the
backward pass from the saved log-sum-exp; no (B, width, L, L) tensor lives longer than one chunk, in
training or in a 4,096-token evaluation. In a cached decoding step the queries are the last c of the n keys
(`posab.forms.base`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posab.forms import Additive, Form, compute_dtype, without_autocast
from posab.forms.base import key_offset
from posab.forms.chunked import ChunkedAttention, Kernel, LogitGrads, Workspace, explicit_forward


class PairMLP(Protocol):
    """What `mixed_attention` reads of a score mixer (DAPE's `ScoreMixer`): f = second(leaky(first(.)))."""

    first: nn.Linear  # 2H -> width, over [logits; bias]
    second: nn.Linear  # width -> H
    slope: float  # the LeakyReLU's negative slope


MIX_CHUNK = 16  # queries per chunk of `mixed_attention`, by the chunked core's rule, measured in bench
# section 7 (`posab.bench.chunks`; results/bench/chunks: the fastest); f channels first (channels last: 1.4x)


def future_keys(start: int, end: int, device: torch.device, offset: int = 0) -> Tensor:
    """(c', offset + end) bool: True where key j is after the query of row r (position offset + r), for the
    query rows start:end."""
    rows = torch.arange(offset + start, offset + end, device=device)  # (c',)
    return torch.arange(offset + end, device=device)[None, :] > rows[:, None]


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
    q: Tensor,
    k: Tensor,
    mask: Tensor | None,
    mixer: PairMLP,
    start: int,
    end: int,
    space: Workspace | None = None,
) -> MixedChunk:
    """DAPE's scores of query rows start:end over the keys they see, 0 .. n - c + end - 1 (`stop`). The bias
    is the mask with its causal part set to 0 (the reference's tril), the causal mask is applied after f.
    f runs in the scores' dtype under any autocast: autocast would run its bmm in bf16 in the forward pass
    while the backward pass, outside autocast, recomputes it in float32 against the forward's log-sum-exp.
    f's hidden layer lives in `space`'s buffer "activation" when the kernel gives one (inside its autograd
    function); a tensor of its own otherwise, which autograd may differentiate (the form's `scores`)."""
    with without_autocast(q.device):
        offset = key_offset(q, k)
        stop = offset + end
        dtype, (batch, heads), pairs = compute_dtype(q), q.shape[:2], (end - start) * stop
        logits = torch.matmul(q[:, :, start:end], k[:, :, :stop].transpose(-1, -2)).to(dtype)  # (B, H, c, n)
        logits = logits.div_(math.sqrt(q.shape[-1])).view(batch, heads, pairs)  # (B, H, c, n) -> (B, H, c*n)
        future = future_keys(start, end, q.device, offset)  # (c, n)
        if mask is None:
            bias = logits.new_zeros(1, heads, pairs)  # (1, H, c*n)
        else:
            bias = mask[..., start:end, :stop].to(dtype).masked_fill(future, 0.0)  # (1|B, H, c, n)
            bias = bias.view(-1, heads, pairs)  # (1|B, H, c, n) -> (1|B, H, c*n)
        w1, b1 = mixer.first.weight.to(dtype), mixer.first.bias.to(dtype)
        # the bias's half of f's first layer, with b1: (1|B, W, c*n)
        from_bias = torch.baddbmm(b1[None, :, None], batched(w1[:, heads:], bias.shape[0]), bias)
        kept = None if space is None else space.take("activation", (batch, w1.shape[0]), pairs, logits)
        hidden = torch.bmm(batched(w1[:, :heads], batch), logits, out=kept).add_(from_bias)  # (B, W, c*n)
        activation = F.leaky_relu_(hidden, mixer.slope)
        w2, b2 = mixer.second.weight.to(dtype), mixer.second.bias.to(dtype)
        scores = torch.bmm(batched(w2, batch), activation)  # (B, H, c*n)
        scores = scores.add_(logits).add_(bias).add_(b2[:, None])
        scores = scores.view(batch, heads, end - start, stop)  # (B, H, c*n) -> (B, H, c, n)
        return MixedChunk(logits, bias, activation, scores.masked_fill_(future, float("-inf")), future)


def mixed_scores(q: Tensor, k: Tensor, mask: Tensor | None, mixer: PairMLP, start: int, end: int) -> Tensor:
    """`mixed_chunk`'s scores alone: (B, H, c, end)."""
    return mixed_chunk(q, k, mask, mixer, start, end).scores


def mixed_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, mixer: PairMLP, dropout: float = 0.0
) -> Tensor:
    """Attention with DAPE's scores (module docstring): (B, H, T, D). No attention dropout: DAPE's scores
    have no fused kernel to drop from, and the reference runs none."""
    if dropout:
        raise ValueError(f"model.dropout={dropout}: attention with a score mixer (DAPE) runs without dropout")
    kernel = Mixing(mask, mixer)
    if torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, *kernel.inputs())
    ):
        return ChunkedAttention.apply(kernel, q, k, v, *kernel.inputs())
    return kernel.forward(q, k, v)[0]


class Mixing(Kernel):
    """DAPE's attention on the chunked core (`forms.chunked`): softmax(A + B + f([A; B]) + causal) V by
    chunks of MIX_CHUNK query rows (`explicit_forward` over `mixed_scores`), and the shared backward with,
    through S = A + B + W2 g(W1 [A; B] + b1) + b2: dW2 = dS g^T, dH = (W2^T dS) * g'(H), dW1 = dH [A; B]^T,
    dA = dS + W1_A^T dH (the logits' gradient, into dq, dk), dB = dS + W1_B^T dH (into the mask, summed over
    the batch when it is shared). Its inputs: the mask and f's four tensors. Everything in the scores'
    dtype, the matmuls too."""

    chunk = MIX_CHUNK

    def __init__(self, mask: Tensor | None, mixer: PairMLP) -> None:
        self.mask, self.mixer = mask, mixer
        self.grads: MixedGrads | None = None
        self.weights: tuple[Tensor, Tensor] | None = None  # W1, W2 in the scores' dtype
        self.space: Workspace | None = None  # the chunks' buffers during a pass

    def operand_dtype(self, q: Tensor) -> torch.dtype:
        return compute_dtype(q)

    def inputs(self) -> tuple[Tensor | None, ...]:
        mixer = self.mixer
        return self.mask, mixer.first.weight, mixer.first.bias, mixer.second.weight, mixer.second.bias

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.space = Workspace(self.chunk * k.shape[-2])
        out = explicit_forward(self, q, k, v)
        self.space = None
        return out

    def scores(self, q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
        return mixed_chunk(q, k, self.mask, self.mixer, start, end, self.space).scores

    def begin_backward(self, q: Tensor, k: Tensor, needed: Sequence[bool]) -> None:
        dtype = compute_dtype(q)
        self.grads = MixedGrads.zeros(self.mask if needed[0] else None, self.mixer, dtype, q.device)
        self.weights = self.mixer.first.weight.to(dtype), self.mixer.second.weight.to(dtype)
        self.space = Workspace(self.chunk * k.shape[-2])

    def probabilities(self, q: Tensor, k: Tensor, lse: Tensor, start: int, end: int) -> tuple[Tensor, Any]:
        chunk = mixed_chunk(q, k, self.mask, self.mixer, start, end, self.space)
        return chunk.scores.sub_(lse[..., None]).exp_(), chunk  # P: (B, H, c, stop)

    def score_backward(
        self, chunk: Any, d_scores: Tensor, q: Tensor, k: Tensor, start: int, end: int
    ) -> LogitGrads:
        (batch, heads, rows, stop), (w1, w2) = d_scores.shape, self.weights
        flat = d_scores.view(batch, heads, -1)  # (B, H, c, stop) -> (B, H, c*stop)
        d_logits, d_bias = self.grads.add_mlp(chunk, flat, (w1, w2), self.mixer.slope, self.space)
        d_logits = d_logits.mul_(1.0 / math.sqrt(q.shape[-1])).view_as(d_scores)  # dA / sqrt(D)
        if self.grads.mask is not None:
            d_bias = d_bias.view(-1, heads, rows, stop)  # (1|B, H, c*stop) -> (1|B, H, c, stop)
            self.grads.mask[..., start:end, :stop] = d_bias.masked_fill_(chunk.future, 0)
        return LogitGrads(d_logits, scaled=True)

    def input_grads(self) -> tuple[Tensor | None, ...]:
        self.space = None
        return self.grads.cast(self.mask, self.mixer)


@dataclass
class MixedGrads:
    """The gradients of DAPE's own inputs `Mixing` accumulates, in the scores' dtype."""

    mask: Tensor | None
    w1: Tensor
    b1: Tensor
    w2: Tensor
    b2: Tensor

    @staticmethod
    def zeros(mask: Tensor | None, mixer: PairMLP, dtype: torch.dtype, device: torch.device) -> MixedGrads:
        def zero(t: Tensor) -> Tensor:
            return torch.zeros(t.shape, dtype=dtype, device=device)

        layers = (mixer.first.weight, mixer.first.bias, mixer.second.weight, mixer.second.bias)
        return MixedGrads(None if mask is None else zero(mask), *map(zero, layers))

    def add_mlp(
        self,
        chunk: MixedChunk,
        d_scores: Tensor,
        weights: tuple[Tensor, Tensor],
        slope: float,
        space: Workspace,
    ) -> tuple[Tensor, Tensor]:
        """Accumulate f's weight gradients from dS (B, H, c*n), and return the gradients with respect to
        the logits, dA = dS + W1_A^T dH (B, H, c*n), and to the bias, dB = dS + W1_B^T dH (1|B, H, c*n),
        summed over the batch when the bias is shared."""
        (batch, heads, pairs), (w1, w2) = d_scores.shape, weights
        self.w2 += torch.bmm(d_scores, chunk.activation.transpose(1, 2)).sum(0)  # (B, H, W) -> (H, W)
        self.b2 += d_scores.sum((0, 2))
        d_activation = space.take("d_activation", (batch, w1.shape[0]), pairs, d_scores)  # (B, W, c*n)
        torch.bmm(batched(w2.t(), batch), d_scores, out=d_activation)
        # dH = dg * g'(H) from g(H) itself (its sign is H's): aten's fused LeakyReLU backward
        d_hidden = space.take("d_hidden", (batch, w1.shape[0]), pairs, d_scores)  # (B, W, c*n)
        torch.ops.aten.leaky_relu_backward.grad_input(
            d_activation, chunk.activation, slope, True, grad_input=d_hidden
        )
        self.w1[:, :heads] += torch.bmm(d_hidden, chunk.logits.transpose(1, 2)).sum(0)  # (B, W, H) -> (W, H)
        d_logits = torch.baddbmm(d_scores, batched(w1[:, :heads].t(), batch), d_hidden)  # (B, H, c*n)
        if chunk.bias.shape[0] == 1:  # a shared bias: its terms summed over the batch first
            d_hidden, d_scores = d_hidden.sum(0, keepdim=True), d_scores.sum(0, keepdim=True)
        self.w1[:, heads:] += torch.bmm(d_hidden, chunk.bias.transpose(1, 2)).sum(0)  # (1|B, W, H) -> (W, H)
        self.b1 += d_hidden.sum((0, 2))
        d_bias = torch.baddbmm(d_scores, batched(w1[:, heads:].t(), d_hidden.shape[0]), d_hidden)
        return d_logits, d_bias

    def cast(self, mask: Tensor | None, mixer: PairMLP) -> tuple[Tensor | None, ...]:
        """The gradients in their inputs' dtypes, in `Mixing.inputs`'s order."""
        layers = (mixer.first.weight, mixer.first.bias, mixer.second.weight, mixer.second.bias)
        mixed = [g.to(t.dtype) for g, t in zip((self.w1, self.b1, self.w2, self.b2), layers, strict=True)]
        d_mask = None if self.mask is None or mask is None else self.mask.to(mask.dtype)
        return (d_mask, *mixed)


@dataclass(eq=False)
class Mixed(Form):
    """DAPE's form: its scores on every path (the chunked kernel is plain PyTorch, so it runs on any device),
    over the base encoding's additive bias (`base`, or None)."""

    base: Additive | None
    mixer: PairMLP

    @property
    def mask(self) -> Tensor | None:
        """The base's (1, H, c, n) mask, causal part included, in the attention dtype; or None."""
        return None if self.base is None else self.base.mask

    def dense_bias(self) -> Tensor | None:
        return None if self.base is None else self.base.dense_bias()

    def on_cpu(self, q: Tensor, k: Tensor, v: Tensor, dropout: float, backend: str) -> Tensor:
        return mixed_attention(q, k, v, self.mask, self.mixer, dropout)

    def accelerated(self, q: Tensor, k: Tensor, v: Tensor, dropout: float) -> Tensor:
        return mixed_attention(q, k, v, self.mask, self.mixer, dropout)

    def block(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return Mixing(self.mask, self.mixer).forward(q, k, v)[0]

    def scores(self, q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
        return mixed_scores(q, k, self.mask, self.mixer, start, end)
