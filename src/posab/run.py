"""The only module that wires things together: config -> data -> model -> training -> results."""

from __future__ import annotations

import json
import logging
import os
import platform
import random
import subprocess
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from posab.checkpoint import config_container, load_checkpoint, save_checkpoint
from posab.config import Config, load_config
from posab.data import TokenStream, prepare_data
from posab.encodings import build_encoding
from posab.errors import ConfigError
from posab.evaluate import EvalContext, run_evaluations
from posab.evaluate.needle import needle_heatmap
from posab.logging import JsonlLogger, Logger, MultiLogger
from posab.model import DecoderLM
from posab.train import Trainer, autocast_dtype, resolve_device

log = logging.getLogger(__name__)


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write JSON to a temporary file beside `path`, then rename it (readers never see half a file)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, default=str)
    os.replace(tmp, path)


def git_commit() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True, timeout=10
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_model(cfg: Config, vocab_size: int) -> DecoderLM:
    encoding = build_encoding(cfg.encoding, DecoderLM.dims(cfg.model))
    return DecoderLM(cfg.model, vocab_size, encoding)


def encoding_name(cfg: Config) -> str:
    return str(cfg.encoding.get("name") or cfg.encoding["_target_"].rsplit(".", 1)[-1].lower())


def build_loggers(run_dir: Path) -> Logger:
    return MultiLogger([JsonlLogger(run_dir / "metrics.jsonl")])


def main(raw_cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Train and evaluate one configuration; everything is written into `run_dir`."""
    cfg = load_config(raw_cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(raw_cfg, resolve=True))
    started = time.time()
    results: dict[str, Any] = {
        "status": "running",
        "encoding": encoding_name(cfg),
        "seed": cfg.seed,
        "experiment": cfg.experiment,
        "git_commit": git_commit(),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
    }
    write_json(run_dir / "results.json", results)
    logger = build_loggers(run_dir)
    status = "failed"
    try:
        results.update(_train(cfg, run_dir, logger))
        status = "finished"
    except Exception as err:
        results["error"] = f"{type(err).__name__}: {err}"
        raise
    finally:
        results["status"] = status
        results["wall_time_s"] = round(time.time() - started, 2)
        write_json(run_dir / "results.json", results)
        logger.finish(status)
    return results


def check_eval_lengths(cfg: Config, valid: TokenStream) -> None:
    """Fail before training when the validation split cannot supply an evaluation length."""
    lengths = set(cfg.eval.lengths) | set(cfg.eval.needle.lengths or [])
    too_long = sorted(n for n in lengths if valid.windows_available(n) == 0)
    if too_long:
        raise ConfigError(
            f"eval length(s) {too_long} longer than the validation split can supply: it has {len(valid)} "
            f"tokens, a window of L tokens needs L+1; use eval.lengths up to {len(valid) - 1} or more data"
        )


def _train(cfg: Config, run_dir: Path, logger: Logger) -> dict[str, Any]:
    seed_everything(cfg.seed)
    device = resolve_device(cfg.train.device)
    data = prepare_data(cfg.data)
    check_eval_lengths(cfg, data.streams["valid"])
    model = build_model(cfg, data.vocab_size).to(device)
    trainer = Trainer(model, data, cfg, logger, device)
    result = trainer.fit()
    state = {"model": model.state_dict(), "config": config_container(cfg), "step": result.steps}
    save_checkpoint(run_dir / "checkpoint.pt", state)
    summary = {
        "train": asdict(result),
        "train_loss": result.train_loss,
        "val_loss": result.val_loss,
        "tokens_per_s": result.tokens_per_s,
        "params": model.parameter_counts(),
        "device": str(device),
        "precision": "bf16" if trainer.dtype == torch.bfloat16 else "fp32",
        "data": {"cache": str(data.cache_dir.name), "tokens": {s: len(st) for s, st in data.streams.items()}},
    }
    ctx = EvalContext(
        model, data.tokenizer, data.streams["valid"], device, trainer.dtype, cfg.train.seq_len, cfg.eval
    )
    summary["eval"] = evaluate(ctx, run_dir, logger, step=result.steps, title=encoding_name(cfg))
    return summary


def evaluate(ctx: EvalContext, run_dir: Path, logger: Logger, step: int, title: str) -> dict[str, Any]:
    """Run the evaluators, log their scalars, draw the needle heatmap; returns every result."""
    results = run_evaluations(ctx)
    logger.log({k: v for k, v in results.items() if isinstance(v, int | float)}, step)
    if "needle/grid" in results:
        needle_heatmap(results["needle/grid"], run_dir / "needle_heatmap.png", title)
    return results


REEVAL_PREFIXES = ("eval.", "train.device=", "train.precision=", "data.cache_dir=", "data.path=")


def reevaluate(run_dir: Path, overrides: list[str], out_dir: Path | None = None) -> dict[str, Any]:
    """Evaluate a finished run's checkpoint again, with other evaluation settings, without retraining."""
    bad = [o for o in overrides if not o.startswith(REEVAL_PREFIXES)]
    if bad:
        raise ConfigError(f"cannot change {bad} when re-evaluating; allowed: {', '.join(REEVAL_PREFIXES)}")
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"run_dir='{run_dir}' holds no config.yaml (is it a run directory?)")
    saved = OmegaConf.load(run_dir / "config.yaml")
    cfg = load_config(OmegaConf.merge(saved, OmegaConf.from_dotlist(overrides)))  # type: ignore[arg-type]
    device = resolve_device(cfg.train.device)
    data = prepare_data(cfg.data)
    check_eval_lengths(cfg, data.streams["valid"])
    model = build_model(cfg, data.vocab_size)
    model.load_state_dict(load_checkpoint(run_dir / "checkpoint.pt")["model"])
    model.to(device)
    dtype = autocast_dtype(cfg.train.precision, device)
    ctx = EvalContext(
        model, data.tokenizer, data.streams["valid"], device, dtype, cfg.train.seq_len, cfg.eval
    )
    out_dir = out_dir or run_dir / "eval" / time.strftime("%Y-%m-%d_%H-%M-%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    logger = JsonlLogger(out_dir / "metrics.jsonl")
    results = evaluate(ctx, out_dir, logger, step=0, title=encoding_name(cfg))
    logger.finish("finished")
    write_json(out_dir / "results.json", {"overrides": overrides, "eval": results})
    return results
