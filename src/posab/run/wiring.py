"""The wiring: `main` (config -> data -> model -> training -> evaluation -> results) and `reevaluate` (a
finished run's checkpoint -> evaluation). The run directory (checkpoints, resume) is `posab.run.directory`'s;
the evaluations, the passkey stage between them and their files are `posab.run.evaluations`'."""

from __future__ import annotations

import os
import platform
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from posab.build import build_model, encoding_name
from posab.config import Config, config_container, load_config
from posab.data import CorpusData, TrainSampler, prepare_data, save_run_tokenizer
from posab.device import autocast_dtype, resolve_device
from posab.distributed import World, barrier, world
from posab.encodings import encoding_optimizer
from posab.errors import ConfigError, Preempted, require
from posab.io import write_json
from posab.logging import JsonlLogger, Logger, MultiLogger, NullLogger
from posab.passkey.mix import KeyLossMeter, PasskeyMix
from posab.provenance import (
    code_provenance,
    cpu_capability,
    cpu_model,
    math_isa,
    package_versions,
    start_provenance,
)
from posab.run.directory import (
    CHECKPOINTS,
    keep_finished_run,
    load_initial_model,
    parent_run,
    previous_wandb_id,
    resume_state,
    save_checkpoint,
)
from posab.run.evaluations import (
    check_eval_lengths,
    check_stage_lengths,
    corpus_streams,
    eval_context,
    eval_split,
    evaluate,
    evaluate_around_stage,
)
from posab.run.summary import summary_text
from posab.training import Trainer
from posab.wandb_logger import WandbLogger

# The code this process runs: read once, when the code is imported. A Hydra multirun imports posab once and
# runs every job in that process, so a commit made while a sweep runs is not the code of its later jobs.
CODE = code_provenance()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass(frozen=True)
class JobInfo:
    """What Hydra knows about the job: filled by train.py, defaults for a plain call."""

    multirun: bool = False
    override_dirname: str = ""  # e.g. "encoding=alibi,seed=1" in a multirun
    sweep_name: str | None = None  # the sweep folder's name in a multirun
    parallel_jobs: int = 1  # jobs the launcher runs at once on this machine


def run_name(cfg: Config, job: JobInfo) -> str:
    """`<encoding>-s<seed>`, plus the other swept values in a multirun."""
    ignored = ("encoding=", "seed=", "experiment=", "+experiment=")
    swept = job.override_dirname.split(",") if job.multirun else []
    others = [o for o in swept if o and not o.startswith(ignored)]
    return "-".join([f"{encoding_name(cfg)}-s{cfg.seed}", *others])


def run_group(cfg: Config, job: JobInfo) -> str:
    if cfg.logger.group:
        return cfg.logger.group
    if job.multirun and cfg.experiment == "default" and job.sweep_name:
        return job.sweep_name
    return cfg.experiment


def build_loggers(cfg: Config, raw_cfg: DictConfig, run_dir: Path, job: JobInfo, resuming: bool) -> Logger:
    loggers: list[Logger] = [JsonlLogger(run_dir / "metrics.jsonl")]
    if cfg.logger.backend == "wandb":
        loggers.append(
            WandbLogger(
                cfg.logger,
                run_config=OmegaConf.to_container(raw_cfg, resolve=True),  # type: ignore[arg-type]
                run_dir=run_dir,
                name=run_name(cfg, job),
                group=run_group(cfg, job),
                tags=[encoding_name(cfg), corpus_name(cfg), *cfg.logger.tags],
                job_type="multirun" if job.multirun else "train",
                resume_id=previous_wandb_id(run_dir) if resuming else None,
            )
        )
    return MultiLogger(loggers)


def corpus_name(cfg: Config) -> str:
    d = cfg.data
    if d.source == "text":
        return Path(d.path or "text").name
    if d.source == "task":
        return f"task-{d.task.name}"
    if d.source == "hub":
        return d.hub_subset or d.hub_dataset or "hub"
    return "synthetic"


def main(raw_cfg: DictConfig, run_dir: Path, job: JobInfo | None = None) -> dict[str, Any]:
    """Train and evaluate one configuration; everything is written into `run_dir`.

    results.json records the status from the start: `running`, then `finished`, `preempted`, or `failed`
    with the error (a bad config included), so that a report over a sweep lists every job. Rerunning the
    command of a crashed or pre-empted run continues it from its checkpoint (`train.resume=auto`).
    """
    job = job or JobInfo()
    previous = keep_finished_run(raw_cfg, run_dir, job.multirun)
    if previous is not None:
        return previous
    w = world()
    if not w.is_main:
        return _worker(raw_cfg, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(raw_cfg, resolve=True))
    started = time.time()
    results: dict[str, Any] = {
        "status": "running",
        **CODE,
        "overrides": job.override_dirname,
    }
    logger: Logger | None = None
    try:
        cfg = load_config(raw_cfg)
        check_world(cfg, w)
        check_precision(cfg)
        torch.set_num_threads(cfg.threads or default_threads(job.parallel_jobs * w.size))
        resume = resume_state(cfg, run_dir)
        results.update(start_provenance(CODE, run_dir / "results.json" if resume else None))
        results.update(
            run_header(cfg), resumed_from_step=resume["step"] if resume else None, world_size=w.size
        )
        if cfg.train.init_from is not None:
            results["parent"] = parent_run(cfg)  # the run this stage continues
        write_json(run_dir / "results.json", results)
        logger = build_loggers(cfg, raw_cfg, run_dir, job, resuming=resume is not None)
        results.update(_train(cfg, run_dir, logger, resume))
        results["status"] = "finished"
    except BaseException as err:
        results["status"] = "preempted" if isinstance(err, Preempted) else "failed"
        results["error"] = f"{type(err).__name__}: {err}"
        raise
    finally:
        results["wall_time_s"] = round(time.time() - started, 2)
        write_json(run_dir / "results.json", results)
        if logger is not None:
            logger.finish(results["status"])
    print(summary_text(results, run_dir), flush=True)  # after W&B's own summary, the numbers that matter
    return results


def _worker(raw_cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """A rank other than 0 under torchrun: trains its shard; writes nothing, logs nothing."""
    cfg = load_config(raw_cfg)
    check_world(cfg, world())
    torch.set_num_threads(cfg.threads or default_threads(world().size))
    _train(cfg, run_dir, NullLogger(), resume_state(cfg, run_dir, truncate=False))
    return {"status": "finished", "rank": world().rank}


def default_threads(processes: int) -> int:
    """The machine's cores shared out among the processes that train at once on it."""
    return max(1, (os.cpu_count() or 1) // processes)


def check_world(cfg: Config, w: World) -> None:
    if cfg.train.batch_size % w.size:
        raise ConfigError(
            f"train.batch_size={cfg.train.batch_size} is not divisible by the torchrun world size {w.size}; "
            f"use a multiple of {w.size}"
        )


def check_precision(cfg: Config) -> None:
    """A precision this machine cannot run is refused before the run's W&B run exists (autocast_dtype)."""
    autocast_dtype(cfg.train.precision, resolve_device(cfg.train.device))


def run_header(cfg: Config) -> dict[str, Any]:
    return {
        "encoding": encoding_name(cfg),
        "seed": cfg.seed,
        "experiment": cfg.experiment,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpu_capability": cpu_capability(),
            "cpu_model": cpu_model(),
            "math_isa": math_isa(),
            "versions": package_versions(),
        },
    }


def _train(cfg: Config, run_dir: Path, logger: Logger, resume: dict[str, Any] | None) -> dict[str, Any]:
    seed_everything(cfg.seed)
    device = resolve_device(cfg.train.device)
    data = prepare_data(cfg.data)
    if world().is_main:
        save_run_tokenizer(data.tokenizer, run_dir)  # the folder alone generates (`posab generate`)
    check_eval_lengths(cfg, eval_split(cfg, data))
    corpora = corpus_streams(cfg, data)  # before training: a bad `eval.corpora` entry loses nothing
    if cfg.passkey.enabled:
        check_stage_lengths(cfg, data)
    require(
        cfg.train.init_encoding == "same" or cfg.train.init_from is not None,
        "train.init_encoding=changed starts a second stage from a run: give train.init_from=RUN_DIR",
    )
    model = build_model(cfg, data.vocab_size).to(device)
    config = config_container(cfg)

    def checkpoint(state: dict[str, Any], kind: str) -> None:
        if world().is_main:
            save_checkpoint(run_dir / CHECKPOINTS[kind], {**state, "config": config})

    sampler, valid = train_sampler(cfg, data), data.streams["valid"]
    optim = encoding_optimizer(cfg.encoding)  # encoding.lr_mult, encoding.weight_decay
    meter = KeyLossMeter() if sampler.mix else None  # train/needle_loss: the mixed-in passkeys' key loss
    trainer = Trainer(model, sampler, valid, cfg.train, logger, device, checkpoint, optim, meter)
    if resume is not None:
        trainer.load_state_dict(resume)
    elif cfg.train.init_from is not None:
        load_initial_model(cfg, model)
    result = trainer.fit()
    summary = {
        "train": asdict(result),
        "train_loss": result.train_loss,
        "val_loss": result.val_loss,
        "tokens_per_s": result.tokens_per_s,
        "params": {**model.parameter_counts(), **model.encoding.summary()},
        "device": str(device),
        "precision": "bf16" if trainer.dtype == torch.bfloat16 else "fp32",
        "data": {"cache": str(data.cache_dir.name), "tokens": {s: len(st) for s, st in data.streams.items()}},
    }
    if world().is_main:  # the final evaluations (and the passkey stage) run on rank 0; the other ranks wait
        ctx = eval_context(cfg, model, data, device, trainer.dtype, corpora)
        if cfg.passkey.enabled:
            summary.update(evaluate_around_stage(cfg, ctx, data, run_dir, logger, result.steps))
        else:
            summary["eval"] = evaluate(ctx, run_dir, logger, step=result.steps)
    barrier()
    return summary


def train_sampler(cfg: Config, data: CorpusData) -> TrainSampler:
    """Training windows, a share `data.needle_rate` of them passkey examples in the needle evaluation's
    format (`eval.needle.key_digits`); this rank's rows of every global batch."""
    w = world()
    train = data.streams["train"]
    mix = PasskeyMix(train, data.tokenizer, cfg.data.needle_rate, cfg.eval.needle.key_digits)
    return TrainSampler(train, cfg.train.seq_len, cfg.train.batch_size, cfg.seed, mix, shard=(w.rank, w.size))
