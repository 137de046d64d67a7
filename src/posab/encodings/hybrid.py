"""NoPE/RoPE hybrids with sliding windows: a different encoding in different layers.

A `pattern` names one kind of layer per entry and repeats over the model's layers (layer l is of kind
`pattern[l % len(pattern)]`; a model with fewer layers than the pattern takes its first entries):

- `nope`: global causal attention, no positional encoding;
- `rope`: global causal attention with RoPE (Su et al., 2021);
- `rope_window`: RoPE in a sliding window: each query sees itself and the `window - 1` keys before it.

References (no reference code was found for either; read through the sources named):
- SWAN-GPT (Puvvada et al., 2025, arXiv:2504.08719; EMNLP 2025): one global NoPE layer, then three
  windowed RoPE layers (SWA-RoPE), repeated, starting with the global layer; window 512 at a training
  length of 1,024 (arXiv v1); at inference the NoPE layers' logits of the query at t are multiplied by
  s_t = log_a(t + a) = ln(t + a) / ln(a), with a a constant fitted after training by minimising the loss on
  long documents. The form as Chen et al. (2026, "Hybrid Linear Attention Done Right", arXiv:2601.22156,
  eq. 11 and appendix A eq. 17, tokens t = 1 .. T) take it from Puvvada et al. for their NoPE attention
  layers (their a: 500, 600 and 900 for 2B, 5B, 9B models, appendix C).
- RNoPE-SWA (Yang et al., 2025, "Rope to Nope and Back Again: A New Hybrid Attention Strategy",
  arXiv:2501.18795): three windowed RoPE layers, then one global NoPE layer, repeated (NoPE:RoPE 1:3, the
  ratio the paper found best), RoPE base 10,000 (its RNoPE-10k; larger bases gained less), window 4,096.

What the sources leave open (read through secondary text: the primary PDF was not readable here): the
value of a, which each model tunes (so `scaling_base` has no default); how SWAN itself counts t (here
as eq. 17 does: t = 1 .. T, the number of keys the query sees, which no offset of the positions changes);
SWAN's RoPE base (here RoPE's default 10,000). Scaling q_t by s_t is scaling its logits by s_t, so the
scaled NoPE layers keep every fused kernel (`QueryScaled`). The scaling acts in evaluation mode only.

The window is an integer or a fraction of the training length (`half`, the study's choice: SWAN's 512 at
1,024); it must be shorter than the training length, where a window would never act in training (the
layers would be global RoPE layers there: use the kind `rope` for that). `model.window` (one window for
every layer) is refused beside a hybrid, which sets each layer's itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from posab.cache import LayerCache
from posab.encodings.base import Dims, Encoding, Kind, Positions
from posab.encodings.rope import RoPE
from posab.errors import ConfigError
from posab.forms import Causal, Form, PerLayer, compute_dtype

KINDS = ("nope", "rope", "rope_window")  # the kinds of layer a pattern names; their forms, in this order
ROTATES = frozenset({"rope", "rope_window"})  # kinds whose q and k RoPE rotates
WINDOWED = frozenset({"rope_window"})  # kinds that attend in the sliding window
FRACTIONS = {"half": 2}  # a window given as a fraction of the training length: train_len // 2
SCALINGS = ("none", "swan")  # the NoPE layers' logits at inference: as trained, or SWAN's log_a(t + a)


def swan_scale(first: int, count: int, base: float, device: torch.device | str) -> Tensor:
    """SWAN's factor s_t = log_a(t + a) for the queries t = first .. first + count - 1, t the number of keys
    each sees (1 for the first token): (count,) float64."""
    t = torch.arange(first, first + count, dtype=torch.float64, device=device)
    return torch.log(t + base) / math.log(base)


@dataclass(eq=False)
class QueryScaled(Form):
    """`inner` with query row r's logits multiplied by `scale[r]`: softmax(s_r q_r k^T / sqrt(D) + mask) V,
    by scaling q (in the scores' dtype, then q's), so every path of `inner` runs as it is."""

    inner: Form
    scale: Tensor  # (c,) the factor of each query row

    def attend(self, q: Tensor, k: Tensor, v: Tensor, dropout: float = 0.0, backend: str = "sdpa") -> Tensor:
        return self.inner.attend(self._scaled(q), k, v, dropout, backend)

    def scores(self, q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
        return self.inner.scores(self._scaled(q), k, start, end)

    def _scaled(self, q: Tensor) -> Tensor:
        """q: (B, H, c, D) -> q_r s_r, (B, H, c, D) in q's dtype."""
        return (q * self.scale.to(q.device, compute_dtype(q))[:, None]).to(q.dtype)  # (c, 1) over rows


def layer_kinds(pattern: list[str], n_layers: int) -> tuple[str, ...]:
    """The kind of each of `n_layers` layers: the pattern repeated (and cut at the last layer)."""
    unknown = [kind for kind in pattern if kind not in KINDS]
    if not pattern or unknown:
        raise ConfigError(
            f"hybrid pattern={pattern!r}: list one kind per layer, each one of {', '.join(KINDS)} "
            f"(e.g. [nope, rope_window, rope_window, rope_window]); unknown: {', '.join(unknown) or 'none'}"
        )
    return tuple(pattern[layer % len(pattern)] for layer in range(n_layers))


def resolve_window(window: int | str, train_len: int) -> int:
    """The window in keys: an integer >= 1, or a fraction of the training length (`FRACTIONS`), below it."""
    if isinstance(window, str) and window in FRACTIONS:
        window = train_len // FRACTIONS[window]
    if isinstance(window, str) or isinstance(window, bool) or not 1 <= window < train_len:
        raise ConfigError(
            f"hybrid window={window!r}: use an integer in [1, {train_len - 1}] or one of "
            f"{', '.join(FRACTIONS)} (of the training length {train_len}); a window as long as the training "
            "length never acts in training: use the kind `rope` for global RoPE layers"
        )
    return window


def check_scaling(scaling: str, base: float | None) -> None:
    """`nope_logit_scaling` is one of SCALINGS; `swan` needs its constant a > 1 (`scaling_base`)."""
    if scaling not in SCALINGS:
        raise ConfigError(f"hybrid nope_logit_scaling={scaling!r}: use one of {', '.join(SCALINGS)}")
    if scaling == "swan" and (base is None or base <= 1):
        raise ConfigError(
            f"hybrid scaling_base={base!r}: SWAN's log_a(t + a) needs a > 1, a constant tuned after "
            "training (the paper fits it to the loss on long documents); give encoding.scaling_base"
        )


class Hybrid(Encoding):
    kind = Kind.PER_LAYER
    """NoPE and RoPE layers, global or in a sliding window, after a repeated `pattern` (module docstring)."""

    relative_only = True  # RoPE is relative, NoPE has no position, windows and SWAN's t count keys

    def __init__(
        self,
        dims: Dims,
        pattern: list[str],
        window: int | str = "half",
        rope_base: float = 10000.0,
        nope_logit_scaling: str = "none",
        scaling_base: float | None = None,
    ) -> None:
        super().__init__(dims)
        if dims.window is not None:
            raise ConfigError(
                f"model.window={dims.window} with a hybrid encoding: the hybrid sets each layer's window "
                "itself (encoding.window, encoding.pattern); leave model.window null"
            )
        self.kinds = layer_kinds(list(pattern), dims.n_layers)
        self.window = resolve_window(window, dims.train_len)
        check_scaling(nope_logit_scaling, scaling_base)
        self.scaling, self.scaling_base = nope_logit_scaling, scaling_base
        self.rope = RoPE(dims, base=rope_base)

    def rotate(self, q: Tensor, k: Tensor, pos: Positions, layer: int = 0) -> tuple[Tensor, Tensor]:
        """RoPE's rotation in the RoPE layers, none in the NoPE layers."""
        return self.rope.rotate(q, k, pos, layer) if self.kinds[layer] in ROTATES else (q, k)

    def attention_form(self, pos: Positions, queries: int, dtype: torch.dtype) -> Form:
        """One form per kind (`KINDS`' order): global causal attention, in SWAN's scaling at inference for
        the NoPE layers; global; in the window."""
        nope: Form = Causal()
        if self.scaling == "swan" and not self.training:
            assert self.scaling_base is not None  # check_scaling
            first = pos.length - queries + 1  # the last c of the n keys: they see t = n - c + 1 .. n keys
            nope = QueryScaled(nope, swan_scale(first, queries, self.scaling_base, pos.token.device))
        return PerLayer((nope, Causal(), Causal(self.window)))

    def layer_form(
        self, form: Form, layer: int, x: Tensor | None = None, cache: LayerCache | None = None
    ) -> Form:
        """The form of the layer's kind from the pass's `PerLayer`."""
        assert isinstance(form, PerLayer), f"a hybrid layer picks from the pass's PerLayer, got {form!r}"
        return form.forms[KINDS.index(self.kinds[layer])]

    @classmethod
    def same_in_training(cls, setting: str, before: object, after: object, train_len: int) -> bool:
        """SWAN's scaling acts at inference only: switching it or its constant leaves training unchanged."""
        return setting in ("nope_logit_scaling", "scaling_base")

    def summary(self) -> dict[str, float]:
        """The window in keys and the number of windowed layers."""
        windowed = sum(kind in WINDOWED for kind in self.kinds)
        return {"window": float(self.window), "windowed_layers": float(windowed)}
