"""FoX, the forgetting transformer (Lin et al., 2025, "Forgetting Transformer: Softmax Attention with a
Forget Gate", ICLR; arXiv 2503.02130), in its basic form "FoX (LLaMA)": no RoPE, no other positional
encoding, a scalar forget gate per head and token added to causal softmax attention as a decay bias.

Each layer l and head h computes, from the layer's attention input x_t (its normalised residual stream, the
input its q, k and v are projected from),

    f_t = sigmoid(w_h^T x_t + b_h),   c_i = sum_{t <= i} log f_t,   D_ij = c_i - c_j = sum_{t=j+1..i} log f_t,

and attends with softmax(q k^T / sqrt(d) + D + causal) V (the paper's Forgetting Attention; reference code,
github.com/zhixuan-lin/forgetting-transformer, src/forgetting_transformer/: ops/forgetting_attention.py's
plain-PyTorch reference in `test_op`, `log_lambda = cumsum(log_fgate)` and `decay_bias =
log_lambda[..., -M:, None] - log_lambda[..., None, :]` added to the scaled logits before the causal mask;
model/forgetting_transformer/modeling_forgetting_transformer.py, `ForgettingAttentionLayer` with
`fgate_type="full"`: `fgate_proj = nn.Linear(hidden_size, num_heads, bias=True)` on the hidden states
after the block's `attn_norm`, the ones q, k and v are projected from, `log_fgate =
logsigmoid(fgate_logit.float())`, and the projection initialised as every Linear there, weight
N(0, initializer_range = 0.02) and bias 0, so every gate starts near 1/2). One gate projection per layer.

x-transformers' `DataDependentAlibi` (github.com/lucidrains/x-transformers, x_transformers.py) is the same
bias with the projection at PyTorch's default Linear initialisation and its bias at 5 (gates start near
sigmoid(5) = 0.993, a slow decay): `gate_bias_init=5.0 gate_weight_std=null`.

D depends on the content between j and i, not on the positions: a common offset leaves every output
unchanged (`relative_only`), and there is no bias by distance (`distance_bias` is None): the extrapolation
audit reads what the gates make of a window instead (each layer form's `content_statistics`; the whole
mean decay by distance: `gate_curve`). In cached decoding each layer's cache keeps c of its keys (B, H, n)
and a step continues the sum from the last one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posab.cache import EncodingState, LayerCache
from posab.encodings.base import INIT_STD, Dims, Encoding, Kind, Positions
from posab.encodings.fox_kernel import Forgetting, ForgettingPass
from posab.errors import ConfigError
from posab.forms import Form, compute_dtype
from posab.forms.chunked import Workspace


@dataclass
class GateSums(EncodingState):
    """FoX's decoding state of one layer: c, the running sum of the log forget gates of every cached key."""

    cum: Tensor | None = None  # (B, H, n)


class FoX(Encoding):
    kind = Kind.CONTENT
    relative_only = True  # D_ij reads the gates of tokens j+1..i, never a position

    def __init__(
        self, dims: Dims, gate_bias_init: float = 0.0, gate_weight_std: float | None = INIT_STD
    ) -> None:
        super().__init__(dims)
        if gate_weight_std is not None and gate_weight_std < 0:
            raise ConfigError(
                f"fox gate_weight_std={gate_weight_std!r}: use a standard deviation >= 0 (FoX: 0.02) or null "
                "(PyTorch's default Linear initialisation, as x-transformers' DataDependentAlibi)"
            )
        self.gates = nn.ModuleList(nn.Linear(dims.d_model, dims.n_heads) for _ in range(dims.n_layers))
        with torch.no_grad():
            for gate in self.gates:
                if gate_weight_std is not None:
                    nn.init.normal_(gate.weight, std=gate_weight_std)
                nn.init.constant_(gate.bias, gate_bias_init)

    def attention_form(self, pos: Positions, queries: int, dtype: torch.dtype) -> ForgettingPass:
        """Causal attention, and the buffer the layers' CPU forward passes share (a `Workspace`)."""
        return ForgettingPass(self.dims.window)

    def log_gates(self, layer: int, x: Tensor) -> Tensor:
        """log f of layer `layer`'s heads from its attention input x (B, c, C): (B, H, c), in float32 (float64
        for float64 x) whatever the projection's dtype, as the reference's logsigmoid(logit.float())."""
        logit = self.gates[layer](x)  # (B, c, H)
        return F.logsigmoid(logit.to(compute_dtype(logit))).transpose(1, 2)  # (B, c, H) -> (B, H, c)

    def layer_form(
        self, form: Form, layer: int, x: Tensor | None = None, cache: LayerCache | None = None
    ) -> Forgetting:
        """Layer `layer`'s decay bias over every key: c of the new tokens, after the cached keys' c (the
        layer's `GateSums` keeps c of every key so far, (B, H, n), and is extended here)."""
        if x is None:
            raise ValueError("FoX's forget gates read the layer's attention input: pass x to layer_form")
        cum = torch.cumsum(self.log_gates(layer, x), dim=-1)  # (B, H, c)
        if cache is not None:
            sums = cache.state_for(GateSums)
            if sums.cum is not None:
                cum = torch.cat([sums.cum, cum + sums.cum[..., -1:]], dim=-1)  # (B, H, n)
            sums.cum = cum
        scratch = form.scratch if isinstance(form, ForgettingPass) else Workspace()
        return Forgetting(cum, x.shape[1], self.dims.window, scratch)

    @torch.no_grad()
    def gate_curve(self, inputs: Sequence[Tensor]) -> Tensor:
        """The decay the gates give by distance, for the extrapolation audit: `inputs` every layer's attention
        input x (B, L, C), in layer order -> (layers, H, L) the mean of D_ij = c_i - c_j (<= 0) over the
        pairs at distance d = i - j and over the batch, d = 0 .. L - 1 (the sign of `distance_bias`)."""
        return torch.stack(
            [
                mean_by_distance(torch.cumsum(self.log_gates(layer, x), dim=-1))
                for layer, x in enumerate(inputs)
            ]
        )


def mean_by_distance(cum: Tensor) -> Tensor:
    """c (B, H, L) -> (H, L): the mean of c_i - c_{i-d} over i = d .. L-1 and the batch, from prefix sums
    P_k = sum_{i<k} c_i: (P_L - P_d - P_{L-d}) / (L - d), in float64 (P grows as L^2)."""
    length = cum.shape[-1]
    prefix = F.pad(torch.cumsum(cum.double(), dim=-1), (1, 0))  # (B, H, L + 1): P_0 .. P_L
    d = torch.arange(length, device=cum.device)  # (L,)
    later = prefix[..., -1:] - prefix[..., d]  # sum_{i=d}^{L-1} c_i: (B, H, L)
    earlier = prefix[..., length - d]  # sum_{i=0}^{L-1-d} c_i: (B, H, L)
    return ((later - earlier) / (length - d)).mean(0).to(cum.dtype)  # (H, L)
