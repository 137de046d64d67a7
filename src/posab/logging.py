"""Loggers share one protocol; the training loop never asks whether logging is on."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Protocol


class Logger(Protocol):
    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Scalars against the training step."""

    def log_evaluation(self, results: dict[str, Any], step: int, run_dir: Path) -> None:
        """Every evaluation result (scalars, curves, grids) and the run's figures in `run_dir`."""

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

    def log_evaluation(self, results: dict[str, Any], step: int, run_dir: Path) -> None:
        """Scalars only: curves and grids are in results.json."""
        self.log({k: v for k, v in results.items() if isinstance(v, int | float)}, step)

    def finish(self, status: str) -> None:
        self._file.close()


class NullLogger:
    """Logs nothing (ranks other than 0 under torchrun)."""

    def log(self, metrics: dict[str, Any], step: int) -> None:
        pass

    def log_evaluation(self, results: dict[str, Any], step: int, run_dir: Path) -> None:
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

    def log_evaluation(self, results: dict[str, Any], step: int, run_dir: Path) -> None:
        for logger in self.loggers:
            logger.log_evaluation(results, step, run_dir)

    def finish(self, status: str) -> None:
        for logger in self.loggers:
            logger.finish(status)
