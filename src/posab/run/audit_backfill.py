"""The audit's keys that a run made before they existed lacks, derived from what the run saved.

    posab audit-backfill RUN_DIR [RUN_DIR ...]

- The pull past the training length (`audit/bias_pull@L`): from the run's saved bias curve
  (`extrapolation_bias.npz`, written by every audited run) through the evaluator's own `pull_scalars`.
- The input novelty (`audit/novelty_*@L`, `novelty_near` among them): from the run's own encoding, built
  from its config.yaml with its checkpoint's weights, through the evaluator's own `input_novelty` and
  `novelty_scalars`, rounded to the precision the run evaluated in (results.json `precision`). Needs the
  checkpoint (`checkpoint.pt`) and an MLP bias.

Both at the run's `eval.lengths`. The keys the run lacks are added to its results.json `eval` (keys it has
are left as they are) and listed under `backfilled` with this module's name (before the novelty was added
here, `posab.evaluate.pull_backfill`), so a reader can tell a measured number from one derived later. The
numbers are the ones the evaluator would have written: the curve is the array it computed them from, and
the encoding is the one it audited.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from posab.build import model_dims
from posab.config import Config, load_config
from posab.device import autocast_dtype
from posab.encodings import Encoding, build_encoding
from posab.evaluate.extrapolation import input_novelty, novelty_scalars, pull_scalars
from posab.io import write_json
from posab.run.directory import CHECKPOINTS, load_checkpoint

CURVE_FILE = "extrapolation_bias.npz"
ENCODING_PREFIX = "encoding."  # the encoding's parameters and buffers in the model's state dict
CPU = torch.device("cpu")


def pull_keys(run_dir: Path, lengths: list[int]) -> dict[str, float]:
    """The pull at `lengths` from the saved curve; {} without one."""
    curve_file = run_dir / CURVE_FILE
    if not curve_file.is_file():
        return {}
    with np.load(curve_file) as arrays:
        bias, train_len = torch.from_numpy(arrays["bias"]), int(arrays["train_len"])
    return pull_scalars(bias, train_len, lengths)


def run_encoding(cfg: Config, checkpoint: Path) -> Encoding:
    """The run's encoding with the checkpoint's weights."""
    encoding = build_encoding(cfg.encoding, model_dims(cfg))
    state = load_checkpoint(checkpoint)["model"]
    start = len(ENCODING_PREFIX)
    encoding.load_state_dict({k[start:]: v for k, v in state.items() if k.startswith(ENCODING_PREFIX)})
    return encoding


def novelty_keys(run_dir: Path, saved: DictConfig, precision: str) -> dict[str, float]:
    """The input novelty at the run's `eval.lengths` of its own encoding (`saved`: its config.yaml); {}
    without a checkpoint or an MLP bias."""
    checkpoint = run_dir / CHECKPOINTS["latest"]
    if not checkpoint.is_file():
        return {}
    cfg = load_config(saved)  # type: ignore[arg-type]
    encoding, train_len = run_encoding(cfg, checkpoint), cfg.train.seq_len
    found = input_novelty(encoding, train_len, list(cfg.eval.lengths), CPU, autocast_dtype(precision, CPU))
    return {} if found is None else novelty_scalars(found, train_len)


def backfill_run(run_dir: Path) -> list[str]:
    """Add the missing audit keys to `run_dir`'s results.json; returns the keys added."""
    results_file = run_dir / "results.json"
    if not results_file.is_file():
        return []
    saved = OmegaConf.load(run_dir / "config.yaml")
    lengths = [int(n) for n in saved.eval.lengths]
    results: dict[str, Any] = json.loads(results_file.read_text())
    evaluated = results.setdefault("eval", {})
    derived = pull_keys(run_dir, lengths) | novelty_keys(run_dir, saved, results.get("precision", "fp32"))
    added = {k: v for k, v in derived.items() if k not in evaluated}
    if added:
        evaluated.update(added)
        results.setdefault("backfilled", {})[__name__] = sorted(added)
        write_json(results_file, results)
    return sorted(added)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="posab audit-backfill", description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories (config.yaml, results.json)")
    args = parser.parse_args(argv)
    missing = [d for d in args.run_dirs if not (d / "results.json").is_file()]
    if missing:
        print(f"error: no results.json in {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    for run_dir in args.run_dirs:
        added = backfill_run(run_dir)
        print(f"{run_dir}: {len(added)} keys added" + ("" if added else " (none missing, or nothing saved)"))
    return 0
