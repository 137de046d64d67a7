"""Loggers share one protocol; the training loop never asks whether logging is on."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from posab.errors import require
from posab.outputs import EvalOutput

BACKENDS = ("wandb", "jsonl")
MODES = ("auto", "offline", "online", "disabled")


@dataclass
class LoggerConfig:
    backend: str = "wandb"  # wandb | jsonl (metrics.jsonl in the run directory is written either way)
    project: str = "posab"
    entity: str | None = None
    mode: str = (
        "auto"  # auto: online when a W&B API key is configured, else offline | offline | online | disabled
    )
    group: str | None = None  # None: the experiment name (in a multirun: the sweep folder's name)
    tags: list[str] = field(default_factory=list)
    log_checkpoint: bool = False  # upload the final checkpoint as a W&B artifact

    def validate(self) -> None:
        require(self.backend in BACKENDS, f"logger.backend={self.backend!r}: use wandb or jsonl")
        require(self.mode in MODES, f"logger.mode={self.mode!r}: use one of {', '.join(MODES)}")


class Logger(Protocol):
    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Scalars against the training step."""

    def log_evaluation(self, output: EvalOutput, step: int) -> None:
        """An evaluation's output: scalars, data, tables, curves, figures (whatever the logger keeps)."""

    def finish(self, status: str) -> None:
        """Close the logger; `status` is finished or failed."""


def _plain(value: Any) -> Any:
    """JSON-safe scalars: NaN and inf become strings so that every line stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class JsonlLogger:
    """One JSON object per line in `metrics.jsonl`, flushed at every write."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8")

    def log(self, metrics: dict[str, Any], step: int) -> None:
        record = {"step": step, "time": round(time.time(), 3), **{k: _plain(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def log_evaluation(self, output: EvalOutput, step: int) -> None:
        """Scalars only: the rest is in results.json and the run's files."""
        self.log(output.scalars, step)

    def finish(self, status: str) -> None:
        self._file.close()


class NullLogger:
    """Logs nothing (ranks other than 0 under torchrun)."""

    def log(self, metrics: dict[str, Any], step: int) -> None:
        pass

    def log_evaluation(self, output: EvalOutput, step: int) -> None:
        pass

    def finish(self, status: str) -> None:
        pass


class MultiLogger:
    """Fan out to several loggers."""

    def __init__(self, loggers: list[Logger]) -> None:
        self.loggers = loggers

    def log(self, metrics: dict[str, Any], step: int) -> None:
        for logger in self.loggers:
            logger.log(metrics, step)

    def log_evaluation(self, output: EvalOutput, step: int) -> None:
        for logger in self.loggers:
            logger.log_evaluation(output, step)

    def finish(self, status: str) -> None:
        for logger in self.loggers:
            logger.finish(status)
