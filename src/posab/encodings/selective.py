"""Selective attention (Leviathan, Kalman and Matias, 2024, "Selective Attention Improves Transformer",
arXiv:2410.02703, section 3; x-transformers' `selective_attn`): a parameter-free bias by which a token
keeps later tokens from attending to earlier ones. Head 0's logits give every query's selection of each
earlier key, relu(A0_kj); a query i sees every head's logits minus the selections its earlier queries
k < i made of key j, M_ij = sum_{k=j+1..i-1} relu(A0_kj), the first key never selected away (the paper's
and the reference's BOS). The reference's own function reads the logits before the causal mask; posab
reads them as the paper defines them, masked (a query selects only keys before it), and unlike the
reference (`can_cache_kv = not selective`) caches: each layer's `Selections` keeps the selections so far.

No position otherwise: order reaches the model through causality and the selections, as NoPE's. The form
is `selective_kernel.Selected`; no sliding window (the paper has none).
"""

from torch import Tensor

from posab.cache import LayerCache
from posab.encodings.base import Dims, Encoding, Kind
from posab.encodings.selective_kernel import Selected, Selections
from posab.errors import ConfigError
from posab.forms import Form


class Selective(Encoding):
    kind = Kind.CONTENT  # a bias from head 0's logits, per layer
    relative_only = True  # the selections read logits and causality, never a position

    def __init__(self, dims: Dims) -> None:
        super().__init__(dims)
        if dims.window is not None:
            raise ConfigError(
                f"model.window={dims.window}: selective attention has no sliding window here (the paper has "
                "none); use model.window=null"
            )

    def layer_form(
        self, form: Form, layer: int, x: Tensor | None = None, cache: LayerCache | None = None
    ) -> Selected:
        """Layer `layer`'s selective attention, after the selections its cache keeps (`Selections`)."""
        if cache is None:
            return Selected()
        state = cache.state_for(Selections)
        return Selected(state.carried, state)
