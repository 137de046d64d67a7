"""Device and precision: where the model runs and in which autocast dtype."""

from __future__ import annotations

import contextlib

import torch

from posab.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device=cuda but no CUDA device is available; use auto or cpu")
    return torch.device(name)


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 when asked, or with `auto` where the hardware has native bf16; None means fp32."""
    if precision == "fp32" or (precision == "auto" and not bf16_supported(device)):
        return None
    return torch.bfloat16


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[None]:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
