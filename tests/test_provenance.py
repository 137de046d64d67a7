"""Provenance: the code, packages and CPU kernels a run records, and what a resumed run keeps of its start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from posab.provenance import (
    PACKAGES,
    cpu_capability,
    cpu_model,
    math_isa,
    package_versions,
    start_provenance,
)

NOW = {"git_commit": "b" * 40, "git_dirty": False}


def test_a_fresh_run_starts_with_the_code_it_runs() -> None:
    assert start_provenance(NOW, None) == {"git_commit_start": "b" * 40, "git_dirty_start": False}


def test_a_resumed_run_keeps_the_commit_it_started_with(tmp_path: Path) -> None:
    earlier = tmp_path / "results.json"
    earlier.write_text(json.dumps({"git_commit": "a" * 40, "git_dirty": True, "status": "preempted"}))
    assert start_provenance(NOW, earlier) == {"git_commit_start": "a" * 40, "git_dirty_start": True}
    # resumed twice: the first start survives the second resume's results.json
    second = {"git_commit": "c" * 40, "git_commit_start": "a" * 40, "git_dirty_start": True}
    earlier.write_text(json.dumps(second))
    assert start_provenance(NOW, earlier)["git_commit_start"] == "a" * 40


def test_a_resumed_run_without_earlier_results_starts_now(tmp_path: Path) -> None:
    assert start_provenance(NOW, tmp_path / "missing.json")["git_commit_start"] == "b" * 40


def test_versions_and_cpu_capability() -> None:
    versions = package_versions()
    assert set(versions) == set(PACKAGES)
    assert versions["torch"] == torch.__version__
    assert cpu_capability() in {"DEFAULT", "AVX2", "AVX512", "ZVECTOR", "VSX", "SVE256", "NO AVX"}


def test_the_cpu_model_is_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9R14\n\nprocessor\t: 1")
    assert cpu_model(info) == "AMD EPYC 9R14"
    info.write_text("processor\t: 0\n")  # some architectures name no model
    assert cpu_model(info) == "" and cpu_model(tmp_path / "missing") == ""


def test_the_math_libraries_isa_settings_are_recorded_since_torchs_capability_does_not_bind_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16\n")
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS", raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    line = math_isa(info)
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in line and "MKL_ENABLE_INSTRUCTIONS=unset" in line
    assert line.endswith("cpu: avx2 avx512f avx512_bf16") and "oneDNN v" in line
    assert math_isa(tmp_path / "missing").endswith("cpu: ")
