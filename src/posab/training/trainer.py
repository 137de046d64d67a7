"""The language model's training: AdamW, warmup + cosine schedule, clipping, accumulation, bf16 autocast.
The loop (cadence, checkpoints, pre-emption) and the schedule live in `posab.training.loop`, the optimizer
and its step (shared with the passkey stage) in `posab.training.optim`, the loss in
`posab.training.losses`, checkpoint entries and RNG states in `posab.training.state`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from posab.data import TokenStream, TrainSampler
from posab.data.streams import Batch
from posab.device import autocast, autocast_dtype
from posab.distributed import any_rank, mean_across_ranks, world
from posab.encodings import EncodingOptimizer
from posab.errors import TrainingError, require, require_positive
from posab.logging import Logger
from posab.training.loop import Cadence, LoopState, run_steps, warmup_cosine
from posab.training.losses import scored_loss, token_losses, validation_loss
from posab.training.optim import build_optimizer, optimizer_step
from posab.training.state import load_optimizer_state, optimizer_state, rng_states, set_rng_states

PRECISIONS = ("auto", "bf16", "fp32")
DEVICES = ("auto", "cpu", "cuda")


@dataclass
class TrainConfig:
    seq_len: int = 512
    batch_size: int = 16
    grad_accum: int = 1
    steps: int = 600
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    precision: str = "auto"  # auto | bf16 | fp32
    device: str = "auto"  # auto | cpu | cuda
    val_every: int = 100
    val_windows: int = 32
    log_every: int = 10
    progress: bool = True
    compile: bool = False  # torch.compile the model for training
    checkpoint_every: int = 100
    keep_best: bool = False  # also keep checkpoint_best.pt (lowest validation loss)
    resume: str = "auto"  # auto: continue from the run directory's checkpoint if it has one | never
    overwrite: bool = False  # allow reusing the directory of a finished run
    init_from: str | None = None  # a run directory: start from its final model (then steps may be 0)
    init_encoding: str = "same"  # same: its encoding must be this one | changed: a second stage may change it

    def validate(self) -> None:
        """Check values that types alone cannot, before any work is done."""
        counts = ("seq_len", "batch_size", "grad_accum", "val_every", "val_windows", "log_every")
        require_positive("train", self, (*counts, "checkpoint_every"))
        require(
            self.steps > 0 or (self.steps == 0 and self.init_from is not None),
            f"train.steps={self.steps} must be a positive integer (0 only with train.init_from=RUN_DIR)",
        )
        require(self.lr > 0, f"train.lr={self.lr} must be positive")
        require(self.resume in ("auto", "never"), f"train.resume={self.resume!r}: use auto or never")
        require(
            self.init_encoding in ("same", "changed"),
            f"train.init_encoding={self.init_encoding!r}: use same (train.init_from's run's encoding) or "
            "changed (a second stage: context extension, DroPE)",
        )
        require(self.warmup_steps >= 0, f"train.warmup_steps={self.warmup_steps} must be >= 0")
        require(0 <= self.min_lr_ratio <= 1, f"train.min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        require(self.precision in PRECISIONS, f"train.precision={self.precision!r}: use auto, bf16 or fp32")
        require(self.device in DEVICES, f"train.device={self.device!r}: use auto, cpu or cuda")


@dataclass
class TrainResult:
    train_loss: float
    val_loss: float
    tokens_per_s: float
    steps: int
    tokens: int
    train_time_s: float


def lr_multiplier(step: int, cfg: TrainConfig) -> float:
    """`warmup_cosine` over the run's steps: linear warmup to 1, then cosine decay towards `min_lr_ratio`."""
    return warmup_cosine(step, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)


def train_optimizer(
    model: nn.Module, cfg: TrainConfig, enc: EncodingOptimizer | None = None
) -> torch.optim.AdamW:
    """The language model's optimizer: `build_optimizer` at train.lr, train.weight_decay and
    train.beta1/beta2 (`enc`: the encoding's group, `encoding.lr_mult` and `encoding.weight_decay`)."""
    return build_optimizer(model, enc, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(cfg.beta1, cfg.beta2))


@dataclass
class Progress(LoopState):
    """Where training stands; saved in checkpoints so that a resumed run continues exactly."""

    val_loss: float = float("nan")
    best_val_loss: float = float("inf")


class BatchMeter(Protocol):
    """Something measured on the training batches between log lines (e.g. the passkey wing's loss on the
    keys of mixed-in examples), saved in checkpoints so that a resumed run logs the same values."""

    def observe(self, losses: torch.Tensor, batch: Batch) -> None: ...  # (B, T) token losses
    def metrics(self) -> dict[str, float]: ...  # since the last call, over every rank; then reset
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Trainer:
    def __init__(
        self,
        model: nn.Module,
        sampler: TrainSampler,
        valid: TokenStream,
        cfg: TrainConfig,
        logger: Logger,
        device: torch.device,
        checkpoint: Callable[[dict[str, Any], str], None],
        encoding_optimizer: EncodingOptimizer | None = None,
        meter: BatchMeter | None = None,
    ) -> None:
        """`model`: a DecoderLM, or any module called as model(inputs, sentence, paragraph) -> logits (the
        benchmark times x-transformers' model through this Trainer); `sampler` draws the training batches
        (this rank's rows); `valid` is the validation split;
        `checkpoint(state, kind)` stores a state (`kind`: latest or best); `encoding_optimizer`: how the
        encoding's parameters are trained (`encoding.lr_mult`, `encoding.weight_decay`); `meter`: logged
        with the loss."""
        self.model, self.cfg, self.logger, self.device = model, cfg, logger, device
        self.checkpoint, self.meter = checkpoint, meter
        self.parallel = DistributedDataParallel(model) if world().distributed else model  # gradients averaged
        if cfg.compile:
            self.parallel = torch.compile(self.parallel)
        self.sampler = sampler
        self.valid_stream = valid
        self.valid_starts = valid.fixed_windows(cfg.seq_len, cfg.val_windows)
        self.optimizer = train_optimizer(model, cfg, encoding_optimizer)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_multiplier(s, cfg))
        self.dtype = autocast_dtype(cfg.precision, device)
        self.progress = Progress()
        self._lr = self._grad_norm = math.nan  # of the last step, for its log line

    def state_dict(self) -> dict[str, Any]:
        return {
            **optimizer_state(self.model, self.optimizer, self.scheduler),
            "sampler": self.sampler.state_dict(),
            "rng": rng_states(),
            "progress": asdict(self.progress),
            "step": self.progress.step,
            "meter": self.meter.state_dict() if self.meter else {},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_optimizer_state(state, self.model, self.optimizer, self.scheduler)
        self.sampler.load_state_dict(state["sampler"])
        set_rng_states(state["rng"])
        self.progress = Progress(**state["progress"])
        if self.meter:
            self.meter.load_state_dict(state["meter"])

    def validate(self) -> float:
        return validation_loss(
            self.model,
            self.valid_stream,
            self.valid_starts,
            self.cfg.seq_len,
            self.cfg.batch_size,
            self.device,
            self.dtype,
        )

    def step(self) -> tuple[float, float]:
        """One optimizer step over `grad_accum` micro-batches; returns (loss, grad norm)."""
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(self.cfg.grad_accum):
            batch = self.sampler.next_batch().to(self.device)
            with autocast(self.device, self.dtype):
                losses = token_losses(self.parallel, batch)  # (B, T)
                loss = scored_loss(losses, batch) / self.cfg.grad_accum
            loss.backward()
            total += float(loss.detach())
            if self.meter:
                self.meter.observe(losses.detach(), batch)
        total = mean_across_ranks(total)  # the global batch's loss; every rank sees the same value
        if not math.isfinite(total):
            saved = self.last_saved_step()
            kept = f"the checkpoint of step {saved} is intact" if saved else "no checkpoint was saved yet"
            raise TrainingError(
                f"loss is {total} at step {self.progress.step + 1}; "
                f"stopped before updating the weights ({kept})"
            )
        grad_norm = optimizer_step(self.model, self.optimizer, self.scheduler, self.cfg.grad_clip)
        return total, grad_norm

    def last_saved_step(self) -> int:
        every = self.cfg.checkpoint_every
        return self.progress.step // every * every

    def fit(self) -> TrainResult:
        cfg, progress = self.cfg, self.progress
        if cfg.steps == 0:  # a model taken as it is (train.init_from): validated, not trained
            progress.val_loss = self.validate()
            return TrainResult(math.nan, progress.val_loss, 0.0, 0, 0, 0.0)
        self.model.train()
        tokens_per_step = cfg.batch_size * cfg.grad_accum * cfg.seq_len
        cadence = Cadence(cfg.steps, cfg.log_every, cfg.checkpoint_every, "train", cfg.progress)
        run_steps(
            progress,
            cadence,
            self._step_logging_lr,
            lambda seconds, bar: self._after_step(tokens_per_step / seconds, bar),
            lambda: self.checkpoint(self.state_dict(), "latest"),
            any_rank,
        )
        return TrainResult(
            train_loss=float(np.mean(progress.recent_losses)),
            val_loss=progress.val_loss,
            tokens_per_s=cfg.steps * tokens_per_step / progress.time_s,
            steps=cfg.steps,
            tokens=cfg.steps * tokens_per_step,
            train_time_s=progress.time_s,
        )

    def _step_logging_lr(self) -> float:
        """`step`, remembering the learning rate it ran at and its gradient norm for the log line."""
        self._lr = self.scheduler.get_last_lr()[0]
        loss, self._grad_norm = self.step()
        return loss

    def _after_step(self, tokens_per_s: float, bar: tqdm) -> None:
        """The log line, then validation (and the best checkpoint) at their cadence."""
        progress, cfg = self.progress, self.cfg
        done, last = progress.step, progress.step == cfg.steps
        if done % cfg.log_every == 0 or last:
            self._log_step(tokens_per_s, bar)
        if done % cfg.val_every == 0 or last:
            progress.val_loss = self.validate()
            improved = progress.val_loss < progress.best_val_loss
            progress.best_val_loss = min(progress.best_val_loss, progress.val_loss)
            self.logger.log({"val/loss": progress.val_loss}, done)
            if improved and cfg.keep_best:
                self.checkpoint(self.state_dict(), "best")

    def _log_step(self, tokens_per_s: float, bar: tqdm) -> None:
        loss = float(np.mean(self.progress.recent_losses))
        metrics = {
            "train/loss": loss,
            "train/lr": self._lr,
            "train/grad_norm": self._grad_norm,
            "train/tokens_per_s": tokens_per_s,
            **(self.meter.metrics() if self.meter else {}),
        }
        self.logger.log(metrics, self.progress.step)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens_per_s:.0f}")
