"""Device and precision: where the model runs and in which autocast dtype."""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F

from posab.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device=cuda but no CUDA device is available; use auto or cpu")
    return torch.device(name)


# torch's CPU kernel sets that run bf16 natively; below them (ATEN_CPU_CAPABILITY=default or avx2 on a
# machine with AVX-512 bf16) the bf16 matmul paths are not dispatched (on AMX machines they fail outright:
# "pack_vnni2 is only supported when avx512 is supported")
NATIVE_BF16_CAPABILITIES = ("AVX512",)


def bf16_supported(device: torch.device) -> bool:
    """Native bf16: the GPU supports it, or the CPU has AVX-512 bf16 and torch dispatches to AVX-512."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    hardware = bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())
    return hardware and torch.backends.cpu.get_cpu_capability() in NATIVE_BF16_CAPABILITIES


@functools.cache
def cpu_bf16_attention_error() -> str | None:
    """Why torch's bf16 attention cannot run on this CPU in this process, or None. With the kernel set
    lowered below AVX-512 (ATEN_CPU_CAPABILITY=avx2 or default) on an AMX machine, torch 2.13's bf16
    scaled-dot-product attention raises from 64 keys on, so bf16 cannot train or evaluate there."""
    probe = torch.zeros(1, 1, 64, 16, dtype=torch.bfloat16)  # (B, H, L, D): long enough for the packed path
    try:
        F.scaled_dot_product_attention(probe, probe, probe, is_causal=True)
    except RuntimeError as err:
        return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return None


def cpu_bf16_unavailable() -> str | None:
    """Why this CPU cannot run bf16 in this process (torch's error and the kernel set), or None."""
    error = cpu_bf16_attention_error()
    if error is None:
        return None
    capability = torch.backends.cpu.get_cpu_capability()
    return f'torch cannot run bf16 attention on this CPU with its {capability} kernel set ("{error}")'


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 when asked, or with `auto` where the hardware has native bf16; None means fp32. An explicit
    bf16 that this CPU's torch cannot run is refused here, before anything is trained."""
    if precision == "fp32" or (precision == "auto" and not bf16_supported(device)):
        return None
    if device.type == "cpu" and (why := cpu_bf16_unavailable()) is not None:
        raise ConfigError(
            f"precision={precision}: {why}; use precision=auto or fp32, or unset ATEN_CPU_CAPABILITY"
        )
    return torch.bfloat16


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[None]:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
