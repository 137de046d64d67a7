"""The training step `posab check-device` times on the chosen device: forward under autocast, the
next-token loss, backward and an AdamW update, at the training length; its median time and peak memory.

The step is a plain one (no clipping, no schedule, no sampler): it measures what the device does with the
model, independent of the Trainer's bookkeeping, which `posab bench` times on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from posab.bench.device_numerics import Inputs, next_token_loss
from posab.bench.measure import MIB, median_times, peak_memory
from posab.device import autocast
from posab.model import DecoderLM

LEARNING_RATE = 1e-3  # any small rate: the step's cost does not depend on it
WARMUP = 2  # untimed steps first: AdamW allocates its state, the device's kernels are chosen and loaded


@dataclass(frozen=True)
class StepCost:
    """Median seconds per step, tokens per second, and the peak MiB allocated during one step above what
    was held before it (weights, optimizer state and inputs not counted)."""

    seconds: float
    tokens_per_s: float
    peak_mib: float


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU), so that a wall time covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def training_step(
    model: DecoderLM, inputs: Inputs, device: torch.device, dtype: torch.dtype | None
) -> Callable[[], None]:
    """One optimizer step of `model` (already on `device`) on `inputs`, returning after the device is done."""
    batch = inputs.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    model.train()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, dtype):
            logits = model(batch.tokens, batch.sentence, batch.paragraph)  # (B, T, V)
        next_token_loss(logits, batch.tokens).backward()
        optimizer.step()
        synchronize(device)

    return step


def step_peak_bytes(step: Callable[[], None], device: torch.device) -> int:
    """Peak bytes allocated during one `step()` above those held before it. CUDA: the caching allocator's
    high-water mark (`torch.cuda.max_memory_allocated`, reset first) minus what was allocated at the start.
    CPU: the PyTorch CPU allocator's events recorded by `torch.profiler` (`posab.bench.measure.peak_memory`);
    memory outside PyTorch's allocator is not counted (a process's RSS mixes in the allocator's caching and
    the Python heap, and its peak never falls, so it cannot isolate one step)."""
    if device.type != "cuda":
        return peak_memory(step)
    synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    return torch.cuda.max_memory_allocated(device) - before


def step_cost(
    model: DecoderLM, inputs: Inputs, device: torch.device, dtype: torch.dtype | None, repeats: int
) -> StepCost:
    """Time `repeats` training steps after WARMUP untimed ones (median wall time, the device synchronised
    after each), then measure one more step's peak memory. `model` is trained in place."""
    step = training_step(model, inputs, device, dtype)
    synchronize(device)
    (seconds,) = median_times([step], WARMUP, repeats)
    peak = step_peak_bytes(step, device)
    return StepCost(seconds, inputs.tokens_count / seconds, peak / MIB)
