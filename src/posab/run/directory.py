"""The run directory: its checkpoints (plain containers, no OmegaConf objects, loadable with
`torch.load(weights_only=True)`, written atomically), and the directory used again: a finished run is kept
or refused, an unfinished one continues from its checkpoint after a compatibility check, and a model is
loaded from another run's checkpoint."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from posab.config import Config, config_container
from posab.errors import ConfigError
from posab.io import atomic_write, write_text
from posab.model import DecoderLM
from posab.results import flatten
from posab.wandb_logger import RUN_ID_FILE

log = logging.getLogger(__name__)

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


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write to a temporary file beside `path`, then rename it: a crash never leaves half a checkpoint."""
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint; a missing, truncated or corrupted file is reported by name."""
    if not path.is_file():
        raise ConfigError(f"checkpoint '{path}' does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for damaged files
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"checkpoint '{path}' cannot be read (truncated or corrupted?): {reason}") from None


def previous_wandb_id(run_dir: Path) -> str | None:
    path = run_dir / RUN_ID_FILE
    return path.read_text().strip() if path.is_file() else None


def finished_results(raw_cfg: DictConfig, run_dir: Path) -> dict[str, Any] | None:
    """The results of the finished run in `run_dir`, if there is one and `train.overwrite` is not set."""
    previous = run_dir / "results.json"
    if not previous.is_file() or OmegaConf.select(raw_cfg, "train.overwrite", default=False) is True:
        return None
    results = json.loads(previous.read_text())
    return results if results.get("status") == "finished" else None


def keep_finished_run(raw_cfg: DictConfig, run_dir: Path, multirun: bool) -> dict[str, Any] | None:
    """A finished run's directory is not reused unless `train.overwrite=true`: a single run refuses; a
    sweep rerun into its own folder (`hydra.sweep.dir=...`) keeps the finished jobs and continues the rest."""
    previous = finished_results(raw_cfg, run_dir)
    if previous is not None and not multirun:
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


# Settings added after checkpoints that lack them were written, at the value those runs had (the schema's
# default then and now): a checkpoint without the key compares as having it (issue 59's model options, p-RoPE
# and RoPE's trained scaling).
ADDED_LATER: dict[str, Any] = {
    "model.ssmax": False,
    "model.canon": "",
    "model.canon_kernel": 4,
    "encoding.fraction": 1.0,
    "encoding.scaling": "none",
    "encoding.scaling_factor": 1.0,
    "encoding.original_len": None,
}


def check_compatible(
    saved: dict[str, Any],
    current: dict[str, Any],
    path: Path,
    keys: tuple[str, ...],
    checked_elsewhere: tuple[str, ...] = (),
) -> None:
    """ConfigError listing every field under `keys` (but not the fields `checked_elsewhere`) where the
    checkpoint's config differs from this one."""
    saved_flat, current_flat = flatten(saved), flatten(current)
    fields = sorted(
        k
        for k in saved_flat.keys() | current_flat.keys()
        if k.startswith(keys) and k not in checked_elsewhere
    )
    differ = [f for f in fields if saved_flat.get(f, ADDED_LATER.get(f)) != current_flat.get(f)]
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


def load_model_state(
    cfg: Config, model: DecoderLM, path: Path, checked_elsewhere: tuple[str, ...] = ()
) -> int:
    """Load the model of checkpoint `path` after a compatibility check of the model and encoding (but not
    the fields `checked_elsewhere`, e.g. a re-evaluation's `encoding.clamp`); returns its step."""
    state = load_checkpoint(path)
    config = state.get("config", {})
    check_compatible(config, config_container(cfg), path, ("model", "encoding"), checked_elsewhere)
    model.load_state_dict(state["model"])
    return int(state["step"])


def parent_run(cfg: Config) -> dict[str, Any] | None:
    """The run a stage starts from (`train.init_from`), as its results.json records it: its folder, encoding,
    steps and commit; None without one. A ConfigError unless that run has finished (a stage continues a
    finished run's final model, not a checkpoint on the way)."""
    if cfg.train.init_from is None:
        return None
    folder = Path(cfg.train.init_from)
    results_path = folder / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    status = results.get("status", "no results.json")
    if status != "finished":
        raise ConfigError(
            f"train.init_from={folder}: that run has not finished (status: {status}); a stage continues a "
            "finished run: finish it (rerun its command) or give another run's folder"
        )
    return {
        "run": str(folder),
        "encoding": results.get("encoding"),
        "steps": results.get("train", {}).get("steps"),
        "git_commit": results.get("git_commit"),
    }


def load_initial_model(cfg: Config, model: DecoderLM) -> None:
    """The model of the run in `train.init_from` (its latest checkpoint); with `train.init_encoding=changed`
    (a second stage) the encoding may differ from that run's (`load_changed_encoding`)."""
    path = Path(cfg.train.init_from or "") / CHECKPOINTS["latest"]
    if cfg.train.init_encoding == "changed":
        step = load_changed_encoding(cfg, model, path)
    else:
        step = load_model_state(cfg, model, path)
    log.info("initialised from %s (step %d)", path, step)


def load_changed_encoding(cfg: Config, model: DecoderLM, path: Path) -> int:
    """A second stage's start (context extension, DroPE): the checkpoint's model but its encoding, under the
    same `model` config (checked); the encoding's parameters that the checkpoint has under the same names
    and shapes are taken, the others keep their initialisation (both logged). Returns the step."""
    state = load_checkpoint(path)
    check_compatible(state.get("config", {}), config_container(cfg), path, ("model",))
    saved, mine = state["model"], model.state_dict()
    taken = {k: v for k, v in saved.items() if k in mine and mine[k].shape == v.shape}
    missing = [k for k in mine if not k.startswith("encoding.") and k not in taken]  # the model's own
    if missing:
        there = {k: tuple(saved[k].shape) if k in saved else "absent" for k in missing}
        found = "; ".join(f"{k}: {there[k]} there, {tuple(mine[k].shape)} here" for k in missing)
        raise ConfigError(
            f"checkpoint '{path}' does not hold this model's own weights ({found}): a second stage needs the "
            "first stage's data (its vocabulary) and model config"
        )
    model.load_state_dict({**mine, **taken})
    fresh = sorted(k for k in mine if k not in taken)
    log.info(
        "second stage: encoding weights taken %s, initialised %s",
        sorted(k for k in taken if k.startswith("encoding.")),
        fresh,
    )
    return int(state["step"])
