"""Positional encodings. One file per encoding here, one YAML per encoding in conf/encoding/."""

from typing import Any

from hydra.utils import get_class

from posab.encodings.base import Dims, Encoding, Positions
from posab.errors import ConfigError

__all__ = ["Dims", "Encoding", "Positions", "build_encoding", "encoding_class"]


def encoding_params(spec: dict[str, Any]) -> dict[str, Any]:
    """The constructor's keyword arguments: the config node less `_target_` and `name`."""
    return {key: value for key, value in spec.items() if key not in ("_target_", "name")}


def encoding_class(spec: dict[str, Any]) -> type[Encoding]:
    """The class an encoding config node names, after it has checked the node's settings
    (`Encoding.check_params`: every key a parameter, every value of the parameter's type)."""
    if "_target_" not in spec:
        raise ConfigError("encoding: no _target_; pick one with encoding=NAME")
    try:
        cls = get_class(spec["_target_"])
    except Exception as err:
        raise ConfigError(f"encoding _target_={spec['_target_']!r} cannot be imported: {err}") from None
    if not (isinstance(cls, type) and issubclass(cls, Encoding)):
        raise ConfigError(f"encoding _target_={spec['_target_']!r} is not a posab Encoding class")
    cls.check_params(encoding_params(spec), str(spec.get("name", spec["_target_"])))
    return cls


def build_encoding(spec: dict[str, Any], dims: Dims) -> Encoding:
    """Build an encoding from its config node: `_target_` plus the constructor's keyword arguments."""
    return encoding_class(spec)(dims, **encoding_params(spec))
