"""The training loop: AdamW, warmup + cosine schedule, clipping, accumulation, bf16 autocast."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from posab.config import Config, TrainConfig
from posab.data import Batch, CorpusData, TokenStream, TrainSampler
from posab.errors import ConfigError
from posab.logging import Logger
from posab.model import DecoderLM


@dataclass
class TrainResult:
    train_loss: float
    val_loss: float
    tokens_per_s: float
    steps: int
    tokens: int
    train_time_s: float


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device=cuda but no CUDA device is available; use auto or cpu")
    return torch.device(name)


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 when asked, or with `auto` where the hardware has native bf16; None means fp32."""
    if precision == "fp32" or (precision == "auto" and not bf16_supported(device)):
        return None
    return torch.bfloat16


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[None]:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def lr_multiplier(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to 1, then cosine decay to `min_lr_ratio` at the last step."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """Weight decay on matrices only (not on norms, biases or per-head vectors)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


def lm_loss(model: DecoderLM, batch: Batch, reduction: str = "mean") -> torch.Tensor:
    logits = model(batch.inputs, batch.sentence, batch.paragraph)  # (B, T, V)
    return F.cross_entropy(logits.float().flatten(0, 1), batch.targets.flatten(), reduction=reduction)


def batches(stream: TokenStream, starts: np.ndarray, length: int, batch_size: int) -> Iterator[Batch]:
    for i in range(0, len(starts), batch_size):
        yield stream.batch(starts[i : i + batch_size], length)


@torch.inference_mode()
def validation_loss(
    model: DecoderLM,
    stream: TokenStream,
    starts: np.ndarray,
    length: int,
    batch_size: int,
    device: torch.device,
    dtype: torch.dtype | None,
) -> float:
    """Mean per-token loss over fixed windows."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    with autocast(device, dtype):
        for batch in batches(stream, starts, length, batch_size):
            batch = batch.to(device)
            total += float(lm_loss(model, batch, reduction="sum"))
            count += batch.num_tokens
    model.train(was_training)
    return total / count


class Trainer:
    def __init__(
        self, model: DecoderLM, data: CorpusData, run_cfg: Config, logger: Logger, device: torch.device
    ) -> None:
        cfg = run_cfg.train
        self.model, self.cfg, self.logger, self.device = model, cfg, logger, device
        self.sampler = TrainSampler(
            data.streams["train"],
            data.tokenizer,
            cfg.seq_len,
            cfg.batch_size,
            run_cfg.seed,
            run_cfg.data.needle_rate,
            run_cfg.eval.needle.key_digits,
        )
        self.valid_stream = data.streams["valid"]
        self.valid_starts = self.valid_stream.fixed_windows(cfg.seq_len, cfg.val_windows)
        self.optimizer = build_optimizer(model, cfg)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_multiplier(s, cfg))
        self.dtype = autocast_dtype(cfg.precision, device)

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
                loss = lm_loss(self.model, batch) / self.cfg.grad_accum
            loss.backward()
            total += float(loss.detach())
        grad_norm = float(nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip))
        self.optimizer.step()
        self.scheduler.step()
        return total, grad_norm

    def fit(self) -> TrainResult:
        cfg = self.cfg
        self.model.train()
        tokens_per_step = cfg.batch_size * cfg.grad_accum * cfg.seq_len
        train_time, recent, val_loss = 0.0, [], float("nan")
        bar = tqdm(range(cfg.steps), desc="train", disable=not cfg.progress, dynamic_ncols=True)
        for step in bar:
            lr = self.scheduler.get_last_lr()[0]
            started = time.perf_counter()
            loss, grad_norm = self.step()
            elapsed = time.perf_counter() - started
            train_time += elapsed
            if not math.isfinite(loss):
                raise FloatingPointError(f"loss is {loss} at step {step + 1}")
            recent = (recent + [loss])[-cfg.log_every :]
            done = step + 1
            if done % cfg.log_every == 0 or done == cfg.steps:
                metrics = {
                    "train/loss": float(np.mean(recent)),
                    "train/lr": lr,
                    "train/grad_norm": grad_norm,
                    "train/tokens_per_s": tokens_per_step / elapsed,
                }
                self.logger.log(metrics, done)
                bar.set_postfix(
                    loss=f"{metrics['train/loss']:.3f}", tok_s=f"{done * tokens_per_step / train_time:.0f}"
                )
            if done % cfg.val_every == 0 or done == cfg.steps:
                val_loss = self.validate()
                self.logger.log({"val/loss": val_loss}, done)
        return TrainResult(
            train_loss=float(np.mean(recent)),
            val_loss=val_loss,
            tokens_per_s=cfg.steps * tokens_per_step / train_time,
            steps=cfg.steps,
            tokens=cfg.steps * tokens_per_step,
            train_time_s=train_time,
        )
