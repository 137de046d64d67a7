"""CoPE, contextual position encoding (Golovneva et al., 2024, "Contextual Position Encoding: Learning to
Count What's Important", arXiv 2405.18719): a position is a count of the keys the query's gates select.

In each layer, for query i and key j <= i (head dimension D),

    g_ij = sigmoid(q_i . k_j / sqrt(D))         the gate: does key j count for query i?
    p_ij = min(sum_{t=j..i} g_it, npos - 1)      the contextual position of key j seen from query i
    z_ij = (1 - w) q_i . e[floor p_ij] + w q_i . e[ceil p_ij],   w = p_ij - floor(p_ij)   (q_i . e[p_ij])
    S_ij = (q_i . k_j + z_ij) / sqrt(D),        softmax over j <= i

with e[0 .. npos - 1] learned position embeddings of size D, shared by the heads of a layer, one table per
layer, initialised to zero (so a fresh model is NoPE). This is the reference code's default
(github.com/facebookresearch/RAM, projects/cope/src/cope/context_position.py, `ContextPosSelfAttn`: the
gates from the same q . k as the attention, divided by sqrt(head_dim) (always); the position logits added
before the division (`--cope-nodiv` off: `attn_logits += pos_logits; attn_logits /= sqrt(head_dim)`); the
gates masked by the causal mask, which includes the diagonal, so p_ii = g_ii; the reverse cumulative sum
`gates.flip(-1).cumsum(-1).flip(-1)`; `positions.clamp(max=npos - 1)`; `pos_emb = zeros(1, head_dim,
npos)` per layer, `--cope-shared` off). `scale_positions=false` is its `--cope-nodiv`, S = q.k / sqrt(D) + z,
the placement of x-transformers' `CoPE` (lucidrains/x-transformers, which cites the paper's appendix B: the
position logits added to the already scaled logits; its `cope_max_pos` defaults to 16).

npos. The reference's default is `block_size + 1` ("need 1 extra position because position 0 is
possible"), block_size the training context length: here npos = train_len + 1 (513 in the study, 129 in
the tiny preset). In training a count never reaches the clamp: p_ij <= i - j + 1 <= train_len = npos - 1.
Past the training length it can: a row i >= train_len with more than train_len counted keys reads e[npos -
1] for every key j whose count passes it. e[t] is trained only by counts in (t - 1, t + 1), so that row,
and every row above the largest count training produced (the gates start near 1/2, so counts start near
half the distance), are still at their zero initialisation (no weight decay): a key counted past them gets
the position logit 0, as under NoPE. The extrapolation question for CoPE is how far the counts of a longer
context spread past those seen in training and how many saturate (`Counted.position_counts`, the
extrapolation audit's `cope_*` statistics). Heads whose gates count rarely (sentence-like units) keep their
counts small at any length; heads that count every token (g ~ 1) behave like a learned relative position
whose table ends, at zero, at the training length.

CoPE's outputs never read the token positions: `relative_only` (the shift test: a common offset changes
nothing, exactly). Cost: the scores are explicit (sigmoid, reverse cumsum and two gathers per pair), by
query chunks with every key of the chunk's rows (`cope_kernel`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from posab.cache import LayerCache
from posab.encodings.base import Dims, Encoding, Kind
from posab.encodings.cope_kernel import Counted
from posab.errors import ConfigError
from posab.forms import Form


class CoPE(Encoding):
    kind = Kind.CONTENT
    relative_only = True  # positions are counts of keys: no token position enters
    static_form = True  # the pass's form is plain causal attention; the layers' forms carry the tables

    def __init__(self, dims: Dims, npos: int | None = None, scale_positions: bool = True) -> None:
        super().__init__(dims)
        self.npos = dims.train_len + 1 if npos is None else npos
        if self.npos < 1:
            raise ConfigError(
                f"cope npos={npos!r}: use the number of integer positions, >= 1, or null for the training "
                f"length + 1 ({dims.train_len + 1}, the reference's block_size + 1)"
            )
        if dims.window is not None:
            raise ConfigError(
                f"model.window={dims.window}: CoPE counts over every key a query sees and has no sliding "
                "window here (the reference has none); use model.window=null"
            )
        self.scale = 1.0 / math.sqrt(dims.head_dim) if scale_positions else 1.0
        self.table = nn.Parameter(torch.zeros(dims.n_layers, self.npos, dims.head_dim))  # (layers, npos, D)

    def layer_form(
        self, form: Form, layer: int, x: Tensor | None = None, cache: LayerCache | None = None
    ) -> Counted:
        """Layer `layer`'s CoPE form over its own table (the pass's causal `form` is implied by it)."""
        return Counted(self.table[layer], self.scale)

    @classmethod
    def same_in_training(cls, setting: str, before: Any, after: Any, train_len: int) -> bool:
        """npos null is train_len + 1: the two spell the same table."""
        if setting != "npos":
            return False
        return (train_len + 1 if before is None else before) == (train_len + 1 if after is None else after)
