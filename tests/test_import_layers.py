"""The import graph of `posab` runs one way: each module imports only from its own layer or below, the
graph has no cycle, and the bottom layer (result helpers, outputs, plots) needs no torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "src" / "posab"
# Bottom to top. A module is named by its dotted path below posab; a package (`encodings`) covers its
# submodules, except those listed by their own name (`run.summary`, `passkey.stage`).
LAYERS: list[set[str]] = [
    {"errors", "io", "results", "paths", "outputs", "plots", "content_statistics", "keys", "catalog"}
    | {"job_names", "run.summary"},  # no torch
    {"device", "distributed", "positions", "forms", "encodings", "cache", "data", "provenance", "passkey"},
    {"layers"},  # the model's optional layers (SSMax, Canon), below it
    {"model"},
    {"training", "logging", "wandb_logger", "passkey.mix", "passkey.stage", "decoding"},  # training, decoding
    {"evaluate"},
    {"config"},  # assembles the sections
    {"build", "sweep_lists"},  # models from configs; the presets' encoding lists, from encodings built
    {"run", "report", "bench", "cli", "__main__"},  # entry points: run, report, benchmark, `posab`
    {"studies"},  # the studies' commands, on top of the report (which never imports them)
]
TORCH_FREE = sorted(LAYERS[0])


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The posab modules a file imports, anywhere in it (below posab., package __init__ as the package)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("posab"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("posab")}
    return {name.removeprefix("posab").removeprefix(".") for name in found} - {""}


def layer_of(module: str) -> int:
    """The layer naming the module itself, else the one naming its top-level package."""
    for name in (module, module.split(".")[0]):
        for index, layer in enumerate(LAYERS):
            if name in layer:
                return index
    raise AssertionError(f"posab.{module} is in no layer: add it to LAYERS")


GRAPH = {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_down(module: str) -> None:
    upward = sorted(m for m in GRAPH[module] if layer_of(m) > layer_of(module))
    assert not upward, f"posab.{module} (layer {layer_of(module)}) imports higher layers: {upward}"


def test_no_cycles() -> None:
    """Depth-first search over the module graph (a package's __init__ and its submodules are one node
    each); a cycle is reported with its path."""
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(GRAPH.get(module, set())):
            if target == module or module.startswith(target + "."):  # a submodule's own package
                continue
            if state.get(target) == "open":
                raise AssertionError(f"import cycle: {' -> '.join([*path, module, target])}")
            if target not in state:
                visit(target, [*path, module])
        state[module] = "done"

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [])


@pytest.mark.e2e
def test_the_bottom_layer_needs_no_torch() -> None:
    code = f"import sys\nfor m in {TORCH_FREE!r}:\n    __import__('posab.' + m)\n"
    code += "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False", "a torch-free module imports torch"
