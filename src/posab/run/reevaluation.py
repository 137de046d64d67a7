"""Re-evaluate a finished run without retraining: `posab evaluate`.

    posab evaluate outputs/runs/RUN eval.lengths=[512,1024,2048,4096,8192]
    posab evaluate RUN eval.perplexity.stride=256 eval.needle.enabled=false --out DIR

Overrides may change `eval.*`, `train.device`, `train.precision`, where the data is (`data.path`,
`data.cache_dir`), and an `encoding.*` setting between values the encoding says training cannot tell
apart (`Encoding.same_in_training`: the multi-scale bias's `clamp` between null, `train` and reaches past
the longest training distance, its `input` between `fire` and `fire_held`), on a run without a passkey
stage; the results go to RUN/eval/<time>/ (or --out DIR), and the run's end-of-run table is printed.
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

from posab.build import build_model
from posab.config import Config, load_config
from posab.data import prepare_data
from posab.device import autocast_dtype, resolve_device
from posab.encodings import encoding_class
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
    "encoding.",
)


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
    changed = check_encoding_unchanged_in_training(saved, cfg, staged)
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
        load_model_state(cfg, model, run_dir / CHECKPOINTS[kind], checked_elsewhere=changed)
        results.update(evaluate(ctx, out_dir, logger, step=0, after_stage=after_stage))
    logger.finish("finished")
    if as_run:
        write_as_run(run_dir, merged, overrides, results, out_dir)
    else:
        write_json(out_dir / "results.json", {"overrides": overrides, "eval": results})
    return results


def check_encoding_unchanged_in_training(saved: DictConfig, cfg: Config, staged: bool) -> tuple[str, ...]:
    """The `encoding.*` keys that differ from the run's, each allowed only where the encoding says the two
    values train the same weights (`Encoding.same_in_training`) and the run has no passkey stage (which
    trains longer windows). Returns them as `encoding.KEY`."""
    before = OmegaConf.to_container(saved.encoding, resolve=True)
    after = dict(cfg.encoding)
    changed = sorted(key for key in set(before) | set(after) if before.get(key) != after.get(key))
    cls = encoding_class(after)
    for key in changed:
        old, new = before.get(key), after.get(key)
        if staged or not cls.same_in_training(key, old, new, cfg.train.seq_len):
            raise ConfigError(
                f"encoding.{key} {old!r} -> {new!r} would have changed training for {cls.__name__} (at "
                f"train.seq_len={cfg.train.seq_len}{', or in the passkey stage' if staged else ''}); "
                "allowed: the changes the encoding's `same_in_training` accepts, without a passkey stage"
            )
    return tuple(f"encoding.{key}" for key in changed)


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
        "overrides",
        nargs="*",
        help="KEY=VALUE: eval.*, train.device, train.precision, data.path, data.cache_dir, encoding.*",
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
