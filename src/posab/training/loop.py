"""The loop both trainings run (the language model's `Trainer` and the passkey stage): steps from where a
checkpoint left off, a progress bar, the loss of the last `log_every` steps, checkpoints every
`checkpoint_every` steps and at the end, and a clean stop on SIGTERM / SIGINT after the current step (a
checkpoint, then `Preempted`). Also their one learning-rate schedule, `warmup_cosine`."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tqdm import tqdm

from posab.distributed import progress_bar
from posab.errors import Preempted
from posab.training.state import StopSignal


def warmup_cosine(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """The learning rate of step `step` (0-based) as a fraction of the peak: linear warmup over `warmup`
    steps to 1, then cosine decay that would reach `min_ratio` at step `total` (one past the last step);
    `min_ratio` 1 is a constant rate after the warmup."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return min_ratio + (1 - min_ratio) * cosine


@dataclass
class LoopState:
    """Where a loop stands; saved in its checkpoint (subclasses add their own fields)."""

    step: int = 0
    time_s: float = 0.0  # time in steps, not in validation or checkpoints
    recent_losses: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Cadence:
    """How long a loop runs and how often it logs and checkpoints; `name` labels the bar and the stop."""

    total: int
    log_every: int
    checkpoint_every: int
    name: str
    show_progress: bool


def run_steps(
    state: LoopState,
    cadence: Cadence,
    step: Callable[[], float],
    after_step: Callable[[float, tqdm], None],
    checkpoint: Callable[[], None],
    stop_everywhere: Callable[[bool], bool] = bool,
) -> None:
    """Call `step()` (one optimizer step, returning its loss) from `state.step` to `cadence.total`; after
    each, `after_step(seconds, bar)` (logging, validation) and the checkpoint cadence. `stop_everywhere`
    turns this process's "a signal came" into every rank's (under torchrun: all stop at the same step)."""
    steps = range(state.step, cadence.total)
    bar = progress_bar(steps, cadence.name, cadence.show_progress, initial=state.step, total=cadence.total)
    with StopSignal() as stop:
        for _ in bar:
            started = time.perf_counter()
            loss = step()
            elapsed = time.perf_counter() - started
            state.step += 1
            state.time_s += elapsed
            state.recent_losses = (state.recent_losses + [loss])[-cadence.log_every :]
            after_step(elapsed, bar)
            done, last = state.step, state.step == cadence.total
            stopping = stop_everywhere(stop.received is not None)
            if done % cadence.checkpoint_every == 0 or last or stopping:
                checkpoint()
            if stopping and not last:
                raise Preempted(
                    f"signal {stop.received} at {cadence.name} step {done}: checkpoint saved; rerun the same "
                    "command to resume"
                )
