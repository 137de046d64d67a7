"""Checkpoints: plain containers (no OmegaConf objects), loadable with `torch.load(weights_only=True)`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from posab.errors import ConfigError
from posab.io import atomic_write


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write to a temporary file beside `path`, then rename it: a crash never leaves half a checkpoint."""
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint; a missing, truncated or corrupted file is reported by name."""
    if not path.is_file():
        raise ConfigError(f"checkpoint '{path}' does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for damaged files
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"checkpoint '{path}' cannot be read (truncated or corrupted?): {reason}") from None
