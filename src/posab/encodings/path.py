"""PaTH attention (Yang, Shen, Wen, Tan, Mishra, Ren, Panda and Kim, 2025, "PaTH Attention: Position
Encoding via Accumulating Householder Transformations", NeurIPS; arXiv 2505.16381), and PaTH-FoX, the same
with FoX's forget gate.

The logit of query i and key j is q_i^T (H_i ... H_{j+1}) k_j / sqrt(d), with one Householder-like
transform per token, H_s = I - beta_s w_s w_s^T, computed from the token at s: a position that is a product
of data-dependent transforms between the key and the query (RoPE's is a fixed rotation per step). Per layer
and head, from the layer's attention input x (its normalised residual stream, the input of q, k and v), as
the reference layer (fla-org/flash-linear-attention, fla/layers/path_attn.py, `PaTHAttention`):
- w_s = l2norm(silu(conv_3(W_up W_down x)))_h: a rank-32 projection to every head's d channels (the
  reference's low rank for multi-head attention), a causal depthwise convolution over 3 tokens without bias
  and SiLU (its `ShortConvolution(kv_dim, 3)`, activation silu), normalised per head;
- beta_s = 2 sigmoid(u_h^T x_s + b_h) in (0, 2) (eigenvalue 1 - beta along w: negative ones allowed),
  computed in float32 and kept in [0, 2] (`path_kernel`: a transform must never expand);
- PaTH-FoX (`forget_gate=true`): FoX's gate, log f_s = logsigmoid(g_h^T x_s + b_h), and D_ij = c_i - c_j
  added to the logits, unscaled, as posab's FoX (the reference's kernel multiplies qk + D by 1/sqrt(d)
  together; posab keeps FoX's own form so that PaTH-FoX is PaTH plus FoX exactly).
Initialisation: the reference model's, every Linear weight N(0, 0.02) and bias 0 (so beta starts at 1);
the convolution at PyTorch's default.

No position is read: a common offset changes nothing (`relative_only`). In cached decoding each new token's
transform rewrites every cached key (`PathForm` with `rewrite`), the convolution keeps its last inputs and
PaTH-FoX its gate sums (`PathState`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posab.cache import EncodingState, LayerCache
from posab.encodings.base import INIT_STD, Dims, Encoding, Kind
from posab.encodings.path_kernel import PathForm
from posab.errors import ConfigError
from posab.forms import Form, compute_dtype

W_RANK = 32  # the reference's low-rank w projection for multi-head attention (nn.Linear(hidden, 32))
W_CONV = 3  # the reference's short convolution of w: ShortConvolution(kv_dim, 3)


@dataclass
class PathState(EncodingState):
    """PaTH's decoding state of one layer, beside its rewritten keys: the convolution's last inputs and,
    for PaTH-FoX, the gate sums of every cached key."""

    recent: Tensor | None = None  # (B, W_CONV - 1, H D): the last projections the convolution reads
    cum: Tensor | None = None  # (B, H, n), float64


class PathLayer(nn.Module):
    """One layer's projections: w (low rank, convolved, normalised per head), beta and the forget gate."""

    def __init__(self, dims: Dims, forget_gate: bool) -> None:
        super().__init__()
        width = dims.n_heads * dims.head_dim
        self.w_down = nn.Linear(dims.d_model, W_RANK, bias=False)
        self.w_up = nn.Linear(W_RANK, width, bias=False)
        self.w_conv = nn.Conv1d(width, width, W_CONV, groups=width, bias=False)
        self.beta = nn.Linear(dims.d_model, dims.n_heads)
        self.gate = nn.Linear(dims.d_model, dims.n_heads) if forget_gate else None
        with torch.no_grad():
            for linear in (self.w_down, self.w_up, self.beta, self.gate):
                if linear is not None:
                    nn.init.normal_(linear.weight, std=INIT_STD)
                    if linear.bias is not None:
                        nn.init.zeros_(linear.bias)


class PaTH(Encoding):
    kind = Kind.CONTENT  # a product of transforms computed from the tokens between key and query
    relative_only = True  # no position is read

    def __init__(self, dims: Dims, forget_gate: bool = False) -> None:
        super().__init__(dims)
        if dims.window is not None:
            raise ConfigError(
                f"model.window={dims.window}: PaTH attention has no sliding window here (the paper has "
                "none); use model.window=null"
            )
        self.forget_gate = forget_gate
        self.layers = nn.ModuleList(PathLayer(dims, forget_gate) for _ in range(dims.n_layers))

    def transforms(self, layer: int, x: Tensor, state: PathState | None) -> tuple[Tensor, Tensor]:
        """w (B, H, c, D), unit per head, and beta (B, H, c) in [0, 2] of layer `layer`'s new tokens from
        its attention input x (B, c, C), in the scores' dtype; `state` keeps the convolution's last inputs."""
        projections = self.layers[layer]
        raw = projections.w_up(projections.w_down(x))  # (B, c, H D)
        history = raw.new_zeros(raw.shape[0], W_CONV - 1, raw.shape[2])  # (B, K - 1, H D): zeros at start
        if state is not None and state.recent is not None:
            history = state.recent.to(raw.dtype)
        joined = torch.cat([history, raw], dim=1)  # (B, K - 1 + c, H D)
        if state is not None:
            state.recent = joined[:, -(W_CONV - 1) :]
        mixed = F.silu(projections.w_conv(joined.transpose(1, 2))).transpose(1, 2)  # (B, c, H D)
        dtype = compute_dtype(mixed)
        heads = mixed.reshape(*mixed.shape[:2], self.dims.n_heads, self.dims.head_dim)  # (B, c, H, D)
        w = F.normalize(heads.to(dtype), dim=-1).transpose(1, 2)  # (B, H, c, D)
        logit = projections.beta(x)  # (B, c, H)
        beta = (2.0 * torch.sigmoid(logit.to(dtype))).clamp(0.0, 2.0).transpose(1, 2)  # (B, H, c)
        return w, beta

    def gate_sums(self, layer: int, x: Tensor, state: PathState | None) -> Tensor | None:
        """PaTH-FoX's c of every key (B, H, n), after the cached keys' (`state`), or None without gates."""
        gate = self.layers[layer].gate
        if gate is None:
            return None
        logit = gate(x)  # (B, c, H)
        log_gates = F.logsigmoid(logit.to(compute_dtype(logit))).transpose(1, 2)  # (B, H, c)
        # summed in float64, then rounded: a cached step continues the sum where a full pass recomputes it,
        # and in float32 the two orders differ by c's last digits (|c| ~ 0.7 a token), 1.3e-5 of the logits'
        # scale at 2,048 (FoX's 5.5e-6, docs/performance.md); in float64 both round to the same floats
        cum = torch.cumsum(log_gates.double(), dim=-1)  # (B, H, c)
        if state is not None:
            if state.cum is not None:
                cum = torch.cat([state.cum, cum + state.cum[..., -1:]], dim=-1)  # (B, H, n)
            state.cum = cum
        return cum.to(log_gates.dtype)

    def layer_form(
        self, form: Form, layer: int, x: Tensor | None = None, cache: LayerCache | None = None
    ) -> PathForm:
        """Layer `layer`'s PaTH attention over the pass's new tokens; with a cache, the form rewrites the
        cached keys through the step's tokens as it attends."""
        if x is None:
            raise ValueError("PaTH's transforms read the layer's attention input: pass x to layer_form")
        state = None if cache is None else cache.state_for(PathState)
        w, beta = self.transforms(layer, x, state)
        return PathForm(w, beta, self.gate_sums(layer, x, state), rewrite=cache is not None)
