"""`train.precision=auto`: bf16 only where it runs natively, the hardware and torch's kernel set both."""

from __future__ import annotations

import pytest
import torch

from posab.device import autocast_dtype, bf16_supported

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("hardware", "capability", "expected"),
    [
        (True, "AVX512", torch.bfloat16),
        (True, "DEFAULT", None),  # ATEN_CPU_CAPABILITY=default on an AVX-512 bf16 machine: fp32
        (True, "AVX2", None),
        (False, "AVX512", None),  # AVX-512 without bf16
    ],
)
def test_auto_is_bf16_only_where_the_cpu_and_torchs_kernels_run_it(
    monkeypatch: pytest.MonkeyPatch, hardware: bool, capability: str, expected: torch.dtype | None
) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: hardware, raising=False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    assert bf16_supported(CPU) is (expected is not None)
    assert autocast_dtype("auto", CPU) == expected
    assert autocast_dtype("fp32", CPU) is None and autocast_dtype("bf16", CPU) == torch.bfloat16
