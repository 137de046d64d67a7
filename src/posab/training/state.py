"""What a training loop needs to stop and resume exactly: its checkpoint entries (model, optimizer and
schedule; RNG states) and `StopSignal`, which turns SIGTERM / SIGINT into a stop after the current step.
Shared by the training loop and the passkey stage."""

from __future__ import annotations

import random
import signal
from typing import Any

import numpy as np
import torch
from torch import nn

from posab.errors import ConfigError


def rng_states() -> dict[str, Any]:
    """torch, numpy and python RNG states as plain containers."""
    numpy_state = np.random.get_state(legacy=False)
    numpy_state["state"]["key"] = numpy_state["state"]["key"].tolist()
    return {"torch": torch.get_rng_state(), "numpy": numpy_state, "python": list(random.getstate()[1])}


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    numpy_state = dict(states["numpy"])
    numpy_state["state"] = {**numpy_state["state"], "key": np.asarray(numpy_state["state"]["key"], np.uint32)}
    np.random.set_state(numpy_state)
    random.setstate((3, tuple(states["python"]), None))


RESTART = "start the run afresh (train.resume=never, or another hydra.run.dir)"


def check_param_groups(saved: dict[str, Any], optimizer: Any, remedy: str) -> None:
    """ConfigError when a saved optimizer state has other parameter groups (their number or sizes) than
    `optimizer`: code that grouped the parameters otherwise saved it, and its moments and rates would not
    fit. Checked before anything is loaded; `remedy` says what to do instead."""
    saved_sizes = [len(group["params"]) for group in saved["param_groups"]]
    sizes = [len(group["params"]) for group in optimizer.param_groups]
    if saved_sizes != sizes:
        raise ConfigError(
            f"the checkpoint's optimizer has {len(saved_sizes)} parameter group(s) of {saved_sizes} "
            f"parameters, this code's {len(sizes)} of {sizes} (an older posab grouped them otherwise): "
            f"it cannot be resumed; {remedy}"
        )


def optimizer_state(model: nn.Module, optimizer: Any, scheduler: Any) -> dict[str, Any]:
    """The model, optimizer and schedule of a training loop as checkpoint entries."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
    }


def load_optimizer_state(
    state: dict[str, Any], model: nn.Module, optimizer: Any, scheduler: Any, remedy: str = RESTART
) -> None:
    """Restore what `optimizer_state` saved, after `check_param_groups` (`remedy`: its advice)."""
    check_param_groups(state["optimizer"], optimizer, remedy)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])


class StopSignal:
    """Records SIGTERM / SIGINT during training instead of dying mid-step (pre-emption)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignal:
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._record)
            except ValueError:  # not the main thread (e.g. a thread-based launcher): no handler
                pass
        return self

    def _record(self, signum: int, frame: Any) -> None:
        self.received = signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
