"""Stick-breaking attention (Tan et al., ICLR 2025, "Scaling Stick-Breaking Attention: An Efficient
Implementation and In-depth Study", arXiv 2410.17980): no positional encoding; the softmax is replaced.

Each query i breaks a stick over the keys before it, nearest first: key j takes the share
beta_ij = sigmoid(q_i . k_j / sqrt(d)) of what the nearer keys left,

    A_ij = beta_ij prod_{j<m<i} (1 - beta_im)      (computed in log space),

and what no key took, 1 - sum_j A_ij, goes to the current token's value, as the reference does
(github.com/shawntan/stickbreaking-attention: sb_ref.py `stickbreaking`, tests/test_attn.py `ref_fwd`,
`attend_current=False`, the default of `sb_attn`). Order enters through the stick alone (a recency bias
the content can override), so the outputs depend on positions only through the causal order: the
encoding is relative. The form and its chunked kernel: `posab.encodings.stickbreaking_kernel`.

The paper's own models (IBM/dolomite-engine, sequence_mixer_blocks/stickbreaking_attention.py
`SBAttention`) send the remainder to a learned per-head vector instead and add a GroupNorm over the heads;
that is a change to the layer, not the attention, and is not built here.
"""

import torch

from posab.encodings.base import Dims, Encoding, Kind, Positions
from posab.encodings.stickbreaking_kernel import StickBreakingForm
from posab.errors import ConfigError
from posab.forms import Form


class StickBreaking(Encoding):
    kind = Kind.SOFTMAX_REPLACEMENT
    relative_only = True
    static_form = True

    def __init__(self, dims: Dims) -> None:
        super().__init__(dims)
        if dims.window is not None:
            raise ConfigError(
                f"model.window={dims.window}: stick-breaking attention has no sliding window here (the "
                "reference has none); use model.window=null"
            )

    def attention_form(self, pos: Positions, queries: int, dtype: torch.dtype) -> Form:
        return StickBreakingForm()
