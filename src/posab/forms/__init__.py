"""Attention forms: how position enters a layer's attention, each form owning its math (forms.base).

- `Causal` (none): NoPE, and the rotary and absolute encodings, whose work is in `embed` and `rotate`;
- `Additive` (by distance, or dense when the bias depends on the query too): ALiBi, T5, KERPLE, FIRE,
  the multi-scale bias;
- `LowRank` (per sample, low rank, beside a shared bias): the hierarchical bias's structural levels;
- `Scaled` (multiplicative on the logits): the multi-scale bias's form (2);
- `PerLayer` (another form per layer, which `Encoding.layer_form` picks; not attended with itself): the
  NoPE/RoPE hybrids;
- an encoding's own form lives beside it and extends `Form` (FoX's `Forgetting`, CoPE's `Counted`, DAPE's
  `Mixed`, stick-breaking's `StickBreakingForm`, SWAN's `QueryScaled`).
"""

from posab.forms.additive import Additive, block_toeplitz
from posab.forms.base import (
    QUERY_CHUNK,
    AttentionInputs,
    Form,
    PerLayer,
    block_causal,
    causal_mask,
    compute_dtype,
    without_autocast,
)
from posab.forms.causal import Causal
from posab.forms.lowrank import BiasFactors, LowRank, full_mask
from posab.forms.scaled import Scaled

__all__ = [
    "QUERY_CHUNK",
    "Additive",
    "AttentionInputs",
    "BiasFactors",
    "Causal",
    "Form",
    "PerLayer",
    "LowRank",
    "Scaled",
    "block_causal",
    "block_toeplitz",
    "causal_mask",
    "compute_dtype",
    "full_mask",
    "without_autocast",
]
