"""Which matmul kernels this machine runs: the CPU capability torch dispatches to, and the oneDNN primitive
a matmul in each training dtype executes (oneDNN's verbose log of one small matmul), so that a bench.md
says why two machines of one kind reach different peaks."""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Iterator

import torch

SIZE = 256  # the probe matmul: large enough for oneDNN's brgemm path, instant


@contextlib.contextmanager
def captured_stdout() -> Iterator[list[str]]:
    """File descriptor 1 into a temporary file (oneDNN prints from C++); its lines fill the list on exit."""
    lines: list[str] = []
    with tempfile.TemporaryFile(mode="w+") as scratch:
        saved = os.dup(1)
        os.dup2(scratch.fileno(), 1)
        try:
            yield lines
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            scratch.seek(0)
            lines += scratch.read().splitlines()


@functools.cache
def onednn_log(dtype: torch.dtype) -> tuple[str, ...]:
    """oneDNN's verbose lines for one (SIZE x SIZE) matmul in `dtype` (its header, with the ISA, comes with
    the first log a process takes: kept by the cache)."""
    a = torch.ones(SIZE, SIZE, dtype=dtype)
    with captured_stdout() as lines, torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
        torch.matmul(a, a)
    return tuple(lines)


def matmul_kernel(dtype: torch.dtype) -> str:
    """The oneDNN matmul implementation that ran (e.g. `brg_matmul:avx512_core_bf16`), or, when oneDNN ran
    none, the BLAS torch was built with (float32 goes to MKL's sgemm)."""
    for line in onednn_log(dtype):
        fields = line.split(",")
        if "exec" in fields and "matmul" in fields:
            return "oneDNN " + fields[fields.index("matmul") + 1]
    blas = "MKL" if torch.backends.mkl.is_available() else "the BLAS torch was built with"
    return f"{blas} (no oneDNN primitive)"


def onednn_isa() -> str:
    """The instruction set oneDNN dispatches to on this CPU, as its verbose log names it."""
    for line in onednn_log(torch.bfloat16) + onednn_log(torch.float32):
        if ",isa:" in line:
            return line.split(",isa:", 1)[1].strip()
    return "unknown"


def kernel_facts() -> dict[str, str]:
    """The lines bench.md's machine table gets."""
    return {
        "CPU capability (torch)": torch.backends.cpu.get_cpu_capability(),
        "oneDNN ISA": onednn_isa(),
        "fp32 matmul kernel": matmul_kernel(torch.float32),
        "bf16 matmul kernel": matmul_kernel(torch.bfloat16),
    }
