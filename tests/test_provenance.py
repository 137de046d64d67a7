"""Provenance: the code, packages and CPU kernels a run records, and what a resumed run keeps of its start."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from posab.provenance import (
    PACKAGES,
    claims_files,
    cpu_capability,
    cpu_model,
    math_isa,
    package_versions,
    start_provenance,
)

NOW = {"git_commit": "b" * 40, "git_dirty": False}


CODE_START = ("git_commit_start", "git_dirty_start")


def test_a_fresh_run_starts_with_the_code_it_runs() -> None:
    start = start_provenance(NOW, None)
    assert {k: start[k] for k in CODE_START} == {"git_commit_start": "b" * 40, "git_dirty_start": False}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", start["started_at"])
    assert start["claims_files_start"] == claims_files()  # this checkout's registrations, now
    assert start["git_untracked_start"] is None or isinstance(start["git_untracked_start"], str)


def test_a_resumed_run_keeps_the_commit_it_started_with(tmp_path: Path) -> None:
    earlier = tmp_path / "results.json"
    first = {"started_at": "2026-01-01T00:00:00Z", "claims_files_start": "x.csv:0", "git_untracked_start": ""}
    earlier.write_text(
        json.dumps({"git_commit": "a" * 40, "git_dirty": True, "status": "preempted", **first})
    )
    start = start_provenance(NOW, earlier)
    assert {k: start[k] for k in CODE_START} == {"git_commit_start": "a" * 40, "git_dirty_start": True}
    assert {k: start[k] for k in first} == first  # when and under which registrations it first started
    # resumed twice: the first start survives the second resume's results.json
    second = {"git_commit": "c" * 40, "git_commit_start": "a" * 40, "git_dirty_start": True}
    earlier.write_text(json.dumps(second))
    assert start_provenance(NOW, earlier)["git_commit_start"] == "a" * 40


def test_a_resumed_run_without_earlier_results_starts_now(tmp_path: Path) -> None:
    assert start_provenance(NOW, tmp_path / "missing.json")["git_commit_start"] == "b" * 40


def test_the_claims_files_are_named_with_a_hash_of_their_text(tmp_path: Path) -> None:
    folder = tmp_path / "results" / "study" / "claims" / "pending"
    folder.mkdir(parents=True)
    (folder / "part11.csv").write_text("family,row\n")
    (folder.parent / "verdicts.csv").write_text("an output, not a registration\n")
    before = claims_files(tmp_path)
    assert before == "results/study/claims/pending/part11.csv:" + before.rsplit(":", 1)[1]
    (folder / "part11.csv").write_text("family,row\nedited\n")
    assert claims_files(tmp_path) != before and claims_files(tmp_path / "nowhere") == ""


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
