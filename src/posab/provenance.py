"""What a run's numbers depend on besides its config: the code it ran (commit, uncommitted changes), the
installed packages, and the CPU kernels torch dispatches to (which set summation order and bf16 support)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from posab.paths import source_root

# the project's dependencies whose version can change a number (pyproject.toml)
PACKAGES = ("torch", "numpy", "hydra-core", "omegaconf", "datasets", "tokenizers", "wandb", "tqdm")


def _git(*args: str) -> str | None:
    """stdout of a git command in the source tree; None outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", *args], cwd=source_root(), capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def git_commit() -> str:
    """The commit checked out in the source tree now ("unknown" outside a git checkout)."""
    return _git("rev-parse", "HEAD") or "unknown"


def git_dirty() -> bool | None:
    """Whether a tracked file differs from that commit (untracked files are not code); None without git."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status)


def package_versions() -> dict[str, str]:
    """The installed version of each of PACKAGES ("" where one is not installed)."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = ""
    return versions


def cpu_capability() -> str:
    """The CPU kernel set torch uses (DEFAULT, AVX2, AVX512, ...; `ATEN_CPU_CAPABILITY` lowers it)."""
    return str(torch.backends.cpu.get_cpu_capability())


# Environment settings that bind the math libraries' instruction sets: `ATEN_CPU_CAPABILITY` sets torch's
# own kernels only; MKL (matmul) and oneDNN (some convolutions, bf16 matmul) dispatch on their own unless
# these cap them (oneDNN's `ONEDNN_MAX_CPU_ISA` / older `DNNL_MAX_CPU_ISA`; MKL's `MKL_ENABLE_INSTRUCTIONS`,
# and `MKL_CBWR` for reproducible code paths).
ISA_SETTINGS = (
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
    "MKL_CBWR",
)
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")  # the CPU flags those choose among


def math_isa(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """What sets the instruction sets of torch's math libraries: each of ISA_SETTINGS (`unset` where the
    environment leaves it), the MKL and oneDNN versions torch was built with, and which of ISA_FLAGS the CPU
    has, as one line ("ONEDNN_MAX_CPU_ISA=unset ... | MKL 2024.2 | oneDNN v3.12.0 | cpu: avx2 avx512f").
    With a library's setting unset, it uses the best the CPU has, whatever torch's capability says."""
    settings = " ".join(f"{name}={os.environ.get(name, 'unset')}" for name in ISA_SETTINGS)
    built = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version (\S+)", built)
    onednn = re.search(r"MKL-DNN (v[\d.]+)", built)
    try:
        flags = set(
            " ".join(line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")).split()
        )
    except OSError:
        flags = set()
    libraries = [f"MKL {mkl.group(1) if mkl else 'none'}", f"oneDNN {onednn.group(1) if onednn else 'none'}"]
    return " | ".join([settings, *libraries, "cpu: " + " ".join(f for f in ISA_FLAGS if f in flags)])


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (`Intel(R) Xeon(R) Processor`, `AMD EPYC 9R14`): machines of one kind differ in
    it, and with it in speed and kernels; "" where the system does not say (no /proc/cpuinfo)."""
    try:
        lines = cpuinfo.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name") and ":" in line]
    return names[0] if names else ""


def code_provenance() -> dict[str, Any]:
    """The code a process runs: read once at import time of the caller (a Hydra multirun runs every job in
    the process that imported posab, so a commit made while a sweep runs is not its later jobs' code)."""
    return {"git_commit": git_commit(), "git_dirty": git_dirty()}


# The claims files a run's preregistration is checked against (results/study/claims/, its pending/ folder,
# the task suite's claims.csv), relative to the source root
CLAIMS_GLOBS = ("results/study/claims/**/*.csv", "results/tasks/claims*.csv")
CLAIMS_OUTPUTS = ("verdicts.csv",)  # written by `posab claims`, not a registration
UNTRACKED_SCOPE = ("conf", "src", "train.py")  # where an untracked file can change what a run does


def claims_files(root: Path | None = None) -> str:
    """`path:sha256[:12]` of every claims file present now (CLAIMS_GLOBS), sorted and `;`-joined: which
    registrations existed when a run started, and their exact text ("" where there are none)."""
    root = root or source_root()
    paths = sorted({p for pattern in CLAIMS_GLOBS for p in root.glob(pattern) if p.is_file()})
    return ";".join(
        f"{p.relative_to(root).as_posix()}:{hashlib.sha256(p.read_bytes()).hexdigest()[:12]}"
        for p in paths
        if p.name not in CLAIMS_OUTPUTS
    )


def untracked_files() -> str | None:
    """The untracked files under UNTRACKED_SCOPE (a config file not yet committed changes what a run does,
    which `git_dirty` does not see), `;`-joined; None without git."""
    status = _git("status", "--porcelain", "--untracked-files=all", "--", *UNTRACKED_SCOPE)
    if status is None:
        return None
    return ";".join(line[3:] for line in status.splitlines() if line.startswith("??"))


def utc_now() -> str:
    """The time now in UTC, to the second, ISO 8601 (`2026-12-06T07:01:02Z`)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def start_provenance(now: dict[str, Any], resumed_results: Path | None) -> dict[str, Any]:
    """What a run started with: `git_commit_start` / `git_dirty_start` (its code), `started_at` (UTC),
    `claims_files_start` (the claims files then, `claims_files`) and `git_untracked_start`
    (`untracked_files`). A resumed run keeps them from its earlier results.json (`resumed_results`), and its
    `git_commit` is then the code it resumed with."""
    before: dict[str, Any] = {}
    if resumed_results is not None and resumed_results.is_file():
        before = json.loads(resumed_results.read_text())
    return {
        "git_commit_start": before.get("git_commit_start", before.get("git_commit", now["git_commit"])),
        "git_dirty_start": before.get("git_dirty_start", before.get("git_dirty", now["git_dirty"])),
        "started_at": before.get("started_at", utc_now()),
        "claims_files_start": before.get("claims_files_start", claims_files()),
        "git_untracked_start": before.get("git_untracked_start", untracked_files()),
    }
