"""The only module that wires things together: config -> data -> model -> training -> results."""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import platform
import random
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from posab.build import build_model, encoding_name
from posab.checkpoint import load_checkpoint, save_checkpoint
from posab.config import Config, config_container, load_config
from posab.data import CorpusData, TokenStream, TrainSampler, prepare_data
from posab.data.passkey import filler_length
from posab.device import autocast_dtype, resolve_device
from posab.distributed import World, barrier, world
from posab.encodings import encoding_optimizer
from posab.errors import ConfigError, Preempted
from posab.evaluate import EvalContext, enabled_evaluators, run_evaluations
from posab.io import atomic_write, write_json, write_text
from posab.logging import JsonlLogger, Logger, MultiLogger, NullLogger
from posab.model import DecoderLM
from posab.outputs import EvalOutput, Table
from posab.passkey_stage import PasskeyStage
from posab.paths import source_root
from posab.plots import save_figure
from posab.results import flatten
from posab.summary import summary_text
from posab.train import Trainer
from posab.wandb_logger import RUN_ID_FILE, WandbLogger

log = logging.getLogger(__name__)


def git_commit() -> str:
    root = source_root()
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


def previous_wandb_id(run_dir: Path) -> str | None:
    path = run_dir / RUN_ID_FILE
    return path.read_text().strip() if path.is_file() else None


def corpus_name(cfg: Config) -> str:
    d = cfg.data
    if d.source == "text":
        return Path(d.path or "text").name
    if d.source == "hub":
        return d.hub_subset or d.hub_dataset or "hub"
    return "synthetic"


CHECKPOINTS = {"latest": "checkpoint.pt", "best": "checkpoint_best.pt", "passkey": "checkpoint_passkey.pt"}
RESUME_KEYS = (
    "model",
    "encoding",
    "seed",
    "data.source",
    "data.anchors",
    "data.synthetic",
    "data.tokenizer",
    "data.vocab_size",
    "train.seq_len",
    "train.batch_size",
    "train.grad_accum",
)


def main(raw_cfg: DictConfig, run_dir: Path, job: JobInfo | None = None) -> dict[str, Any]:
    """Train and evaluate one configuration; everything is written into `run_dir`.

    results.json records the status from the start: `running`, then `finished`, `preempted`, or `failed`
    with the error (a bad config included), so that a report over a sweep lists every job. Rerunning the
    command of a crashed or pre-empted run continues it from its checkpoint (`train.resume=auto`).
    """
    job = job or JobInfo()
    previous = keep_finished_run(raw_cfg, run_dir, job)
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
        "git_commit": git_commit(),
        "overrides": job.override_dirname,
    }
    logger: Logger | None = None
    try:
        cfg = load_config(raw_cfg)
        check_world(cfg, w)
        torch.set_num_threads(cfg.threads or default_threads(job.parallel_jobs * w.size))
        resume = resume_state(cfg, run_dir)
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


def finished_results(raw_cfg: DictConfig, run_dir: Path) -> dict[str, Any] | None:
    """The results of the finished run in `run_dir`, if there is one and `train.overwrite` is not set."""
    previous = run_dir / "results.json"
    if not previous.is_file() or OmegaConf.select(raw_cfg, "train.overwrite", default=False) is True:
        return None
    results = json.loads(previous.read_text())
    return results if results.get("status") == "finished" else None


def keep_finished_run(raw_cfg: DictConfig, run_dir: Path, job: JobInfo) -> dict[str, Any] | None:
    """A finished run's directory is not reused unless `train.overwrite=true`: a single run refuses; a
    sweep rerun into its own folder (`hydra.sweep.dir=...`) keeps the finished jobs and continues the rest."""
    previous = finished_results(raw_cfg, run_dir)
    if previous is not None and not job.multirun:
        raise ConfigError(
            f"'{run_dir}' holds a finished run; pass train.overwrite=true to replace it, "
            "or choose another hydra.run.dir"
        )
    if previous is not None:
        log.info("%s holds a finished run: kept (train.overwrite=true would rerun it)", run_dir)
    return previous


def resume_state(cfg: Config, run_dir: Path, truncate: bool = True) -> dict[str, Any] | None:
    """The checkpoint to continue from (train.resume=auto and one exists), after a compatibility check.

    metrics.jsonl is cut back to the checkpoint's step, so the resumed run's log has no duplicate steps.
    """
    path = run_dir / CHECKPOINTS["latest"]
    if cfg.train.resume == "never" or not path.is_file():
        return None
    state = load_checkpoint(path)
    check_compatible(state.get("config", {}), config_container(cfg), path, RESUME_KEYS)
    if truncate:  # a passkey stage logs past the language model's steps: keep what its checkpoint holds
        stage = run_dir / CHECKPOINTS["passkey"]
        stage_steps = load_checkpoint(stage)["step"] if stage.is_file() else 0
        truncate_metrics(run_dir / "metrics.jsonl", state["step"] + stage_steps)
    log.info("resuming from %s at step %d", path, state["step"])
    return state


def check_compatible(
    saved: dict[str, Any], current: dict[str, Any], path: Path, keys: tuple[str, ...]
) -> None:
    """ConfigError listing every field under `keys` where the checkpoint's config differs from this one."""
    saved_flat, current_flat = flatten(saved), flatten(current)
    fields = sorted(k for k in saved_flat.keys() | current_flat.keys() if k.startswith(keys))
    differ = [f for f in fields if saved_flat.get(f) != current_flat.get(f)]
    if differ:
        details = "; ".join(
            f"{f}: {saved_flat.get(f)!r} in the checkpoint, {current_flat.get(f)!r} now" for f in differ
        )
        raise ConfigError(f"checkpoint '{path}' comes from an incompatible config: {details}")


def truncate_metrics(path: Path, step: int) -> None:
    """Keep the lines of metrics.jsonl up to `step` (atomically)."""
    if not path.is_file():
        return
    kept = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
    write_text(path, "".join(line + "\n" for line in kept))


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
        },
    }


def eval_split(cfg: Config, data: CorpusData) -> TokenStream:
    """The split the evaluators score (`eval.split`)."""
    if cfg.eval.split not in data.streams:
        raise ConfigError(
            f"eval.split={cfg.eval.split!r}: the corpus has no such split; it has {', '.join(data.streams)}"
        )
    return data.streams[cfg.eval.split]


def check_eval_lengths(cfg: Config, valid: TokenStream) -> None:
    """Fail before training when the evaluated split cannot supply an evaluation length (`eval.lengths`
    and the window lengths of every enabled evaluator)."""
    lengths = set(cfg.eval.lengths)
    for evaluator in enabled_evaluators(cfg.eval):
        lengths |= set(evaluator.window_lengths(cfg.eval))
    too_long = sorted(n for n in lengths if valid.windows_available(n) == 0)
    if too_long:
        raise ConfigError(
            f"eval length(s) {too_long} longer than the {valid.split} split can supply: it has {len(valid)} "
            f"tokens, a window of L tokens needs L+1; use eval.lengths up to {len(valid) - 1} or more data"
        )


def _train(cfg: Config, run_dir: Path, logger: Logger, resume: dict[str, Any] | None) -> dict[str, Any]:
    seed_everything(cfg.seed)
    device = resolve_device(cfg.train.device)
    data = prepare_data(cfg.data)
    check_eval_lengths(cfg, eval_split(cfg, data))
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
        ctx = eval_context(cfg, model, data, device, trainer.dtype)
        if cfg.passkey.enabled:
            summary.update(evaluate_around_stage(cfg, ctx, data, run_dir, logger, result.steps))
        else:
            summary["eval"] = evaluate(ctx, run_dir, logger, step=result.steps)
    barrier()
    return summary


def check_stage_lengths(cfg: Config, data: CorpusData) -> None:
    """Fail before training when the passkey stage's shortest length cannot hold an example."""
    shortest = min(cfg.passkey.lengths)
    try:
        filler_length(data.tokenizer, shortest + 1, cfg.eval.needle.key_digits)
    except ConfigError as err:
        raise ConfigError(f"passkey.lengths={cfg.passkey.lengths}: {err}") from None


def load_model_state(cfg: Config, model: DecoderLM, path: Path) -> int:
    """Load the model of checkpoint `path` after a compatibility check of the model and encoding; returns
    its step."""
    state = load_checkpoint(path)
    check_compatible(state.get("config", {}), config_container(cfg), path, ("model", "encoding"))
    model.load_state_dict(state["model"])
    return int(state["step"])


def load_initial_model(cfg: Config, model: DecoderLM) -> None:
    """The model of the run in `train.init_from` (its latest checkpoint)."""
    path = Path(cfg.train.init_from or "") / CHECKPOINTS["latest"]
    step = load_model_state(cfg, model, path)
    log.info("initialised from %s (step %d)", path, step)


def evaluate_around_stage(
    cfg: Config, ctx: EvalContext, data: CorpusData, run_dir: Path, logger: Logger, lm_steps: int
) -> dict[str, Any]:
    """Evaluate the language model, run the passkey stage, then evaluate retrieval on the stage's model;
    `eval_source` says which model each evaluator measured."""
    before = evaluate(ctx, run_dir, logger, step=lm_steps, after_stage=False)
    stage = PasskeyStage(
        ctx.model,
        data.streams["train"],
        data.tokenizer,
        cfg.passkey,
        cfg.eval.needle.key_digits,
        cfg.seed,
        logger,
        ctx.dtype,
        lambda state: save_checkpoint(
            run_dir / CHECKPOINTS["passkey"], {**state, "config": config_container(cfg)}
        ),
        first_step=lm_steps,
    )
    path = run_dir / CHECKPOINTS["passkey"]
    if cfg.train.resume == "auto" and path.is_file():
        stage.load_state_dict(load_checkpoint(path))
    stage_summary = stage.fit()
    total = lm_steps + cfg.passkey.total_steps
    after = evaluate(ctx, run_dir, logger, step=total, after_stage=True)
    sources = {e.name: e.after_stage for e in enabled_evaluators(cfg.eval)}
    return {
        "eval": {**before, **after},
        "passkey_stage": stage_summary,
        "eval_source": {
            name: f"passkey stage, step {total}" if late else f"language model, step {lm_steps}"
            for name, late in sources.items()
        },
    }


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


def eval_context(
    cfg: Config, model: DecoderLM, data: CorpusData, device: torch.device, dtype: torch.dtype | None
) -> EvalContext:
    valid = eval_split(cfg, data)
    return EvalContext(
        model, data.tokenizer, valid, device, dtype, cfg.train.seq_len, cfg.eval, title=encoding_name(cfg)
    )


def evaluate(
    ctx: EvalContext, run_dir: Path, logger: Logger, step: int, after_stage: bool | None = None
) -> dict[str, Any]:
    """Run the evaluators (those with the given `after_stage`, or all), write their tables and figures into
    `run_dir` and log their output; returns the scalars and data (results.json's `eval`)."""
    output = run_evaluations(ctx, after_stage)
    write_output_files(output, run_dir)
    logger.log_evaluation(output, step)
    return output.results


def write_output_files(output: EvalOutput, folder: Path) -> list[Path]:
    """Each table as `<name>.csv`, each figure as `<name>.png` and each set of arrays as `<name>.npz` in
    `folder`."""
    written = [write_text(folder / f"{name}.csv", table_csv(table)) for name, table in output.tables.items()]
    written += [save_figure(figure, folder / f"{name}.png") for name, figure in output.figures.items()]
    written += [write_arrays(folder / f"{name}.npz", arrays) for name, arrays in output.arrays.items()]
    return written


def write_arrays(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    """Compressed `.npz`, keys as given (`np.load(path)[key]`)."""

    def save(tmp: Path) -> None:
        with tmp.open("wb") as f:
            np.savez_compressed(f, **arrays)

    return atomic_write(path, save)


def table_csv(table: Table) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(table.columns)
    writer.writerows(table.rows)
    return buffer.getvalue()


REEVAL_PREFIXES = ("eval.", "train.device=", "train.precision=", "data.cache_dir=", "data.path=")


def reevaluate(run_dir: Path, overrides: list[str], out_dir: Path) -> dict[str, Any]:
    """Evaluate a finished run's checkpoint again, with other evaluation settings, without retraining;
    the results, metrics and evaluators' files go into `out_dir`."""
    bad = [o for o in overrides if not o.startswith(REEVAL_PREFIXES)]
    if bad:
        raise ConfigError(f"cannot change {bad} when re-evaluating; allowed: {', '.join(REEVAL_PREFIXES)}")
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"run_dir='{run_dir}' holds no config.yaml (is it a run directory?)")
    saved = OmegaConf.load(run_dir / "config.yaml")
    cfg = load_config(OmegaConf.merge(saved, OmegaConf.from_dotlist(overrides)))  # type: ignore[arg-type]
    device = resolve_device(cfg.train.device)
    data = prepare_data(cfg.data)
    check_eval_lengths(cfg, eval_split(cfg, data))
    model = build_model(cfg, data.vocab_size).to(device)
    ctx = eval_context(cfg, model, data, device, autocast_dtype(cfg.train.precision, device))
    out_dir.mkdir(parents=True, exist_ok=True)
    logger = JsonlLogger(out_dir / "metrics.jsonl")
    staged = (run_dir / CHECKPOINTS["passkey"]).is_file()  # the needle measured the stage's model
    results: dict[str, Any] = {}
    for after_stage, kind in ((False, "latest"), (True, "passkey")) if staged else ((None, "latest"),):
        load_model_state(cfg, model, run_dir / CHECKPOINTS[kind])
        results.update(evaluate(ctx, out_dir, logger, step=0, after_stage=after_stage))
    logger.finish("finished")
    write_json(out_dir / "results.json", {"overrides": overrides, "eval": results})
    return results
