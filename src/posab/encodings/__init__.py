"""Positional encodings. One file per encoding here, one YAML per encoding in conf/encoding/."""

import inspect
from typing import Any

from hydra.utils import get_class

from posab.encodings.base import Dims, Encoding, Positions
from posab.errors import ConfigError

__all__ = ["Dims", "Encoding", "Positions", "build_encoding", "encoding_class"]


def encoding_params(spec: dict[str, Any]) -> dict[str, Any]:
    """The constructor's keyword arguments: the config node less `_target_` and `name`."""
    return {key: value for key, value in spec.items() if key not in ("_target_", "name")}


def encoding_class(spec: dict[str, Any]) -> type[Encoding]:
    """The class an encoding config node names, after checking that it takes every key of the node.

    A key the constructor does not take is reported with the keys it does take.
    """
    params = encoding_params(spec)
    try:
        cls = get_class(spec["_target_"])
    except Exception as err:
        raise ConfigError(f"encoding _target_={spec['_target_']!r} cannot be imported: {err}") from None
    if not (isinstance(cls, type) and issubclass(cls, Encoding)):
        raise ConfigError(f"encoding _target_={spec['_target_']!r} is not a posab Encoding class")
    accepted = [name for name in inspect.signature(cls.__init__).parameters if name not in ("self", "dims")]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ConfigError(
            f"encoding {spec.get('name', spec['_target_'])!r} has no setting {', '.join(unknown)}; "
            f"valid settings: {', '.join(accepted) or '(none)'}"
        )
    return cls


def build_encoding(spec: dict[str, Any], dims: Dims) -> Encoding:
    """Build an encoding from its config node: `_target_` plus the constructor's keyword arguments."""
    return encoding_class(spec)(dims, **encoding_params(spec))
