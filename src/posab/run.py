"""The entry points that wire things together: `main` (config -> data -> model -> training -> evaluation ->
results) and `reevaluate` (a finished run's checkpoint -> evaluation). A run directory used again is handled
by `posab.resume`; the evaluations, the passkey stage between them and their files by `posab.run_eval`."""

from __future__ import annotations

import json
import os
import platform
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from posab.build import build_model, encoding_name
from posab.checkpoint import save_checkpoint
from posab.config import Config, config_container, load_config
from posab.data import CorpusData, TrainSampler, prepare_data
from posab.device import autocast_dtype, resolve_device
from posab.distributed import World, barrier, world
from posab.encodings import encoding_optimizer
from posab.encodings.multiscale import clamp_distance
from posab.errors import ConfigError, Preempted
from posab.io import write_json
from posab.logging import JsonlLogger, Logger, MultiLogger, NullLogger
from posab.provenance import code_provenance, cpu_capability, cpu_model, package_versions, start_provenance
from posab.resume import (
    CHECKPOINTS,
    keep_finished_run,
    load_initial_model,
    load_model_state,
    previous_wandb_id,
    resume_state,
)
from posab.run_eval import (
    check_eval_lengths,
    check_stage_lengths,
    corpus_streams,
    eval_context,
    eval_split,
    evaluate,
    evaluate_around_stage,
)
from posab.summary import summary_text
from posab.train import Trainer
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
        torch.set_num_threads(cfg.threads or default_threads(job.parallel_jobs * w.size))
        resume = resume_state(cfg, run_dir)
        results.update(start_provenance(CODE, run_dir / "results.json" if resume else None))
        results.update(
            run_header(cfg), resumed_from_step=resume["step"] if resume else None, world_size=w.size
        )
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
            "versions": package_versions(),
        },
    }


def _train(cfg: Config, run_dir: Path, logger: Logger, resume: dict[str, Any] | None) -> dict[str, Any]:
    seed_everything(cfg.seed)
    device = resolve_device(cfg.train.device)
    data = prepare_data(cfg.data)
    check_eval_lengths(cfg, eval_split(cfg, data))
    corpora = corpus_streams(cfg, data)  # before training: a bad `eval.corpora` entry loses nothing
    if cfg.passkey.enabled:
        check_stage_lengths(cfg, data)
    model = build_model(cfg, data.vocab_size).to(device)
    config = config_container(cfg)

    def checkpoint(state: dict[str, Any], kind: str) -> None:
        if world().is_main:
            save_checkpoint(run_dir / CHECKPOINTS[kind], {**state, "config": config})

    sampler, valid = train_sampler(cfg, data), data.streams["valid"]
    optim = encoding_optimizer(cfg.encoding)  # encoding.lr_mult, encoding.weight_decay
    trainer = Trainer(model, sampler, valid, cfg.train, logger, device, checkpoint, optim)
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
    return TrainSampler(
        data.streams["train"],
        data.tokenizer,
        cfg.train.seq_len,
        cfg.train.batch_size,
        cfg.seed,
        cfg.data.needle_rate,
        cfg.eval.needle.key_digits,
        shard=(w.rank, w.size),
    )


REEVAL_PREFIXES = (
    "eval.",
    "train.device=",
    "train.precision=",
    "data.cache_dir=",
    "data.path=",
    "encoding.clamp=",
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
    check_clamp_unchanged_in_training(saved, cfg, staged)
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
        load_model_state(cfg, model, run_dir / CHECKPOINTS[kind], checked_elsewhere=("encoding.clamp",))
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
