"""DAPE (Zheng et al., 2024, "DAPE: Data-Adaptive Positional Encoding for Length Extrapolation", NeurIPS):
the fourth form of the design note's section 3.3, a function of q, k and i - j together.

Each layer's attention scores are

    S = A + B + f([A; B]),   A = q k^T / sqrt(d) (B, H, L, L),   B = b_h(i - j) (1, H, L, L),

where B is the base encoding's additive bias (ALiBi or the multi-scale bias here, as the paper builds on
its baselines) and f is a small MLP across heads applied at every (i, j): Linear(2H, width), LeakyReLU,
Linear(width, H). This is the reference code's parametrisation (github.com/chuanyang-Zheng/DAPE, DAPE.py,
`AliBi_DAPE`: `mlp2 = Sequential(Linear(2 * num_heads, mlp_width), LeakyReLU(), Linear(mlp_width,
num_heads))`, `mlp_width` 32, PyTorch's default Linear initialisation, and `x + a + mlp2(cat(x, a))` on the
scaled logits x before the causal mask), with one MLP per attention layer (megatron/model/transformer.py
builds the position module inside each layer's attention). Future keys (j > i) are masked after f, so f
only sees the logits and the bias of the pairs it scores: the bias there is 0, as in the reference's tril.

The model never forms f on all (B, H, L, L) pairs at once: `dape_kernel.mixed_attention` runs f over
query chunks and the keys they see (causality skips the rest), and recomputes it in the backward pass.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posab.cache import LayerCache
from posab.encodings.base import BIAS_KINDS, Dims, Kind, Wrapping
from posab.encodings.dape_kernel import Mixed
from posab.errors import ConfigError
from posab.forms import Form

LEAKY_SLOPE = 0.01  # nn.LeakyReLU's default, as the reference code uses it


class ScoreMixer(nn.Module):
    """f([A; B]): an MLP across heads at every (query, key) pair, 2H -> width -> H."""

    def __init__(self, n_heads: int, width: int) -> None:
        super().__init__()
        self.n_heads, self.slope = n_heads, LEAKY_SLOPE
        self.first = nn.Linear(2 * n_heads, width)
        self.second = nn.Linear(width, n_heads)

    def forward(self, logits: Tensor, bias: Tensor) -> Tensor:
        """logits (B, H, c, n), bias (1|B, H, c, n) -> A + B + f([A; B]): (B, H, c, n), channels last as
        the reference code computes it (the all-pairs reference; the model runs `mixed_attention`)."""
        pair = torch.cat([logits, bias.expand_as(logits)], dim=1).permute(0, 2, 3, 1)  # (B, c, n, 2H)
        hidden = F.leaky_relu(self.first(pair), self.slope)  # (B, c, n, width)
        return logits + bias + self.second(hidden).permute(0, 3, 1, 2)  # (B, c, n, H) -> (B, H, c, n)


class DAPE(Wrapping):
    kind = Kind.CONTENT  # a function of the logits and the base's bias at every pair

    def __init__(self, dims: Dims, base: dict[str, Any], width: int = 32) -> None:
        from posab.encodings import build_encoding  # the package builds encodings; it imports this module

        if isinstance(width, bool) or width < 1:
            raise ConfigError(
                f"dape width={width!r}: use the MLP's hidden width, an integer >= 1 (paper: 32)"
            )
        if "_target_" not in base:
            raise ConfigError(f"dape base={base!r}: name the base encoding's _target_ (ALiBi, MultiScale)")
        built = build_encoding(base, dims)
        if built.kind not in BIAS_KINDS:
            raise ConfigError(
                f"dape base {base['_target_']!r} is a {built.kind} encoding: it acts {built.kind.acts}; DAPE "
                "builds on an additive bias shared by the batch (kinds distance-bias, dense-bias): ALiBi, "
                "T5, FIRE, KERPLE or multiscale with form=additive"
            )
        if dims.window is not None:
            raise ConfigError(
                f"model.window={dims.window}: DAPE's function of the logits and the bias has no sliding "
                "window here (the reference has none); use model.window=null"
            )
        super().__init__(dims, built)
        self.mixers = nn.ModuleList(ScoreMixer(dims.n_heads, width) for _ in range(dims.n_layers))

    def layer_form(
        self, form: Form, layer: int, x: Tensor | None = None, cache: LayerCache | None = None
    ) -> Mixed:
        """Layer `layer`'s function of the logits and the base's bias (`dape_kernel.Mixed`)."""
        return Mixed(form, self.mixers[layer])  # type: ignore[arg-type]  # an Additive (BIAS_KINDS)
