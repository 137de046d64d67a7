"""Re-evaluate a finished run without retraining: `posab evaluate`.

    posab evaluate outputs/runs/RUN eval.lengths=[512,1024,2048,4096,8192]
    posab evaluate RUN eval.perplexity.stride=256 eval.needle.enabled=false --out DIR

Overrides may change `eval.*`, `train.device`, `train.precision`, where the data is (`data.path`,
`data.cache_dir`), `encoding.clamp` between values that never act in training (null, `train`) and
`encoding.input` between inputs that training cannot tell apart (`fire`, `fire_held`); the results go to
RUN/eval/<time>/ (or --out DIR), and the run's end-of-run table is printed for them.
With --as-run, --out DIR becomes a run directory of the changed configuration that the report reads:

    posab evaluate RUN encoding.clamp=train --as-run --out sweeps/arm/RUN_clamp
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from posab.build import build_model, encoding_name
from posab.config import Config, load_config
from posab.data import prepare_data
from posab.device import autocast_dtype, resolve_device
from posab.encodings.multiscale import clamp_distance
from posab.errors import ConfigError
from posab.io import write_json
from posab.logging import JsonlLogger
from posab.run.directory import CHECKPOINTS, load_model_state
from posab.run.evaluations import check_eval_lengths, eval_context, eval_split, evaluate
from posab.run.summary import summary_text
from posab.run.wiring import CODE  # the code this process runs, read once

REEVAL_PREFIXES = (
    "eval.",
    "train.device=",
    "train.precision=",
    "data.cache_dir=",
    "data.path=",
    "encoding.clamp=",
    "encoding.input=",
)
# inputs of the multi-scale bias that agree at every query below the training length (they differ past it)
SAME_IN_TRAINING = ({"fire", "fire_held"},)


def reevaluate(run_dir: Path, overrides: list[str], out_dir: Path, as_run: bool = False) -> dict[str, Any]:
    """Evaluate a finished run's checkpoint again, with other evaluation settings, without retraining;
    the results, metrics and evaluators' files go into `out_dir`. `as_run`: make `out_dir` a run directory
    of the changed configuration (`write_as_run`), which the report reads like any other."""
    bad = [o for o in overrides if not o.startswith(REEVAL_PREFIXES)]
    if bad:
        raise ConfigError(f"cannot change {bad} when re-evaluating; allowed: {', '.join(REEVAL_PREFIXES)}")
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"run_dir='{run_dir}' holds no config.yaml (is it a run directory?)")
    if as_run and out_dir.resolve().is_relative_to(run_dir.resolve()):
        raise ConfigError(
            f"--out {out_dir} lies inside {run_dir}: a re-evaluation as a run needs its own folder"
        )
    saved = OmegaConf.load(run_dir / "config.yaml")
    merged = OmegaConf.merge(saved, OmegaConf.from_dotlist(overrides))
    cfg = load_config(merged)  # type: ignore[arg-type]
    staged = (run_dir / CHECKPOINTS["passkey"]).is_file()  # the needle measured the stage's model
    check_clamp_unchanged_in_training(saved, cfg, staged)
    check_input_unchanged_in_training(saved, cfg, staged)
    device = resolve_device(cfg.train.device)
    data = prepare_data(cfg.data)
    check_eval_lengths(cfg, eval_split(cfg, data))
    model = build_model(cfg, data.vocab_size).to(device)
    ctx = eval_context(cfg, model, data, device, autocast_dtype(cfg.train.precision, device))
    out_dir.mkdir(parents=True, exist_ok=True)
    if as_run:
        shutil.copyfile(run_dir / "metrics.jsonl", out_dir / "metrics.jsonl")  # the training curve
    logger = JsonlLogger(out_dir / "metrics.jsonl")
    results: dict[str, Any] = {}
    for after_stage, kind in ((False, "latest"), (True, "passkey")) if staged else ((None, "latest"),):
        load_model_state(
            cfg, model, run_dir / CHECKPOINTS[kind], checked_elsewhere=("encoding.clamp", "encoding.input")
        )
        results.update(evaluate(ctx, out_dir, logger, step=0, after_stage=after_stage))
    logger.finish("finished")
    if as_run:
        write_as_run(run_dir, merged, overrides, results, out_dir)
    else:
        write_json(out_dir / "results.json", {"overrides": overrides, "eval": results})
    return results


def check_clamp_unchanged_in_training(saved: DictConfig, cfg: Config, staged: bool) -> None:
    """`encoding.clamp` may change on re-evaluation only between values that never act in training: none,
    or a reach of at least the longest training distance (train.seq_len - 1), where the clamped and the
    unclamped bias train the same weights. A passkey stage trains longer windows: no change then."""
    before, after = OmegaConf.select(saved, "encoding.clamp"), cfg.encoding.get("clamp")
    if before == after:
        return
    longest = cfg.train.seq_len - 1
    reaches = [clamp_distance(value, cfg.train.seq_len, encoding_name(cfg)) for value in (before, after)]
    if staged or any(reach is not None and reach < longest for reach in reaches):
        raise ConfigError(
            f"encoding.clamp {before!r} -> {after!r} would have changed training (it acts below the longest "
            f"training distance {longest}{', or in the passkey stage' if staged else ''}); allowed when "
            f"both are null, 'train' or >= {longest} and the run has no passkey stage"
        )


def check_input_unchanged_in_training(saved: DictConfig, cfg: Config, staged: bool) -> None:
    """`encoding.input` may change on re-evaluation only between inputs that agree at every query below the
    training length (`SAME_IN_TRAINING`), and not for a run with a passkey stage (longer windows)."""
    before, after = OmegaConf.select(saved, "encoding.input"), cfg.encoding.get("input")
    if before == after:
        return
    if staged or not any({before, after} <= same for same in SAME_IN_TRAINING):
        allowed = " or ".join(" <-> ".join(sorted(same)) for same in SAME_IN_TRAINING)
        raise ConfigError(
            f"encoding.input {before!r} -> {after!r} would have changed training; allowed: {allowed}, for a "
            "run without a passkey stage"
        )


def write_as_run(
    run_dir: Path, config: DictConfig, overrides: list[str], results: dict[str, Any], out_dir: Path
) -> None:
    """`out_dir` as a run directory: the configuration with `overrides`, the run's own record (training,
    provenance) with the new `eval`, and `reevaluated` naming the run, the overrides and this code."""
    record = json.loads((run_dir / "results.json").read_text())
    record["overrides"] = ",".join(o for o in [record.get("overrides", ""), *overrides] if o)
    record["eval"] = results
    record["reevaluated"] = {"from": run_dir.name, "overrides": overrides, **CODE}
    record.pop("backfilled", None)  # every evaluator ran again
    OmegaConf.save(config, out_dir / "config.yaml")
    write_json(out_dir / "results.json", record)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="posab evaluate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", type=Path, help="a finished run's directory (config.yaml, checkpoint.pt)")
    parser.add_argument(
        "overrides", nargs="*", help="KEY=VALUE: eval.*, train.*, data.*, encoding.clamp, encoding.input"
    )
    parser.add_argument("--out", type=Path, help="folder for the results (default RUN_DIR/eval/<time>)")
    parser.add_argument(
        "--as-run", action="store_true", help="write --out as a run directory (config, record, curve)"
    )
    return parser.parse_intermixed_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    out = args.out or args.run_dir / "eval" / time.strftime("%Y-%m-%d_%H-%M-%S")
    if args.as_run and args.out is None:
        print("error: --as-run needs --out DIR, a folder outside the run", file=sys.stderr)
        return 2
    try:
        results = reevaluate(args.run_dir, args.overrides, out, as_run=args.as_run)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(summary_text({"eval": results}, out))
    return 0
