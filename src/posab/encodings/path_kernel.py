"""PaTH's attention form (`posab.encodings.path`): the logit of query i and key j <= i is

    q_i^T H_i H_{i-1} ... H_{j+1} k_j / sqrt(d),   H_s = I - beta_s w_s w_s^T,

(plus FoX's c_i - c_j for PaTH-FoX), the product of every transform between the key and the query, the
newest applied last (a cached key is rewritten by each later token's transform: `PathForm` with a cache).

No (L, L, d) tensor and no (d, d) product is ever formed. The tokens are cut into chunks of C (UT transform;
Joffrain et al., 2006, as in the reference's kernels, fla-org/flash-linear-attention fla/ops/path_attn):
within a chunk, with W its (C, d) unit vectors w_s, G = I + diag(beta) strictly-lower(W W^T) and
Y = G^{-1} diag(beta) W, the chunk's product from its first token through token t is
I - sum_{s<=t} w_s y_s^T, so
- each query carries the transforms of its own chunk up to itself: q~_i = q_i - sum_{s<=i} (q_i.w_s) y_s;
- each key carries those after it in its chunk: k~_j = k_j - sum_{s>j} U_sj w_s, U = G^{-1} diag(beta)
  strictly-lower(W K^T);
- logits inside a chunk are q_i.k_j - sum_{s<=i} (q_i.w_s) U_sj (i >= j);
- the keys before chunk m, each transformed through the end of chunk m - 1, are a state K_m (the decoding
  cache at that boundary): K_{m+1} = [K_m - (K_m Y_m^T) W_m; k~_m], and chunk m's queries read K_m by
  q~ . K_m.
One pass over the chunks (`path_forward`) gives each chunk's rows of scores over every key it sees, their
softmax and the output, and the final state. The backward pass (`PathAttention`) walks the chunks in
reverse with the states kept by the forward, carrying the states' gradient back through each chunk's
transform (with G the gradient of the carried K_m: dK_m = G - (G W^T) Y, dY = -(G W^T)^T K_m,
dW = -(K_m Y^T)^T G); the chunk-local parts (q~, k~, the
in-chunk logits, Y) are a few (C, C) and (C, d) products per chunk that autograd differentiates.

Arithmetic: the transforms, the states and the scores in the scores' dtype (float32, float64 for float64
inputs), never under autocast: a product of hundreds of transforms rounded to bf16 at each step drifts,
and beta is kept in [0, 2] so that no rounding makes a transform expand (|1 - beta| > 1 compounds over
positions). The attention's matmuls (q~ against the state, P V, their gradients) run in the values' dtype,
bf16 under autocast, as every CPU kernel's here (`Step`). Cost per chunk of C
queries over n keys: the scores (C n d), the output (C n d) and the state's update (2 C n d) forward,
about twice the matmuls of plain attention; evaluation keeps one state, (B, H, n, d), and a chunk's scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from posab.encodings.fox_kernel import Forgetting
from posab.forms import Form, compute_dtype
from posab.forms.base import without_autocast

FAR_KEYS = 16  # the audit reads how far the transforms carry the window's first keys (`content_statistics`)
# exp's vectorised CPU kernel takes a slow path below ~-87 (`fox_kernel`), and P of e^-80 times a small
# gradient is a denormal float32, whose arithmetic is ~5x slower again (measured on the 2-core Xeon): P below
# e^EXP_FLOOR is 0 here. That drops at most n e^-60 < 1e-22 of a row's mass (its largest P is 1): below
# float64's precision, and PaTH-FoX's gates put most far keys there.
EXP_FLOOR = -60.0
FLOORED = math.exp(EXP_FLOOR) * (1 + 1e-5)  # exp(EXP_FLOOR) in any rounding is at most this


@dataclass
class Chunks:
    """The chunk-local quantities of c tokens, padded with identity transforms (w = 0, beta = 0) to M
    chunks of C, in the scores' dtype."""

    queries: Tensor  # q~: (B, H, M C, D)
    keys: Tensor  # k~: (B, H, M C, D)
    local: Tensor  # logits inside each chunk, unscaled, unmasked (valid for i >= j): (B, H, M, C, C)
    w: Tensor  # W: (B, H, M C, D)
    y: Tensor  # Y: (B, H, M C, D)
    size: int  # C

    @property
    def count(self) -> int:
        """M, the chunks."""
        return self.local.shape[2]


def chunk_size(tokens: int) -> int:
    """C: `PathAttention.chunk`, or fewer for fewer tokens (one decoded token is one chunk of one)."""
    return max(1, min(PathAttention.chunk, tokens))


def padded(t: Tensor, pad: int, tokens: int) -> Tensor:
    """`t` with `pad` zeros after its tokens (dimension `tokens`, -1 or -2); `t` itself for none."""
    if pad == 0:
        return t
    return F.pad(t, (0, pad) if tokens == -1 else (0, 0, 0, pad))


def ut_chunks(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, size: int) -> Chunks:
    """q, k, w (B, H, c, D) and beta (B, H, c), in the scores' dtype, cut into chunks of `size` (module
    docstring); differentiable by autograd."""
    batch, heads, tokens, dim = q.shape
    count = math.ceil(tokens / size)
    pad = count * size - tokens
    q, k, w = (padded(t, pad, tokens=-2) for t in (q, k, w))  # (B, H, M C, D)
    beta = padded(beta, pad, tokens=-1)  # (B, H, M C)
    shape = (batch, heads, count, size, dim)
    q_c, k_c, w_c = q.reshape(shape), k.reshape(shape), w.reshape(shape)  # (B, H, M, C, D)
    beta_c = beta.reshape(*shape[:4], 1)  # (B, H, M, C, 1)
    lower = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()  # s <= i
    # G = I + diag(beta) strictly-lower(W W^T): the solver reads only G's strictly lower part (its diagonal
    # is unit, its upper part ignored) and gives G's gradient there alone, so W W^T goes in unmasked
    system = beta_c * (w_c @ w_c.transpose(-1, -2))  # (B, H, M, C, C)
    key_dots = (w_c @ k_c.transpose(-1, -2)).masked_fill(lower.T, 0.0)  # w_s.k_j for s > j, else 0
    right = torch.cat([w_c, key_dots], dim=-1) * beta_c  # (B, H, M, C, D + C)
    solved = torch.linalg.solve_triangular(system, right, upper=False, unitriangular=True)
    y, carry = solved.split([dim, size], dim=-1)  # Y: (.., C, D), U: (.., C, C)
    query_dots = (q_c @ w_c.transpose(-1, -2)).masked_fill(~lower, 0.0)  # q_i.w_s for s <= i: (.., C, C)
    queries = q_c - query_dots @ y  # (B, H, M, C, D)
    keys = k_c - carry.transpose(-1, -2) @ w_c  # (B, H, M, C, D)
    local = q_c @ k_c.transpose(-1, -2) - query_dots @ carry  # (B, H, M, C, C)
    flat = (batch, heads, count * size, dim)
    return Chunks(queries.reshape(flat), keys.reshape(flat), local, w, y.reshape(flat), size)


@dataclass
class Step:
    """The shared inputs of every chunk of one pass: the values and the gate sums over all n0 + M C keys,
    n0 the keys before the pass (a cache's, already transformed through the pass's first token). The
    attention's matmuls (scores, P V and their gradients) run in `operand`, the values' dtype (bf16 under
    autocast, as every CPU kernel's here); the transforms and the states never leave the scores' dtype."""

    chunks: Chunks
    values: Tensor  # (B, H, n0 + M C, Dv) in the operand dtype
    cum: Tensor | None  # (B, H, n0 + M C), the cumulative log forget gates (PaTH-FoX), or None
    before: int  # n0
    scale: float

    def __post_init__(self) -> None:
        size = self.chunks.size
        self.future = torch.ones(size, size, dtype=torch.bool, device=self.chunks.local.device).triu(1)
        # q~ / sqrt(d) and the in-chunk logits / sqrt(d), once: the scores need no pass of their own to scale
        self.queries = (self.chunks.queries * self.scale).to(self.operand)  # (B, H, M C, D)
        self.local = self.chunks.local * self.scale  # (B, H, M, C, C)

    @property
    def operand(self) -> torch.dtype:
        return self.values.dtype

    def rows(self, m: int) -> slice:
        size = self.chunks.size
        return slice(m * size, (m + 1) * size)

    def seen(self, m: int) -> int:
        """The keys before chunk m: n0 + m C."""
        return self.before + m * self.chunks.size

    def scores(self, state: Tensor, m: int) -> Tensor:
        """Chunk m's scores over its n0 + (m + 1) C keys, before the causal mask, in the scores' dtype:
        (B, H, C, n0 + (m + 1) C). `state`: K_m."""
        rows, seen, size = self.rows(m), self.seen(m), self.chunks.size
        local = self.local[:, :, m]  # (B, H, C, C)
        scores = local.new_empty((*local.shape[:3], seen + size))  # (B, H, C, seen + C)
        scores[..., :seen] = self.queries[:, :, rows] @ state.to(self.operand).transpose(-1, -2)
        scores[..., seen:] = local
        if self.cum is not None:  # c_i - c_j, the difference taken first: c grows with the position
            # (~-0.7 a token at FoX's initialisation), and c_i or c_j rounded alone to float32 loses the
            # logit's last digits past a few hundred tokens (as `fox_kernel`)
            at = slice(seen, seen + size)
            scores.add_(self.cum[..., at, None] - self.cum[..., None, : seen + size])
        return scores

    def mask(self, scores: Tensor) -> Tensor:
        """-inf at each query's future keys (the last C columns' upper triangle), in place."""
        scores[..., -self.chunks.size :].masked_fill_(self.future, float("-inf"))
        return scores

    def probabilities(self, scores: Tensor, lse: Tensor) -> Tensor:
        """P = exp(S - lse), in place, 0 below e^EXP_FLOOR and at future keys."""
        return exp_floored(self.mask(scores.sub_(lse[..., None])))

    def advance(self, state: Tensor, m: int) -> Tensor:
        """K_{m+1} = [K_m - (K_m Y_m^T) W_m; k~_m]: the earlier keys through chunk m's transforms, then
        chunk m's own keys, which carry the transforms after them already: (B, H, n0 + (m + 1) C, D)."""
        rows = self.rows(m)
        weights = state @ self.chunks.y[:, :, rows].transpose(-1, -2)  # K_m Y^T: (B, H, seen, C)
        carried = state - weights @ self.chunks.w[:, :, rows]  # (B, H, seen, D)
        return torch.cat([carried, self.chunks.keys[:, :, rows]], dim=-2)


def exp_floored(shifted: Tensor) -> Tensor:
    """exp in place, exactly 0 at arguments below EXP_FLOOR (-inf included), on exp's fast path."""
    probs = shifted.clamp_(min=EXP_FLOOR).exp_()
    return F.threshold_(probs, FLOORED, 0.0)


def path_forward(step: Step, before: Tensor, keep: bool) -> tuple[Tensor, Tensor, list[Tensor], Tensor]:
    """One pass over the chunks from the state `before` (B, H, n0, D): the output (B, H, M C, Dv) in the
    operand dtype, every row's log-sum-exp (B, H, M C), the states K_0 .. K_{M-1} if `keep` (for the
    backward), and the final state K_M (B, H, n0 + M C, D) (with `keep`, K_{M-1}: a gradient reads none).
    The softmax in one exp pass: the row's maximum, exp of the differences (`exp_floored`), their sum and
    its log."""
    chunks = step.chunks
    total = chunks.count * chunks.size
    out = step.values.new_empty((*before.shape[:2], total, step.values.shape[-1]))  # (B, H, M C, Dv)
    lse = before.new_empty((*before.shape[:2], total))  # (B, H, M C)
    states, state = [], before
    for m in range(chunks.count):
        rows = step.rows(m)
        scores = step.mask(step.scores(state, m))  # (B, H, C, seen + C)
        top = scores.amax(dim=-1, keepdim=True)  # (B, H, C, 1): finite (each query sees itself)
        probs = exp_floored(scores.sub_(top))
        sums = probs.sum(dim=-1, keepdim=True)  # (B, H, C, 1)
        lse[:, :, rows] = (top + sums.log())[..., 0]
        weighted = probs.to(step.operand) @ step.values[:, :, : probs.shape[-1]]  # (B, H, C, Dv)
        out[:, :, rows] = weighted / sums.to(weighted.dtype)
        if keep:
            states.append(state)
        if not (keep and m == chunks.count - 1):  # the backward reads no final state
            state = step.advance(state, m)
    return out, lse, states, state


def path_backward(
    step: Step, states: list[Tensor], out: Tensor, lse: Tensor, d_out: Tensor
) -> tuple[Tensor, ...]:
    """The gradients of q~, k~, the in-chunk logits, W, Y, the values, the state before the pass and the
    gate sums (None without gates), walking the chunks in reverse (module docstring)."""
    chunks, operand = step.chunks, step.operand
    d_queries, d_keys = torch.zeros_like(chunks.queries), torch.zeros_like(chunks.keys)
    d_local, d_w, d_y = torch.zeros_like(chunks.local), torch.zeros_like(chunks.w), torch.zeros_like(chunks.y)
    d_values = torch.zeros(step.values.shape, dtype=lse.dtype, device=lse.device)
    d_cum = None if step.cum is None else torch.zeros_like(step.cum)
    delta = (d_out.to(lse.dtype) * out.to(lse.dtype)).sum(-1)  # rowsum(dO * O): (B, H, M C)
    d_out = d_out.to(operand)
    d_state = None  # the gradient of K_{m+1}: none of the final state
    for m in reversed(range(chunks.count)):
        rows, seen, state = step.rows(m), step.seen(m), states[m]
        if d_state is None:
            d_earlier = torch.zeros_like(state)  # (B, H, seen, D)
        else:  # back through K_{m+1} = [K_m - (K_m Y^T) W; k~_m]
            w_m, y_m, d_carried = chunks.w[:, :, rows], chunks.y[:, :, rows], d_state[..., :seen, :]
            along = d_carried @ w_m.transpose(-1, -2)  # dK W^T: (B, H, seen, C)
            d_earlier = d_carried - along @ y_m
            d_y[:, :, rows] = -(along.transpose(-1, -2) @ state)
            d_w[:, :, rows] = -((state @ y_m.transpose(-1, -2)).transpose(-1, -2) @ d_carried)
            d_keys[:, :, rows] = d_state[..., seen:, :]
        probs = step.probabilities(step.scores(state, m), lse[:, :, rows])  # P: (B, H, C, seen + C)
        d_out_m, probs_op = d_out[:, :, rows], probs.to(operand)  # (B, H, C, Dv)
        values = step.values[:, :, : probs.shape[-1]]
        d_values[:, :, : probs.shape[-1]] += probs_op.transpose(-1, -2) @ d_out_m
        d_scores = (d_out_m @ values.transpose(-1, -2)).to(probs.dtype)  # dP: (B, H, C, seen + C)
        d_scores.sub_(delta[:, :, rows, None]).mul_(probs)  # dS
        if d_cum is not None:  # dc_j = -sum_i dS_ij (the rows' own sum_j dS_ij is 0)
            d_cum[..., : probs.shape[-1]] -= d_scores.sum(-2)
        # S = (q~ / sqrt(d)) K^T: dK = dS^T (q~ / sqrt(d)), dq~ = (dS K) / sqrt(d), d(local) = dS / sqrt(d)
        d_prior = d_scores[..., :seen].to(operand)  # (B, H, C, seen)
        d_queries[:, :, rows] = (d_prior @ state.to(operand)).mul_(step.scale)
        d_earlier += d_prior.transpose(-1, -2) @ step.queries[:, :, rows]
        d_local[:, :, m] = d_scores[..., seen:] * step.scale
        d_state = d_earlier
    d_before = d_state if d_state is not None else torch.zeros_like(states[0])
    return d_queries, d_keys, d_local, d_w, d_y, d_values.to(step.values.dtype), d_before, d_cum


class PathAttention(torch.autograd.Function):
    """`path_forward` with `path_backward`: apply(size, scale, q~, k~, local, W, Y, values, state before,
    cum) -> the output (B, H, M C, Dv)."""

    # tokens per chunk (the UT transform's block and the query rows of one step; the reference's is 64): by
    # the chunk rule of bench section 7 (`posab.bench.chunks`), measured there with the chunked core's kernels
    chunk = 32

    @staticmethod
    def forward(
        ctx: Any,
        size: int,
        scale: float,
        queries: Tensor,
        keys: Tensor,
        local: Tensor,
        w: Tensor,
        y: Tensor,
        values: Tensor,
        before: Tensor,
        cum: Tensor | None,
    ) -> Tensor:
        step = Step(Chunks(queries, keys, local, w, y, size), values, cum, before.shape[-2], scale)
        out, lse, states, _ = path_forward(step, before, keep=True)
        ctx.step, ctx.states = step, states
        ctx.save_for_backward(out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, d_out: Tensor) -> tuple[Tensor | None, ...]:
        out, lse = ctx.saved_tensors
        grads = path_backward(ctx.step, ctx.states, out, lse, d_out.to(out.dtype))
        return None, None, *grads


def path_attention(
    q: Tensor, k: Tensor, v: Tensor, w: Tensor, beta: Tensor, cum: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """PaTH attention of c queries (B, H, c, D), the last c of the n keys k (B, H, n, D), whose first
    n0 = n - c are already transformed through the queries' first token (a cache's), with w (B, H, c, D)
    unit vectors, beta (B, H, c) and cum (B, H, n) or None: the output (B, H, c, Dv) in v's dtype, and the
    keys transformed through the last token (B, H, n, D) when no gradient is taken, else None."""
    dtype, tokens = compute_dtype(q), q.shape[-2]
    before = k.shape[-2] - tokens
    size = chunk_size(tokens)
    with without_autocast(q.device):
        q32, k32, w32, beta32 = (t.to(dtype) for t in (q, k, w, beta))
        chunks = ut_chunks(q32, k32[:, :, before:], w32, beta32, size)
        pad = chunks.count * size - tokens
        values = padded(v, pad, tokens=-2)  # (B, H, n0 + M C, Dv) in the operand dtype, v's
        gates = None if cum is None else padded(cum.to(dtype), pad, tokens=-1)  # (B, H, n0 + M C)
        prior = k32[:, :, :before]  # (B, H, n0, D)
        scale = 1.0 / math.sqrt(q.shape[-1])
        differentiable = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (q, k, v, w, beta, cum)
        )
        if differentiable:
            parts = (chunks.queries, chunks.keys, chunks.local, chunks.w, chunks.y, values, prior, gates)
            out = PathAttention.apply(size, scale, *parts)
            return out[:, :, :tokens].to(v.dtype), None
        step = Step(chunks, values, gates, before, scale)
        out, _, _, final = path_forward(step, prior, keep=False)
        return out[:, :, :tokens].to(v.dtype), final[:, :, : before + tokens]


def carried_keys(k: Tensor, w: Tensor, beta: Tensor) -> Tensor:
    """Every key of a window (B, H, L, D) carried through every later transform, H_{L-1} ... H_{j+1} k_j:
    the state after the window's last token (the keys a next token's query would read), (B, H, L, D)."""
    tokens = k.shape[-2]
    chunks = ut_chunks(k, k, w, beta, chunk_size(tokens))
    step = Step(chunks, k.new_empty(0), None, 0, 1.0)
    state = k[:, :, :0]  # (B, H, 0, D)
    for m in range(chunks.count):
        state = step.advance(state, m)
    return state[:, :, :tokens]


def explicit_logits(q: Tensor, k: Tensor, w: Tensor, beta: Tensor) -> Tensor:
    """The definition, for the tests: q_i^T (H_i ... H_{j+1}) k_j for every pair (-inf for j > i), each
    product of (D, D) matrices formed explicitly, in q's dtype: (B, H, L, L). O(L^2 D^3): short windows."""
    batch, heads, length, dim = q.shape
    eye = torch.eye(dim, dtype=q.dtype)
    transforms = eye - beta[..., None, None] * w[..., :, None] * w[..., None, :]  # H_s: (B, H, L, D, D)
    logits = torch.full((batch, heads, length, length), float("-inf"), dtype=q.dtype)
    for i in range(length):
        product = eye.expand(batch, heads, dim, dim)
        for j in range(i, -1, -1):  # product = H_i ... H_{j+1}
            logits[:, :, i, j] = (q[:, :, i, None, :] @ product @ k[:, :, j, :, None])[..., 0, 0]
            product = product @ transforms[:, :, j]
    return logits


@dataclass(eq=False)
class PathForm(Form):
    """PaTH attention of one layer: `w` (B, H, c, D) unit vectors and `beta` (B, H, c) of the pass's c new
    tokens, `cum` (B, H, n) the cumulative log forget gates of every key (PaTH-FoX) or None. With `rewrite`
    (a decoding step), `attend` writes the keys it was given, the cache's, back transformed through the
    step's last token, so that the next step finds them as its own first n0 keys."""

    w: Tensor
    beta: Tensor
    cum: Tensor | None = None
    rewrite: bool = False
    _rows: dict[str, Any] = field(default_factory=dict)  # `scores`' running state over its row chunks

    def attend(self, q: Tensor, k: Tensor, v: Tensor, dropout: float = 0.0, backend: str = "sdpa") -> Tensor:
        if dropout:
            raise ValueError(
                f"attention dropout {dropout}: PaTH attention has none (its kernel forms no dropout mask); "
                "use model.dropout=0.0"
            )
        out, final = path_attention(q, k, v, self.w, self.beta, self.cum)
        if self.rewrite:
            if final is None:
                raise RuntimeError("a PaTH decoding step rewrites its cache: run it without gradients")
            k.copy_(final)
        return out

    def content_statistics(
        self, q: Tensor, k: Tensor, trained: dict[str, Tensor] | None = None
    ) -> dict[str, Tensor]:
        """For the extrapolation audit, per head over the batch, (H,) each: `path_beta` the mean beta,
        `path_kept_far` the share of a key's norm that reaches the window's last query from its first
        FAR_KEYS keys (the product of every later transform, |H ... H k_j| / |k_j|: 1 for untouched keys,
        below 1 as the transforms project keys away) and `path_turn_far` the cosine between those keys and
        themselves carried so far (1: not turned). PaTH-FoX adds FoX's `gate_log` and `gate_bias_far`."""
        with torch.no_grad():
            dtype = compute_dtype(q)
            carried = carried_keys(k.to(dtype), self.w.to(dtype), self.beta.to(dtype))[:, :, :FAR_KEYS]
            first = k[:, :, :FAR_KEYS].to(dtype)  # (B, H, f, D)
            kept = carried.norm(dim=-1) / first.norm(dim=-1).clamp_min(1e-12)  # (B, H, f)
            turn = F.cosine_similarity(carried, first, dim=-1)  # (B, H, f)
            found = {
                "path_beta": self.beta.mean((0, 2)),
                "path_kept_far": kept.mean((0, 2)),
                "path_turn_far": turn.mean((0, 2)),
            }
            if self.cum is not None:  # FoX's own statistics of the same gate sums
                found.update(Forgetting(self.cum, q.shape[-2]).content_statistics(q, k))
        return found

    def scores(self, q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
        """Scores of query rows start:end over the keys they see, -inf past each query: (B, H, end - start,
        n - c + end), from one pass over the chunks up to row `end`. The pass is kept, so a caller that walks
        the rows in order (the attention analysis, by QUERY_CHUNK rows) continues it where it stopped."""
        inputs = (q.data_ptr(), k.data_ptr(), tuple(q.shape), tuple(k.shape))
        with torch.no_grad(), without_autocast(q.device):
            run = self._rows.get("run") if self._rows.get("inputs") == inputs else None
            rows = None if run is None else run.rows(start, end)
            if rows is None:
                dtype = compute_dtype(q)
                run = ScoreRun.begin(q.to(dtype), k.to(dtype), self.w, self.beta, self.cum)
                self._rows.update(run=run, inputs=inputs)
                rows = run.rows(start, end)
        assert rows is not None  # a pass from the first chunk serves every row
        return rows[..., : k.shape[-2] - q.shape[-2] + end]


@dataclass
class ScoreRun:
    """A pass over the chunks that keeps the masked scores of the chunks last asked for, each padded with
    -inf to every key of the pass."""

    step: Step
    state: Tensor  # K_done: (B, H, n0 + done C, D)
    done: int = 0  # the chunks passed
    kept: list[Tensor] = field(default_factory=list)  # the scores of chunks done - len(kept) .. done - 1

    @classmethod
    def begin(cls, q: Tensor, k: Tensor, w: Tensor, beta: Tensor, cum: Tensor | None) -> ScoreRun:
        dtype, tokens = q.dtype, q.shape[-2]
        before, size = k.shape[-2] - tokens, chunk_size(tokens)
        chunks = ut_chunks(q, k[:, :, before:], w.to(dtype), beta.to(dtype), size)
        pad = chunks.count * size - tokens
        gates = None if cum is None else padded(cum.to(dtype), pad, tokens=-1)
        step = Step(chunks, k.new_empty(0), gates, before, 1.0 / math.sqrt(q.shape[-1]))
        return cls(step, k[:, :, :before])

    def rows(self, start: int, end: int) -> Tensor | None:
        """Rows start:end of the scores over all n0 + M C keys (B, H, end - start, n0 + M C), or None when
        they lie before the chunks kept (a new pass must serve them)."""
        size = self.step.chunks.size
        first, last = start // size, math.ceil(end / size)
        kept_from = self.done - len(self.kept)
        if first < kept_from:
            return None
        self.kept = self.kept[first - kept_from :] if first <= self.done else []
        width = self.step.before + self.step.chunks.count * size
        while self.done < last:
            if self.done >= first:
                scores = self.step.mask(self.step.scores(self.state, self.done))  # (B, H, C, seen + C)
                self.kept.append(F.pad(scores, (0, width - scores.shape[-1]), value=float("-inf")))
            self.state = self.step.advance(self.state, self.done)
            self.done += 1
        rows = torch.cat(self.kept[: last - first], dim=-2)  # (B, H, (last - first) C, width)
        return rows[:, :, start - first * size : end - first * size]
