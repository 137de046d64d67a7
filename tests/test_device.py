"""`train.precision=auto`: bf16 only where it runs natively, the hardware and torch's kernel set both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import run_main
from posab import device
from posab.device import autocast_dtype, bf16_supported, cpu_bf16_attention_error
from posab.errors import ConfigError

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
    monkeypatch.setattr(device, "cpu_bf16_attention_error", lambda: None)  # a CPU whose torch runs bf16
    assert bf16_supported(CPU) is (expected is not None)
    assert autocast_dtype("auto", CPU) == expected
    assert autocast_dtype("fp32", CPU) is None and autocast_dtype("bf16", CPU) == torch.bfloat16


def test_the_bf16_probe_predicts_a_training_length_attention() -> None:
    """The probe (64 keys) says what a bf16 attention at the training length 512 does in this process: it
    runs where the probe found no error and raises the probe's error where it did (run the suite with
    ATEN_CPU_CAPABILITY=default on an AMX machine to see the second)."""
    q = torch.randn(1, 2, 512, 64, generator=torch.Generator().manual_seed(0)).bfloat16()  # (B, H, L, D)
    error = cpu_bf16_attention_error()
    if error is None:
        assert torch.isfinite(F.scaled_dot_product_attention(q, q, q, is_causal=True)).all()
    else:
        with pytest.raises(RuntimeError, match=error.split(":")[0]):
            F.scaled_dot_product_attention(q, q, q, is_causal=True)


def test_bf16_that_torch_cannot_run_is_refused_before_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """An explicit bf16 where torch's bf16 attention raises is a ConfigError naming the value, torch's
    reason and what would run; auto falls back to fp32 there without asking."""
    monkeypatch.setattr(device, "cpu_bf16_attention_error", lambda: "pack_vnni2 is only supported when x")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    with pytest.raises(ConfigError, match=r"precision=bf16.*DEFAULT.*pack_vnni2.*auto or fp32"):
        autocast_dtype("bf16", CPU)
    assert autocast_dtype("auto", CPU) is None and autocast_dtype("fp32", CPU) is None


def test_bf16_refused_before_the_run_creates_its_wandb_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """train.py with the default W&B logger: the refusal comes before W&B starts, so the run folder holds the
    failed status and the error, and no empty W&B run."""
    monkeypatch.setattr(device, "cpu_bf16_attention_error", lambda: "pack_vnni2 is only supported when x")
    monkeypatch.setenv("WANDB_MODE", "offline")
    run = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"precision=bf16"):
        run_main(["+experiment=tiny", "logger=wandb", "train.precision=bf16"], run)
    assert json.loads((run / "results.json").read_text())["status"] == "failed"
    assert not (run / "wandb").exists() and not (run / "wandb_run_id.txt").exists()
