"""The one interface the model calls, whatever encoding it holds.

An encoding may add to the token embeddings (`embed`), rotate queries and keys (`rotate`), return an
additive attention bias (`bias`, and a per-sample part of low rank as `bias_factors`), a multiplicative
factor on the attention scores (`score_scale`) and/or a function of the logits and the bias at every pair
(`score_mixer`, per layer: DAPE).
All are no-ops by default. Everything an encoding needs about positions arrives in one `Positions` value.
An encoding may also offer evaluation-time variants (`variants`, `variant`: RoPE's context extensions),
keep its parameters in their valid set after each optimizer step (`constrain`), report numbers about
itself with the run's parameter counts (`summary`), and checks its own config node (`check_params`).
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, get_type_hints

import torch
from torch import Tensor, nn

from posab.errors import ConfigError

# The evaluation-time variants an encoding may offer (`Encoding.variants`): the context extensions of RoPE
# (position interpolation, NTK-aware scaling, YaRN); the perplexity evaluator scores the ones it is asked for.
CONTEXT_EXTENSIONS = ("pi", "ntk", "yarn")
# The model's initialisation std for its embeddings and matrices (GPT-2; Radford et al., 2019): the token
# embeddings start with norm ~ INIT_STD * sqrt(d_model); an encoding that adds to them sizes itself on it.
INIT_STD = 0.02


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

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclass
class Positions:
    """Where each token is.

    token: (T,) absolute token positions, `offset + arange(T)`; the same for every row of the batch.
    sentence, paragraph: (B, T) sentence and paragraph indices of each token, or None when unknown.
    """

    token: Tensor
    sentence: Tensor | None = None
    paragraph: Tensor | None = None

    @staticmethod
    def build(
        length: int,
        device: torch.device | str = "cpu",
        offset: int = 0,
        sentence: Tensor | None = None,
        paragraph: Tensor | None = None,
    ) -> Positions:
        token = torch.arange(offset, offset + length, device=device)
        return Positions(token=token, sentence=sentence, paragraph=paragraph)

    @property
    def length(self) -> int:
        return self.token.shape[0]


@dataclass
class BiasFactors:
    """An additive attention bias of rank R per sample, as two factors:
    bias[b, h, i, j] = query[b, h, i, :] . key[b, 0, j, :].

    The model never forms the (B, H, T, T) product: it appends the factors to q and k as R extra channels
    (`posab.attention`), so a per-sample bias costs R channels of the attention's own matmuls.
    """

    query: Tensor  # (B, H, T, R)
    key: Tensor  # (B, 1, T, R)

    def dense(self) -> Tensor:
        """The bias itself: (B, H, T, R) @ (B, 1, R, T) -> (B, H, T, T)."""
        return torch.matmul(self.query, self.key.transpose(-1, -2))


class Encoding(nn.Module):
    """Base class: no positional information at all (NoPE) unless a method is overridden.

    `relative_only` is True when the encoding's effect depends only on differences of positions, so the
    model's outputs must not change when every position is offset by the same amount. `static_bias` is
    True when `bias` depends only on the sequence length (not on offsets or sentence structure).
    """

    relative_only: bool = True
    static_bias: bool = False  # `bias` depends only on the sequence length (it may be cached per length)
    variants: tuple[str, ...] = ()  # evaluation-time variants `variant` accepts (none by default)

    def __init__(self, dims: Dims) -> None:
        super().__init__()
        self.dims = dims

    def embed(self, x: Tensor, pos: Positions) -> Tensor:
        """x: (B, T, C) token embeddings -> (B, T, C)."""
        return x

    def rotate(self, q: Tensor, k: Tensor, pos: Positions) -> tuple[Tensor, Tensor]:
        """q, k: (B, H, T, D) -> rotated (B, H, T, D)."""
        return q, k

    def bias(self, pos: Positions) -> Tensor | None:
        """Additive attention bias (1 or B, H, T, T) with [.., i, j] for query i and key j, or None."""
        return None

    def bias_factors(self, pos: Positions) -> BiasFactors | None:
        """A per-sample additive bias of low rank, added to `bias`, or None (most encodings)."""
        return None

    def dense_bias(self, pos: Positions) -> Tensor | None:
        """The whole additive bias as one tensor, `bias` plus the product of `bias_factors`:
        (1 or B, H, T, T), or None. For checking and analysis; the model never forms it."""
        bias, factors = self.bias(pos), self.bias_factors(pos)
        if factors is None:
            return bias
        return factors.dense() if bias is None else bias + factors.dense()

    def score_scale(self, pos: Positions) -> Tensor | None:
        """Multiplicative factor (1 or B, H, T, T) on q.k / sqrt(d) before the bias, or None (form (2))."""
        return None

    def score_mixer(self, layer: int) -> nn.Module | None:
        """A function of the scaled logits A and the bias B at every pair that replaces A + B in attention
        layer `layer` (form (4), DAPE's `ScoreMixer`: mixer(A, B) on (B, H, c, n) chunks), or None."""
        return None

    def constrain(self) -> None:
        """Put the parameters back into their valid set; the optimizer calls it after every step (KERPLE's
        clamp). Nothing to do by default."""

    def summary(self) -> dict[str, float]:
        """Numbers about the encoding a run records with its parameter counts (results.json `params`,
        report columns `params/<key>`), e.g. the rows of a learned table that training reaches."""
        return {}

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
