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

from posab.config import Config, load_config
from posab.data import prepare_data
from posab.encodings import build_encoding
from posab.logging import JsonlLogger, Logger, MultiLogger
from posab.model import DecoderLM
from posab.train import Trainer, resolve_device

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


def _train(cfg: Config, run_dir: Path, logger: Logger) -> dict[str, Any]:
    seed_everything(cfg.seed)
    device = resolve_device(cfg.train.device)
    data = prepare_data(cfg.data)
    model = build_model(cfg, data.vocab_size).to(device)
    trainer = Trainer(
        model, data.streams["train"], data.streams["valid"], cfg.train, cfg.seed, logger, device
    )
    result = trainer.fit()
    torch.save(
        {
            "model": model.state_dict(),
            "config": OmegaConf.to_container(OmegaConf.structured(cfg)),
            "step": result.steps,
        },
        run_dir / "checkpoint.pt",
    )
    return {
        "train": asdict(result),
        "train_loss": result.train_loss,
        "val_loss": result.val_loss,
        "tokens_per_s": result.tokens_per_s,
        "params": model.parameter_counts(),
        "device": str(device),
        "precision": "bf16" if trainer.dtype == torch.bfloat16 else "fp32",
        "data": {"cache": str(data.cache_dir.name), "tokens": {s: len(st) for s, st in data.streams.items()}},
    }
