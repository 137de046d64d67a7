"""Checkpoints: plain containers (no OmegaConf objects), loadable with `torch.load(weights_only=True)`."""

from __future__ import annotations

import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from posab.config import Config
from posab.errors import ConfigError


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write to a temporary file beside `path`, then rename it: a crash never leaves half a checkpoint."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint; a missing, truncated or corrupted file is reported by name."""
    if not path.is_file():
        raise ConfigError(f"checkpoint '{path}' does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for damaged files
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"checkpoint '{path}' cannot be read (truncated or corrupted?): {reason}") from None


def config_container(cfg: Config) -> dict[str, Any]:
    """The typed config as plain dicts and lists."""
    return OmegaConf.to_container(OmegaConf.structured(asdict(cfg)))  # type: ignore[return-value]
