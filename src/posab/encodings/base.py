"""The one interface the model calls, whatever encoding it holds.

An encoding may add to the token embeddings (`embed`), rotate queries and keys (`rotate`), and say how
position enters attention as one attention form per forward pass (`attention_form`, per layer
`layer_form`; the forms own their math: `posab.forms`). All are no-ops by default (causal attention
alone). Everything an encoding needs about positions arrives in one `Positions` value: in a cached
decoding step, those of the new tokens (`embed`, `rotate`) and of every key (`attention_form`), so every
encoding decodes with a cache.
An encoding may also offer evaluation-time variants (`variants`, `variant`: RoPE's context extensions),
keep its parameters in their valid set after each optimizer step (`constrain`), report numbers about
itself with the run's parameter counts (`summary`), check its own config node (`check_params`), say which
settings may change on a finished run (`same_in_training`) and expose its bias by distance to the
extrapolation audit (`distance_bias`, `bias_features`).
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, get_type_hints

import torch
from torch import Tensor, nn

from posab.cache import LayerCache
from posab.errors import ConfigError
from posab.forms import Additive, Causal, Form
from posab.positions import Positions

# The evaluation-time variants an encoding may offer (`Encoding.variants`): the context extensions of RoPE
# (position interpolation, NTK-aware scaling, YaRN); the perplexity evaluator scores the ones it is asked for.
CONTEXT_EXTENSIONS = ("pi", "ntk", "yarn")
# The model's initialisation std for its embeddings and matrices (GPT-2; Radford et al., 2019): the token
# embeddings start with norm ~ INIT_STD * sqrt(d_model); an encoding that adds to them sizes itself on it.
INIT_STD = 0.02


class Kind(StrEnum):
    """What an encoding is, declared as data (`Encoding.kind`) rather than probed from its hooks: what a
    wrapper may build on (DAPE: an additive bias shared by the batch; randomized positions: an encoding
    indexed by position) and how the house reads it. tests/test_kinds.py holds every declaration to what
    the encoding's hooks and forms do."""

    NONE = "none"
    ABSOLUTE = "absolute"
    ROTARY = "rotary"
    PER_LAYER = "per-layer"
    DISTANCE_BIAS = "distance-bias"
    DENSE_BIAS = "dense-bias"
    STRUCTURE_BIAS = "structure-bias"
    SCALED = "scaled"
    CONTENT = "content"
    SOFTMAX_REPLACEMENT = "softmax-replacement"

    @property
    def acts(self) -> str:
        """How an encoding of this kind acts, as an error message says it."""
        return KIND_ACTS[self]


KIND_ACTS = {
    Kind.NONE: "through no position at all: causal attention alone (NoPE)",
    Kind.ABSOLUTE: "through the token embeddings (`embed`: sinusoidal, learned)",
    Kind.ROTARY: "by rotating queries and keys (`rotate`: RoPE, xPos)",
    Kind.PER_LAYER: "through another form per layer (`PerLayer`: the NoPE/RoPE hybrids)",
    Kind.DISTANCE_BIAS: "through an additive bias of i - j from a per-distance table, one per batch",
    Kind.DENSE_BIAS: "through an additive bias of (i, j), one per batch (FIRE's, which reads i)",
    Kind.STRUCTURE_BIAS: "through a bias per sample, from its sentence and paragraph structure",
    Kind.SCALED: "by multiplying the scores by a factor of i - j (multiscale form=multiplicative)",
    Kind.CONTENT: "through a position computed from the content (FoX's gates, CoPE's counts, DAPE's MLP)",
    Kind.SOFTMAX_REPLACEMENT: "through attention weights other than a softmax (stick-breaking)",
}


BIAS_KINDS = (Kind.DISTANCE_BIAS, Kind.DENSE_BIAS)  # an additive bias shared by the batch, nothing else
POSITION_INDEXED = (Kind.NONE, Kind.ABSOLUTE, Kind.ROTARY)  # through embed/rotate alone, causal attention
READS_POSITIONS = (Kind.ABSOLUTE, Kind.ROTARY)  # read each token's position itself: coupled positions apply


def reads_given_positions(encoding: Encoding) -> bool:
    """Whether `encoding` reads positions given as data (a task's coupled positions): one of the kinds
    acting through embed or rotate on each token's own position, not a wrapper that remaps them."""
    return encoding.kind in READS_POSITIONS and not isinstance(encoding, Wrapping)


@dataclass(frozen=True)
class Dims:
    """Model sizes an encoding may need."""

    d_model: int
    n_heads: int
    train_len: int = 512  # the training length
    max_positions: int = (
        8192  # the largest position + 1 the run will use (evaluation and shift offsets included)
    )
    seed: int = 0  # the run's seed: an encoding that draws from its own generator seeds it from this
    n_layers: int = (
        1  # attention layers: an encoding with a module per layer (DAPE's score mixers) sizes on it
    )
    window: int | None = None  # sliding-window attention in every layer (`model.window`), or None

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class Encoding(nn.Module):
    """Base class: no positional information at all (NoPE) unless a method is overridden.

    `relative_only` is True when the encoding's effect depends only on differences of positions, so the
    model's outputs must not change when every position is offset by the same amount. `static_form` is
    True when `form` depends only on the sequence length (not on offsets or sentence structure).
    """

    kind: Kind = Kind.NONE  # what it is (`Kind`); an encoding whose kind follows its settings sets it
    relative_only: bool = True
    static_form: bool = (
        False  # `attention_form` depends only on the lengths (the model may cache it per length)
    )
    variants: tuple[str, ...] = ()  # evaluation-time variants `variant` accepts (none by default)

    def __init__(self, dims: Dims) -> None:
        super().__init__()
        self.dims = dims

    def embed(self, x: Tensor, pos: Positions) -> Tensor:
        """x: (B, T, C) token embeddings -> (B, T, C)."""
        return x

    def rotate(self, q: Tensor, k: Tensor, pos: Positions, layer: int = 0) -> tuple[Tensor, Tensor]:
        """q, k: (B, H, T, D) of attention layer `layer` -> rotated (B, H, T, D)."""
        return q, k

    def attention_form(self, pos: Positions, queries: int, dtype: torch.dtype) -> Form:
        """How position enters attention in this forward pass: `pos` the positions of the n keys, the
        queries their last `queries` (all of them but in a cached decoding step), `dtype` the attention
        dtype (any mask is built in it). Causal attention alone by default (in a window with
        `model.window`)."""
        return Causal(self.dims.window)

    def layer_form(
        self, form: Form, layer: int, x: Tensor | None = None, cache: LayerCache | None = None
    ) -> Form:
        """The form of attention layer `layer` given the pass's `form`: the same by default (DAPE: its
        function of the logits and the bias, one per layer). `x` (B, c, C) is the layer's attention input
        (a gate computed from the content reads it); `cache` is the layer's decoding state (None without a
        cache), its new keys and values already appended: an encoding reads the cached keys there, may
        rewrite them in place before the step attends, and keeps its own state over the keys in
        `cache.state_for(ItsState)` (FoX: the sums of its gates)."""
        return form

    def distance_form(self, pos: Positions, queries: int, dtype: torch.dtype) -> Additive:
        """The additive form of a bias by distance, from `distance_bias` on the 2n-1 distances of n keys."""
        table = self.distance_bias(distances(pos.length, pos.token.device))  # (H, 2n-1)
        return Additive.by_distance(table, queries, pos.length, dtype, self.dims.window)

    def dense_bias(self, pos: Positions) -> Tensor | None:
        """The whole additive bias of a window, without the causal mask: (1|B, H, T, T) float32, or None.
        For checking and analysis; the model never forms it unless a path needs it."""
        return self.attention_form(pos, pos.length, torch.float32).dense_bias()

    def distance_bias(self, distance: Tensor) -> Tensor | None:
        """(D,) distances i - j >= 0 -> (H, D) the additive bias by distance (for a bias that depends on the
        query too: that of the query i = max(distance)), or None without one (the extrapolation audit)."""
        return None

    def bias_features(self, distance: Tensor) -> Tensor | None:
        """(D,) distances as `distance_bias` -> (D, F) the features a bias MLP reads, or None."""
        return None

    @classmethod
    def same_in_training(cls, setting: str, before: Any, after: Any, train_len: int) -> bool:
        """Whether changing `encoding.<setting>` from `before` to `after` leaves training unchanged at
        training length `train_len` (so `posab evaluate` may change it on a finished run). Never, by
        default."""
        return False

    def constrain(self) -> None:
        """Put the parameters back into their valid set; the optimizer calls it after every step (KERPLE's
        clamp). Nothing to do by default."""

    def summary(self) -> dict[str, float]:
        """Numbers about the encoding a run records with its parameter counts (results.json `params`,
        report columns `params/<key>`), e.g. the rows of a learned table that training reaches."""
        return {}

    @contextmanager
    def planned_positions(self, total: int) -> Iterator[None]:
        """Decode a sequence of up to `total` tokens (from position 0) with positions fixed for the whole
        sequence in advance: what an encoding that draws its positions per pass needs to decode with a cache
        (randomized positions evaluated `sampled`). Nothing to fix by default."""
        yield

    @contextmanager
    def variant(self, kind: str, factor: float, train_len: int | None = None) -> Iterator[None]:
        """Run as evaluation-time variant `kind` (one of `variants`) at scale factor `factor` >= 1, with
        `train_len` the training length; the encoding is restored on exit."""
        raise ValueError(f"{type(self).__name__} has no evaluation-time variant {kind!r}")
        yield

    @classmethod
    def check_params(cls, params: dict[str, Any], label: str) -> None:
        """Check a config node's settings against the constructor: every key is a parameter, and every value
        has the parameter's annotated type. Raises a ConfigError naming the setting, its value and what
        would be valid (`label`: the encoding's name). Subclasses may check values too."""
        signature = inspect.signature(cls.__init__)
        accepted = [name for name in signature.parameters if name not in ("self", "dims")]
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            raise ConfigError(
                f"encoding {label!r} has no setting {', '.join(unknown)}; "
                f"valid settings: {', '.join(accepted) or '(none)'}; "
                "and, for the optimizer, lr_mult, weight_decay"
            )
        hints = get_type_hints(cls.__init__)
        for name, value in params.items():
            if name in hints and not value_matches(value, hints[name]):
                raise ConfigError(
                    f"encoding {label!r}: {name}={value!r} is not a valid {type_name(hints[name])}"
                )


def distances(length: int, device: torch.device | str) -> Tensor:
    """The 2L-1 distinct query-minus-key distances, -(L-1) .. L-1, as float: (2L-1,)."""
    return torch.arange(-(length - 1), length, device=device, dtype=torch.float32)


def toeplitz(table: Tensor, length: int) -> Tensor:
    """Gather a per-distance table into a Toeplitz matrix.

    table: (H, 2L-1) with table[:, (L-1) + d] the value at distance d = i - j.
    returns: (H, L, L) with out[h, i, j] = table[h, (L-1) + i - j].
    """
    # unfold: windows[h, i, m] = table[h, i + m]; reading m = L-1-j gives table[h, (L-1) + i - j]
    return table.unfold(-1, length, 1).flip(-1)  # (H, L, L)


def value_matches(value: Any, hint: Any) -> bool:
    """Whether a config value (as OmegaConf gives it: plain scalars, lists) fits a parameter annotation:
    int, float (an int is accepted), bool, str, None, unions of these, list[...] and tuple[X, ...]."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(value_matches(value, arg) for arg in args)
    if origin in (list, tuple):
        item = args[0] if args else Any
        return isinstance(value, list | tuple) and all(value_matches(v, item) for v in value)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if hint is type(None) or hint is None:
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return hint is Any or isinstance(value, hint)


def type_name(hint: Any) -> str:
    """`int`, `float or None`, `list of str`: a parameter annotation as an error message says it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(arg) for arg in args)
    if origin in (list, tuple):
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict or hint is dict:
        return "mapping (a config node)"
    if hint is type(None):
        return "None"
    return getattr(hint, "__name__", str(hint))


class Wrapping(Encoding):
    """An encoding built around another, `base`: every hook and every declaration (its kind, `relative_only`,
    `static_form`, `variants`) is the base's unless the subclass overrides it (randomized positions: the
    positions the base sees; DAPE: each layer's form and its kind). The extrapolation audit's bias and
    features are the base's: the prior the wrapper builds on."""

    def __init__(self, dims: Dims, base: Encoding) -> None:
        super().__init__(dims)
        self.base = base

    @property
    def kind(self) -> Kind:  # type: ignore[override]
        return self.base.kind

    @property
    def relative_only(self) -> bool:  # type: ignore[override]
        return self.base.relative_only

    @property
    def static_form(self) -> bool:  # type: ignore[override]
        return self.base.static_form

    @property
    def variants(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.base.variants

    def embed(self, x: Tensor, pos: Positions) -> Tensor:
        return self.base.embed(x, pos)

    def rotate(self, q: Tensor, k: Tensor, pos: Positions, layer: int = 0) -> tuple[Tensor, Tensor]:
        return self.base.rotate(q, k, pos, layer)

    def attention_form(self, pos: Positions, queries: int, dtype: torch.dtype) -> Form:
        return self.base.attention_form(pos, queries, dtype)

    def layer_form(
        self, form: Form, layer: int, x: Tensor | None = None, cache: LayerCache | None = None
    ) -> Form:
        return self.base.layer_form(form, layer, x, cache)

    def distance_bias(self, distance: Tensor) -> Tensor | None:
        return self.base.distance_bias(distance)

    def bias_features(self, distance: Tensor) -> Tensor | None:
        return self.base.bias_features(distance)

    def constrain(self) -> None:
        self.base.constrain()

    def summary(self) -> dict[str, float]:
        return self.base.summary()

    @contextmanager
    def planned_positions(self, total: int) -> Iterator[None]:
        with self.base.planned_positions(total):
            yield

    @contextmanager
    def variant(self, kind: str, factor: float, train_len: int | None = None) -> Iterator[None]:
        with self.base.variant(kind, factor, train_len):
            yield
