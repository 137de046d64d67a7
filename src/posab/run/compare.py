"""`posab compare-runs BEFORE AFTER`: hold two folders of runs to each other (scripts/bit_identity.sh's:
the tiny grid at two commits): every run of one has a run of the same name in the other, and every number
their results.json files record is identical, but timings (wall time, throughput, per-evaluator times) and
where and when they ran. Prints each difference; exits 1 when there is one. Needs no torch.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

IGNORED_PREFIXES = ("time/", "machine", "git_", "started_at", "claims_files_start", "resumed_from_step")
IGNORED_KEYS = {"data", "versions", "math_isa"}  # the token cache's folder, the packages, the ISA
SECONDS = "_s"  # a key ending so is a duration or a rate per second (`wall_time_s`, `tokens_per_s`)


def numbers(value: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a results.json, flattened to `a/b/c` keys, without timings and provenance."""
    if isinstance(value, dict):
        found: dict[str, Any] = {}
        for key, item in value.items():
            name = f"{prefix}/{key}" if prefix else str(key)
            if (
                str(key) in IGNORED_KEYS
                or str(key).startswith(IGNORED_PREFIXES)
                or str(key).endswith(SECONDS)
            ):
                continue
            found.update(numbers(item, name))
        return found
    return {prefix: value}


def runs(folder: Path) -> dict[str, dict[str, Any]]:
    return {
        str(path.parent.relative_to(folder)): numbers(json.loads(path.read_text()))
        for path in sorted(folder.rglob("results.json"))
    }


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2 or not all(Path(a).is_dir() for a in argv):
        print("usage: posab compare-runs BEFORE AFTER   (two folders of runs)", file=sys.stderr)
        return 2
    before, after = runs(Path(argv[0])), runs(Path(argv[1]))
    differences = [f"only in {argv[0]}: {name}" for name in sorted(set(before) - set(after))]
    differences += [f"only in {argv[1]}: {name}" for name in sorted(set(after) - set(before))]
    compared = 0
    for name in sorted(set(before) & set(after)):
        one, other = before[name], after[name]
        for key in sorted(set(one) | set(other)):
            compared += 1
            if one.get(key) != other.get(key):
                differences.append(f"{name}: {key}: {one.get(key)!r} -> {other.get(key)!r}")
    print("\n".join(differences) if differences else f"identical: {len(before)} runs, {compared} numbers")
    return 1 if differences else 0
