"""Positional encodings. One file per encoding here, one YAML per encoding in conf/encoding/."""

from dataclasses import dataclass
from typing import Any

from hydra.utils import get_class

from posab.encodings.base import INIT_STD, Dims, Encoding, Positions
from posab.errors import ConfigError
from posab.forms import BiasFactors

__all__ = [
    "INIT_STD",
    "BiasFactors",
    "Dims",
    "Encoding",
    "EncodingOptimizer",
    "Positions",
    "build_encoding",
    "encoding_class",
    "encoding_optimizer",
]

# Keys of an encoding's config node that the optimizer reads (not the constructor): see EncodingOptimizer.
OPTIMIZER_KEYS = ("lr_mult", "weight_decay")


@dataclass(frozen=True)
class EncodingOptimizer:
    """How AdamW treats the encoding's parameters: one group of their own, at learning rate
    train.lr * lr_mult, decayed by weight_decay. Defaults: conf/encoding/*.yaml."""

    lr_mult: float = 1.0
    weight_decay: float = 0.0


def encoding_params(spec: dict[str, Any]) -> dict[str, Any]:
    """The constructor's keyword arguments: the config node less `name`, the optimizer's keys
    (`lr_mult`, `weight_decay`) and every key starting with `_` (`_target_`)."""
    return {
        key: value
        for key, value in spec.items()
        if key != "name" and key not in OPTIMIZER_KEYS and not key.startswith("_")
    }


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def encoding_optimizer(spec: dict[str, Any]) -> EncodingOptimizer:
    """The optimizer settings of an encoding config node, checked: `lr_mult` > 0, `weight_decay` >= 0. A
    key the node lacks takes the class default (the yaml's)."""
    defaults = EncodingOptimizer()
    lr_mult = spec.get("lr_mult", defaults.lr_mult)
    weight_decay = spec.get("weight_decay", defaults.weight_decay)
    if not (_is_number(lr_mult) and lr_mult > 0):
        raise ConfigError(
            f"encoding.lr_mult={lr_mult!r}: use a number > 0 (the encoding's parameters train at "
            "train.lr x lr_mult)"
        )
    if not (_is_number(weight_decay) and weight_decay >= 0):
        raise ConfigError(
            f"encoding.weight_decay={weight_decay!r}: use a number >= 0 (0: the encoding's parameters are "
            "not decayed)"
        )
    return EncodingOptimizer(float(lr_mult), float(weight_decay))


def encoding_class(spec: dict[str, Any]) -> type[Encoding]:
    """The class an encoding config node names, after it has checked the node's settings
    (`Encoding.check_params`: every key a parameter, every value of the parameter's type; and the
    optimizer's keys, `encoding_optimizer`)."""
    if "_target_" not in spec:
        raise ConfigError("encoding: no _target_; pick one with encoding=NAME")
    try:
        cls = get_class(spec["_target_"])
    except Exception as err:
        raise ConfigError(f"encoding _target_={spec['_target_']!r} cannot be imported: {err}") from None
    if not (isinstance(cls, type) and issubclass(cls, Encoding)):
        raise ConfigError(f"encoding _target_={spec['_target_']!r} is not a posab Encoding class")
    encoding_optimizer(spec)
    cls.check_params(encoding_params(spec), str(spec.get("name", spec["_target_"])))
    return cls


def build_encoding(spec: dict[str, Any], dims: Dims) -> Encoding:
    """Build an encoding from its config node: `_target_` plus the constructor's keyword arguments."""
    return encoding_class(spec)(dims, **encoding_params(spec))
