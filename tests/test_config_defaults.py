"""The defaults are written twice, as dataclass defaults (the typed schema) and in the default option of each
config group (conf/*/default.yaml, small.yaml, synthetic.yaml, with their references): every value a
default YAML sets must equal its dataclass default, so the two cannot drift apart (issue 29)."""

from __future__ import annotations

from typing import Any

import pytest
from omegaconf import OmegaConf

from conftest import compose_config
from posab.config import Config


def leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """{"dotted.key": value} of a nested container."""
    if not isinstance(node, dict):
        return {prefix.rstrip("."): node}
    return {k: v for key, value in node.items() for k, v in leaves(value, f"{prefix}{key}.").items()}


@pytest.mark.parametrize("group", ["train", "model", "eval", "data", "passkey"])
def test_every_default_the_yaml_sets_is_the_dataclass_default(group: str) -> None:
    composed = leaves(OmegaConf.to_container(compose_config([])[group], resolve=True))
    schema = leaves(OmegaConf.to_container(OmegaConf.structured(getattr(Config(), group)), resolve=True))
    assert composed, group
    drifted = {
        k: (v, schema.get(k, "<not in the schema>")) for k, v in composed.items() if schema.get(k) != v
    }
    assert not drifted, f"{group}: YAML value vs dataclass default: {drifted}"
