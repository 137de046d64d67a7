"""The passkey stage: after language-model training, steps on passkey examples with the loss on the key only.

Why (docs/evaluation.md, "Needle in a haystack"): mixing passkey examples into pre-training does not
teach retrieval at posab's scale, and fine-tuning only at the training length stays on the ln 10 plateau;
a curriculum of short examples first, up to the training length, does (measured on pg-books, issue 14).
The stage never goes past the training length (`validate`), so every evaluation length above it stays
unseen.

Protocol: `passkey.lengths` (input lengths, increasing, each at most `train.seq_len`) with
`passkey.steps[i]` steps at `lengths[i]`; each step draws max(1, batch_tokens // L) examples of L inputs
from the training split at uniformly random depths, with fresh keys (`posab.passkey.examples`, the needle
evaluation's format and key length), from a generator seeded by the run's seed. The loss is the mean
cross-entropy over the key digits only (every other position carries no gradient). The language model's
AdamW (`posab.training.optim`: its parameter groups, the encoding's group at `lr` x `encoding.lr_mult`
with `encoding.weight_decay`, `weight_decay` on the matrices only, the encoding's `constrain` after every
step) at base lr `lr` with torch's betas (`BETAS`), after `warmup_steps` of linear warmup, then constant
(`schedule: constant`) or cosine decay towards `min_lr_ratio * lr` (`schedule: cosine`; the language
model's schedule, `posab.training.loop.warmup_cosine`), clipping at `grad_clip` (the language model's
step, `optimizer_step`). The loop (cadence, checkpoints, pre-emption) is the language model's too
(`posab.training.loop.run_steps`).
`train/needle_loss` is logged every `log_every` steps against the global step (language-model steps +
stage steps). Every `probe_every` steps (and at the end) a fixed set of `probe_examples` passkey examples
at the curriculum's last length (drawn once, fresh keys, their own generator) is scored greedily and
`passkey/acc` logged: whether retrieval at the training length is stable from checkpoint to checkpoint.
The stage
checkpoints into `checkpoint_passkey.pt` every `checkpoint_every` steps and at its end, and a rerun of
the command resumes it there (SIGTERM stops it cleanly, as in training). With `progress`, a tqdm bar
over the stage's steps shows the current length and key loss (rank 0 only).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from posab.data.streams import Batch, TokenStream
from posab.data.tokenizer import Tokenizer
from posab.device import autocast
from posab.encodings import EncodingOptimizer
from posab.errors import require
from posab.logging import Logger
from posab.model import DecoderLM
from posab.passkey.examples import passkey_batch
from posab.training.loop import Cadence, LoopState, run_steps, warmup_cosine
from posab.training.losses import token_losses
from posab.training.optim import build_optimizer, optimizer_step
from posab.training.state import load_optimizer_state, optimizer_state

BETAS = (0.9, 0.999)  # AdamW's (torch's defaults), the stage's since issue 14; not train.beta1/beta2
OLD_CHECKPOINT = (
    "delete checkpoint_passkey.pt from the run directory; rerun the same command and the stage starts "
    "again from the language model's final weights"
)


@dataclass
class PasskeyStageConfig:
    enabled: bool = False
    lengths: list[int] = field(default_factory=lambda: [96, 192, 384, 512])  # the curriculum, inputs
    steps: list[int] = field(default_factory=lambda: [400, 200, 200, 400])  # steps at each length
    batch_tokens: int = 4096  # examples per step at length L: max(1, batch_tokens // L)
    lr: float = 1e-3
    warmup_steps: int = 20
    schedule: str = "cosine"  # constant | cosine (to min_lr_ratio * lr at the last step)
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0  # on the model's matrices (the encoding's: encoding.weight_decay)
    grad_clip: float = 1.0
    log_every: int = 10
    checkpoint_every: int = 100
    probe_every: int = 50  # 0: no probe
    probe_examples: int = 32
    progress: bool = True  # a tqdm bar over the stage's steps (rank 0 only), with the length and key loss

    def validate(self, train_len: int) -> None:
        """Check the curriculum against the training length: the stage never goes past it."""
        p = "passkey"
        require(
            len(self.lengths) == len(self.steps) > 0,
            f"{p}.lengths={self.lengths} and {p}.steps={self.steps} must be non-empty lists of one length",
        )
        too_long = [n for n in self.lengths if not 0 < n <= train_len]
        require(
            not too_long,
            f"{p}.lengths={self.lengths}: every length must be in 1..train.seq_len={train_len}, so that "
            f"every evaluation length above the training length stays unseen (bad: {too_long})",
        )
        require(all(s > 0 for s in self.steps), f"{p}.steps={self.steps}: every count must be positive")
        for name in ("batch_tokens", "log_every", "checkpoint_every"):
            require(getattr(self, name) > 0, f"{p}.{name}={getattr(self, name)} must be a positive integer")
        require(self.lr > 0, f"{p}.lr={self.lr} must be positive")
        require(self.warmup_steps >= 0, f"{p}.warmup_steps={self.warmup_steps} must be >= 0")
        require(self.weight_decay >= 0, f"{p}.weight_decay={self.weight_decay} must be >= 0")
        require(
            self.schedule in SCHEDULES, f"{p}.schedule={self.schedule!r} is not one of {sorted(SCHEDULES)}"
        )
        require(0 <= self.min_lr_ratio <= 1, f"{p}.min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        require(self.probe_every >= 0, f"{p}.probe_every={self.probe_every} must be >= 0 (0: no probe)")
        require(self.probe_examples > 0, f"{p}.probe_examples={self.probe_examples} must be positive")

    @property
    def total_steps(self) -> int:
        return sum(self.steps)

    def length_at(self, step: int) -> int:
        """The example length of stage step `step` (0-based) in the curriculum."""
        for length, end in zip(self.lengths, np.cumsum(self.steps), strict=True):
            if step < end:
                return length
        raise ValueError(f"stage step {step} is past the curriculum's {self.total_steps} steps")

    def batch_size(self, length: int) -> int:
        return max(1, self.batch_tokens // length)

    def lr_factor(self, step: int) -> float:
        """The learning rate of stage step `step` (0-based) as a fraction of `lr`."""
        floor = 1.0 if self.schedule == "constant" else self.min_lr_ratio
        return warmup_cosine(step, self.warmup_steps, self.total_steps, floor)


SCHEDULES = {"constant", "cosine"}


@torch.no_grad()
def key_accuracy(model: nn.Module, batch: Batch) -> float:
    """The share of examples whose key greedy decoding returns: every key position's argmax is its digit
    (the needle evaluation's criterion; the argument is in `posab.evaluate.needle`)."""
    if batch.key_mask is None:
        raise ValueError("key_accuracy needs a batch of passkey examples (a key mask)")
    logits = model(batch.inputs, batch.sentence, batch.paragraph)  # (B, T, V)
    right = (logits.argmax(dim=-1) == batch.targets) | ~batch.key_mask  # (B, T)
    return float(right.all(dim=1).float().mean())


def key_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Mean cross-entropy over the key digits (`batch.key_mask`) only; no other position carries gradient."""
    if batch.key_mask is None:
        raise ValueError("key_loss needs a batch of passkey examples (a key mask)")
    return token_losses(model, batch)[batch.key_mask].mean()  # (B, T) -> (keys,) -> ()


@dataclass
class StageProgress(LoopState):
    """Where the stage stands; saved in its checkpoint."""

    probes: list[list[float]] = field(default_factory=list)  # [stage step, key accuracy]


class PasskeyStage:
    def __init__(
        self,
        model: DecoderLM,
        stream: TokenStream,
        tokenizer: Tokenizer,
        cfg: PasskeyStageConfig,
        encoding_optimizer: EncodingOptimizer,
        key_digits: int,
        seed: int,
        logger: Logger,
        dtype: torch.dtype | None,
        checkpoint: Callable[[dict[str, Any]], None],
        first_step: int = 0,
    ) -> None:
        """`encoding_optimizer`: how the encoding's parameters are trained (`encoding.lr_mult`,
        `encoding.weight_decay`, as in language-model training); `checkpoint(state)` stores the stage's
        state; `first_step`: the global step the stage starts after (the language-model steps), for
        logging."""
        self.model, self.stream, self.tokenizer, self.cfg = model, stream, tokenizer, cfg
        self.key_digits, self.logger, self.dtype, self.checkpoint = key_digits, logger, dtype, checkpoint
        self.first_step = first_step
        self.device = next(model.parameters()).device
        self.rng = np.random.default_rng([seed, 14])  # its own stream: not the training sampler's
        self.optimizer = build_optimizer(
            model, encoding_optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=BETAS
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, cfg.lr_factor)
        self.progress = StageProgress()
        probe_rng = np.random.default_rng([seed, 14, 1])  # fixed examples, whatever the stage draws
        self.probe = passkey_batch(
            stream, tokenizer, cfg.probe_examples, cfg.lengths[-1], probe_rng, key_digits
        ).to(self.device)

    def state_dict(self) -> dict[str, Any]:
        return {
            **optimizer_state(self.model, self.optimizer, self.scheduler),
            "rng": self.rng.bit_generator.state,
            "progress": asdict(self.progress),
            "step": self.progress.step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_optimizer_state(state, self.model, self.optimizer, self.scheduler, OLD_CHECKPOINT)
        self.rng.bit_generator.state = state["rng"]
        self.progress = StageProgress(**state["progress"])

    def step(self) -> float:
        """One optimizer step on passkey examples of the curriculum's current length; returns the key loss."""
        length = self.cfg.length_at(self.progress.step)
        batch = passkey_batch(
            self.stream, self.tokenizer, self.cfg.batch_size(length), length, self.rng, self.key_digits
        ).to(self.device)
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.device, self.dtype):
            loss = key_loss(self.model, batch)
        loss.backward()
        optimizer_step(self.model, self.optimizer, self.scheduler, self.cfg.grad_clip)
        return float(loss.detach())

    def fit(self) -> dict[str, Any]:
        """Run the remaining steps; returns the stage's summary for results.json."""
        cfg, progress = self.cfg, self.progress
        self.model.train()
        cadence = Cadence(cfg.total_steps, cfg.log_every, cfg.checkpoint_every, "passkey", cfg.progress)
        run_steps(progress, cadence, self.step, self._after_step, lambda: self.checkpoint(self.state_dict()))
        self.model.eval()
        return {
            "steps": cfg.total_steps,
            "time_s": round(progress.time_s, 2),
            "needle_loss": float(np.mean(progress.recent_losses)) if progress.recent_losses else math.nan,
            "probe_acc": progress.probes[-1][1] if progress.probes else math.nan,
            "probes": progress.probes,
            "curriculum": {"lengths": list(cfg.lengths), "steps": list(cfg.steps)},
        }

    def _probe(self) -> float:
        """Greedy key accuracy on the fixed probe examples at the curriculum's last length."""
        self.model.eval()
        with autocast(self.device, self.dtype):
            accuracy = key_accuracy(self.model, self.probe)
        self.model.train()
        self.progress.probes.append([self.progress.step, accuracy])
        return accuracy

    def _after_step(self, seconds: float, bar: tqdm) -> None:
        """The log line (key loss, length) and the probe at their cadence."""
        progress, cfg = self.progress, self.cfg
        done, last = progress.step, progress.step == cfg.total_steps
        metrics: dict[str, float] = {}
        if done % cfg.log_every == 0 or last:
            metrics["train/needle_loss"] = float(np.mean(progress.recent_losses))
            metrics["passkey/length"] = cfg.length_at(done - 1)
            bar.set_postfix(length=metrics["passkey/length"], key_loss=f"{metrics['train/needle_loss']:.3f}")
        if cfg.probe_every and (done % cfg.probe_every == 0 or last):
            metrics["passkey/acc"] = self._probe()
        if metrics:
            self.logger.log(metrics, self.first_step + done)
