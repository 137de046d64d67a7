"""The audit's pull past the training length (`audit/bias_pull@L`) for runs made before the audit had it.

    posab audit-backfill RUN_DIR [RUN_DIR ...]

Each run directory's saved bias curve (`extrapolation_bias.npz`, written by every audited run) goes through
the evaluator's own `pull_scalars`, at the run's `eval.lengths`; the keys the run lacks are added to its
results.json `eval` (keys it has are left as they are) and listed under `backfilled` with this module's
name, so a reader can tell a measured number from one derived later from a saved array. The numbers are
the ones the evaluator would have written: the curve is the array it computed them from.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from posab.evaluate.extrapolation import pull_scalars
from posab.io import write_json

CURVE_FILE = "extrapolation_bias.npz"


def backfill_run(run_dir: Path) -> list[str]:
    """Add the missing pull keys to `run_dir`'s results.json; returns the keys added (none without a
    saved curve or past-T lengths)."""
    curve_file, results_file = run_dir / CURVE_FILE, run_dir / "results.json"
    if not curve_file.is_file() or not results_file.is_file():
        return []
    with np.load(curve_file) as arrays:
        bias, train_len = torch.from_numpy(arrays["bias"]), int(arrays["train_len"])
    lengths = [int(n) for n in OmegaConf.load(run_dir / "config.yaml").eval.lengths]
    results = json.loads(results_file.read_text())
    evaluated = results.setdefault("eval", {})
    added = {k: v for k, v in pull_scalars(bias, train_len, lengths).items() if k not in evaluated}
    if added:
        evaluated.update(added)
        results.setdefault("backfilled", {})[__name__] = sorted(added)
        write_json(results_file, results)
    return sorted(added)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="posab audit-backfill", description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories with extrapolation_bias.npz")
    args = parser.parse_args(argv)
    missing = [d for d in args.run_dirs if not (d / "results.json").is_file()]
    if missing:
        print(f"error: no results.json in {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    for run_dir in args.run_dirs:
        added = backfill_run(run_dir)
        print(f"{run_dir}: {len(added)} keys added" + ("" if added else " (none missing, or no saved curve)"))
    return 0
