"""How the benchmark measures: interleaved median wall times, peak PyTorch CPU memory, available memory."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

MIB = 2**20


def median_times(fns: Sequence[Callable[[], object]], warmup: int, repeats: int) -> list[float]:
    """Median wall time (s) of each function: `warmup` untimed runs each, then `repeats` rounds that run
    every function once, in turn (time.perf_counter)."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, samples in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
    return [statistics.median(samples) for samples in times]


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null: the profiler's C++ side prints a line at each start and stop."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_memory(fn: Callable[[], object]) -> int:
    """Peak bytes of PyTorch CPU tensors allocated during one call of `fn`, above what was held before.

    `torch.profiler` with `profile_memory=True` records every allocation and free of PyTorch's CPU
    allocator; the peak is the highest running sum of those events in time order. Tensors that exist
    before the call (weights, inputs) are not counted, nor is memory outside PyTorch's allocator.
    """
    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]"
    )
    running = peak = 0
    for _, nbytes in events:
        running += nbytes
        peak = max(peak, running)
    return peak


def available_memory() -> int:
    """Bytes the kernel reports as available (MemAvailable), or 0 where /proc/meminfo is missing."""
    meminfo = Path("/proc/meminfo")
    if not meminfo.is_file():
        return 0
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0
