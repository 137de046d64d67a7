"""Stick-breaking attention's form and its chunked kernel (`posab.encodings.stickbreaking`): a form that
replaces the softmax.

For query i and each key j before it (j < i), with z_ij = q_i . k_j / sqrt(D) and beta_ij = sigmoid(z_ij),

    A_ij = beta_ij prod_{j<m<i} (1 - beta_im),
    log A_ij = logsigmoid(z_ij) + sum_{j<m<i} logsigmoid(-z_im) = z_ij + sum_{j<=m<i} logsigmoid(-z_im)

(logsigmoid(z) = z + logsigmoid(-z)); the nearest key breaks the stick first. The diagonal is not one of
the keys A is over (the reference's mask is triu(0), `attend_current=False`), and the remainder
R_i = 1 - sum_{j<i} A_ij = prod_{j<i} (1 - beta_ij) goes to the current token's value, as the reference
does: o_i = sum_{j<i} A_ij v_j + R_i v_i (github.com/shawntan/stickbreaking-attention, sb_ref.py
`stickbreaking` returns (A V, 1 - sum_j A_ij), and tests/test_attn.py `ref_fwd` adds rem * v). So the
weights W this form attends with are A below the diagonal and R on it (the current token takes what is
left of the stick), every row of W sums to 1, and the first token attends to itself alone. `probabilities`
are W, `scores` log W (the analysis's entropy and distance read W; the remainder counts at distance 0).
log R_i = sum_{j<i} logsigmoid(-z_ij) is summed directly, not taken as 1 - sum A: no cancellation.

The kernel never holds a (B, H, L, L) tensor past one chunk of queries: each row needs all of its keys
(its stick is a sum over them), so it runs over query chunks and the keys they see. It works on the
sequence reversed (the last query first), where the sums over the keys between j and i run forward from
the diagonal: one `cumsum` per chunk, no flips of (c, n) tensors. The forward pass saves only q, k and v;
the backward pass recomputes each chunk's W and derives the gradients by hand. With s_m = logsigmoid(-z_m)
(row i implicit, keys m < i), log W_j = z_j + sum_{j<=m<i} s_m for j < i and log W_i = sum_{m<i} s_m;
ds_m/dz_m = -beta_m. With G_j = W_j dW_j = W_j (dO_i . v_j), the gradient of the loss with respect to
log W_j: every log W_j with j <= m (the diagonal's included) holds s_m, so

    dz_m = G_m - beta_m (sum_{j<=m} G_j + G_i),        m < i,

a prefix sum over the keys of each row (in the reversed order a suffix: the row's total less a cumulative
sum); then dq_i = sum_m dz_im k_m / sqrt(D), dk_m = sum_i dz_im q_i / sqrt(D) and dv_j = sum_i W_ij dO_i.
In a cached decoding step the queries are the last c of the n keys (`posab.forms.base`); everything runs in
the scores' dtype (float32; float64 for float64 inputs), under any autocast, so that the backward pass
recomputes exactly what the forward pass used.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from posab.forms import Form, compute_dtype, without_autocast
from posab.forms.base import key_offset, logits

STICK_CHUNK = (
    64  # queries per chunk. CPU seconds on 2 cores (a loaded, shared machine: +-20%), at L=512, B=16,
)
# H=4, D=32, one layer's forward and backward: 32: 0.39, 64: 0.42, 128: 0.44, 256: 0.61 (the softmax's fused
# kernel: 0.24); at L=4096, B=4, one layer's evaluation forward: 16: 5.2, 32: 3.6, 64: 2.5, 128: 2.3
LOG2E = 1.4426950408889634  # log2(e)
SOFTPLUS_LINEAR = 40.0  # softplus(z) = z past this: log1p(e^-40) ~ 4e-18 is below float64's rounding of z


def exponentiate(log_weights: Tensor) -> Tensor:
    """exp, in place, as 2^(x log2 e): the far keys' log weights (~ -0.7 per token of distance) underflow,
    and aten's exp takes a slow path there (on 2 AVX-512 cores, 53 ms for 2M values in [-100, -88] against
    0.9 ms in [-20, 0]) where exp2 does not (0.5 ms). The product's rounding costs ~|x| EPS relative, and
    W |log W| <= 1/e, so no weight is off by more than ~EPS/e absolutely."""
    return log_weights.mul_(LOG2E).exp2_()


def reversed_inputs(*tensors: Tensor) -> list[Tensor]:
    """(B, H, T, D) tensors in the scores' dtype of the first, last position first; the first (the queries)
    scaled by 1 / sqrt(D). Reversed, query r sits at key r (the queries are the last c of the n keys) and
    sees keys r .. n - 1."""
    dtype = compute_dtype(tensors[0])
    scale = tensors[0].shape[-1] ** -0.5
    flipped = [t.to(dtype).flip(-2) for t in tensors]  # (B, H, T, D) each
    flipped[0] = flipped[0].mul_(scale)
    return flipped


def stick_chunk(q: Tensor, k: Tensor, start: int, end: int, keep: bool = False) -> tuple[Tensor, Tensor]:
    """Reversed (`reversed_inputs`) q and k -> log W of the query rows start:end over keys start .. n - 1,
    and (`keep`, for the backward pass) -s = softplus(z) = -log(1 - beta), 0 at and after each query, or
    else its cumulative sum in its place: 2 x (B, H, c', n - start). Column t is key start + t; row r's own
    key is column r (log R there), its earlier keys t > r, later ones t < r."""
    with without_autocast(q.device):
        z = torch.matmul(q[:, :, start:end], k[:, :, start:].transpose(-1, -2))  # (B, H, c', n - start)
        width = end - start
        later = torch.ones(width, width, dtype=torch.bool, device=q.device).tril()  # (c', c'): t <= r
        z[..., :width].masked_fill_(later, float("-inf"))
        spent = F.softplus(z, threshold=SOFTPLUS_LINEAR)  # -s_m; 0 where z is -inf
        broken = spent.cumsum(-1) if keep else spent.cumsum_(-1)  # -sum_{j <= m < i} s_m at key j
        log_weights = z.sub_(broken)  # log A below the diagonal, -inf elsewhere
        log_weights.diagonal(0, -2, -1).copy_(broken[..., -1]).neg_()  # log R_i = sum_{m < i} s_m
        return log_weights, spent


def stick_forward(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """W V by query chunks: (B, H, c, D) in v's dtype (queries: the last c of the n keys)."""
    q_, k_, v_ = reversed_inputs(q, k, v)
    out = torch.empty(q_.shape, dtype=v.dtype, device=v.device)  # reversed: (B, H, c, D)
    for start in range(0, q.shape[-2], STICK_CHUNK):
        end = min(q.shape[-2], start + STICK_CHUNK)
        weights = exponentiate(stick_chunk(q_, k_, start, end)[0])  # W: (B, H, c', n - start)
        with without_autocast(q.device):
            out[:, :, start:end] = torch.matmul(weights, v_[:, :, start:])
    return out.flip(-2)


def stick_breaking_attention(q: Tensor, k: Tensor, v: Tensor, dropout: float = 0.0) -> Tensor:
    """Stick-breaking attention (module docstring): (B, H, c, D). No attention dropout: the reference runs
    none (its layer passes softmax_dropout=0), and W has no fused kernel to drop from."""
    if dropout:
        raise ValueError(f"model.dropout={dropout}: stick-breaking attention runs without attention dropout")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return StickBreakingAttention.apply(q, k, v)
    return stick_forward(q, k, v)


def chunk_logit_grads(grads: Tensor, spent: Tensor) -> Tensor:
    """G = W dW of one reversed chunk (B, H, c', n - start), overwritten -> dz (module docstring), `spent`
    (-s, overwritten) from `stick_chunk`. With the diagonal's G_i set aside, sum_{j<=m} G_j (a suffix in the
    reversed order) is the row's total less the cumulative sum before column t; -beta = expm1(s)."""
    diagonal = grads.diagonal(0, -2, -1)  # G_i: (B, H, c')
    remainder = diagonal.clone()
    diagonal.zero_()  # G of the keys before each query only (0 after it: W = 0 there)
    cumulative = grads.cumsum(-1)  # sum over columns <= t
    total = cumulative[..., -1:] + remainder[..., None]  # sum_{j<i} G_j + G_i: (B, H, c', 1)
    held = torch.sub(total, cumulative, out=cumulative).add_(grads)  # sum_{j<=m} G_j + G_i at column m
    return grads.addcmul_(held, torch.expm1(spent.neg_()))  # dz = G - beta (...); 0 at and after i


class StickBreakingAttention(torch.autograd.Function):
    """`stick_forward` with its own backward pass over the same query chunks (the derivation: module
    docstring); saves q, k and v only."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        ctx.save_for_backward(q, k, v)
        return stick_forward(q, k, v)

    @staticmethod
    def backward(ctx: Any, d_out: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = ctx.saved_tensors
        q_, k_, v_, d_out_ = reversed_inputs(q, k, v, d_out)  # q_ scaled by 1 / sqrt(D)
        dq = torch.empty_like(q_)  # reversed: (B, H, c, D)
        dk, dv = torch.zeros_like(k_), torch.zeros_like(v_)  # reversed: (B, H, n, D)
        for start in range(0, q.shape[-2], STICK_CHUNK):
            end = min(q.shape[-2], start + STICK_CHUNK)
            log_weights, spent = stick_chunk(q_, k_, start, end, keep=True)
            weights = exponentiate(log_weights)  # W: (B, H, c', n - start)
            with without_autocast(q.device):
                d_out_c = d_out_[:, :, start:end]
                dv[:, :, start:] += torch.matmul(weights.transpose(-1, -2), d_out_c)
                grads = torch.matmul(d_out_c, v_[:, :, start:].transpose(-1, -2)).mul_(weights)  # G
                d_logits = chunk_logit_grads(grads, spent)  # dz: (B, H, c', n - start)
                dq[:, :, start:end] = torch.matmul(d_logits, k_[:, :, start:])
                dk[:, :, start:] += torch.matmul(d_logits.transpose(-1, -2), q_[:, :, start:end])
        dq = dq.mul_(q.shape[-1] ** -0.5).flip(-2)  # dz/dq = k / sqrt(D); dz/dk = q / sqrt(D), q_ scaled
        return dq.to(q.dtype), dk.flip(-2).to(k.dtype), dv.flip(-2).to(v.dtype)


def stick_scores(q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
    """log W of query rows start:end over the keys they see, 0 .. n - c + end - 1, in the original order:
    (B, H, end - start, n - c + end), -inf after each query (the reversed chunk of rows c - end .. c -
    start - 1, flipped back)."""
    length = q.shape[-2]
    q_, k_ = reversed_inputs(q, k)
    return stick_chunk(q_, k_, length - end, length - start)[0].flip(-2, -1)


def keys_before(length: int, keys: int, device: torch.device) -> Tensor:
    """(c, n) bool: True where key j is strictly before the query of row r (position n - c + r)."""
    rows = torch.arange(keys - length, keys, device=device)  # (c,)
    return torch.arange(keys, device=device)[None, :] < rows[:, None]


def stick_breaking_all_pairs(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """The definition on all pairs, written as the reference computes it (sb_ref.py): A (B, H, c, n), 0 at
    and after each query, and the remainder 1 - sum_j A_ij (B, H, c), in the scores' dtype. The sum over
    the keys between j and i is a product with the strictly lower-triangular ones (the reference's
    `cum_weight`), not the kernel's cumulative sum, and the remainder is 1 - sum, not a product."""
    dtype, (length, keys) = compute_dtype(q), (q.shape[-2], k.shape[-2])
    z = logits(q.to(dtype), k.to(dtype), 0, length)  # (B, H, c, n)
    before = keys_before(length, keys, q.device)  # (c, n)
    log_break = F.logsigmoid(z).masked_fill(~before, float("-inf"))  # log beta_ij
    log_stay = F.logsigmoid(-z).masked_fill(~before, 0.0)  # log(1 - beta_ij)
    between = torch.ones(keys, keys, dtype=dtype, device=q.device).tril(-1)  # [m > j]: (n, n)
    weights = torch.exp(log_break + torch.matmul(log_stay, between))  # A: (B, H, c, n)
    return weights, 1 - weights.sum(-1)


class StickBreakingForm(Form):
    """Stick-breaking attention's form: the chunked kernel on every path (plain PyTorch, so it runs on any
    device); a cached decoding step is stateless (its W is a function of the new queries and all keys)."""

    def on_cpu(self, q: Tensor, k: Tensor, v: Tensor, dropout: float, backend: str) -> Tensor:
        return stick_breaking_attention(q, k, v, dropout)

    def accelerated(self, q: Tensor, k: Tensor, v: Tensor, dropout: float) -> Tensor:
        return stick_breaking_attention(q, k, v, dropout)

    def block(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return stick_forward(q, k, v)

    def scores(self, q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
        """log W (module docstring): -inf after each query, log of the remainder on the diagonal, so that
        softmax(scores) = exp(scores) = W; not q k^T / sqrt(D) plus a bias."""
        return stick_scores(q, k, start, end)

    def probabilities(self, q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
        """W: A below the diagonal, the remainder on it, 0 after; rows sum to 1 (B, H, end - start, stop)."""
        return exponentiate(stick_scores(q, k, start, end))

    def reference(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """A V + (1 - sum_j A_ij) v_i on all pairs, through autograd (`stick_breaking_all_pairs`)."""
        weights, remainder = stick_breaking_all_pairs(q, k)
        current = v[:, :, key_offset(q, k) :].to(weights.dtype)  # the queries' own values: (B, H, c, D)
        return torch.matmul(weights, v.to(weights.dtype)) + remainder[..., None] * current
