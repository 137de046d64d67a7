"""The code's shape the developers' guide asks for: short functions (none over 50 lines) in the package."""

from __future__ import annotations

import ast

from conftest import ROOT

LONGEST = 50  # lines, decorators excluded, docstring included


def test_no_function_is_longer_than_fifty_lines() -> None:
    long: list[str] = []
    for path in sorted((ROOT / "src").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if lines > LONGEST:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, f"functions over {LONGEST} lines: {long}"
