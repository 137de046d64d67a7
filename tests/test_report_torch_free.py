"""`posab report` needs no torch (issue 57): the report and the evaluators' column catalog import none of
it, and the report never imports the studies built on it (`posab.studies`)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, isolated_env

TORCH_FREE = ("posab.report", "posab.catalog")
BLOCKER = 'raise ImportError("torch is blocked here: this code must not import it")\n'
COMMITTED = ROOT / "results" / "study" / "budget"  # a committed report folder: 6 runs, read from runs.csv


def blocked_env(root: Path) -> dict[str, str]:
    """The tests' environment with a `torch` package first on the path whose import fails."""
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text(BLOCKER)
    env = isolated_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    return env


def modules_of(package: str) -> list[str]:
    folder = ROOT / "src" / Path(*package.split("."))
    return [f"{package}.{path.stem}" for path in sorted(folder.glob("*.py")) if path.stem != "__init__"]


@pytest.mark.e2e
def test_posab_report_runs_where_importing_torch_fails(tmp_path: Path) -> None:
    env = blocked_env(tmp_path / "blocked")
    probe = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "torch is blocked" in probe.stderr  # the block works
    out = tmp_path / "report"
    command = [sys.executable, "-m", "posab", "report", str(COMMITTED), "--out", str(out)]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    header = next(line for line in (out / "report.md").read_text().splitlines() if "| ppl@" in line)
    assert "| ppl@512 |" in header  # the perplexity evaluator's columns, from the catalog
    assert (out / "ppl_vs_length.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.e2e
def test_every_module_of_the_report_and_the_catalog_imports_without_torch(tmp_path: Path) -> None:
    env = blocked_env(tmp_path / "blocked")
    modules = [m for package in TORCH_FREE for m in [package, *modules_of(package)]]
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    proc = subprocess.run([sys.executable, "-c", code, *modules], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def imported(path: Path) -> set[str]:
    """Every module a file imports (absolute imports, at any depth of the file)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_the_report_does_not_import_the_studies_built_on_it() -> None:
    for package in TORCH_FREE:
        for path in (ROOT / "src" / Path(*package.split("."))).glob("*.py"):
            bad = {n for n in imported(path) if n.startswith(("posab.studies", "posab.evaluate", "torch"))}
            assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
