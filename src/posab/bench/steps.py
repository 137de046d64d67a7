"""The training step the benchmark times: `posab.training.Trainer.step` itself, with the run's optimizer
groups, schedule, autocast, clipping and sampler, on a synthetic stream (sections 2, 4 and 5)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from posab.bench.inputs import synthetic_stream
from posab.bench.settings import CPU
from posab.config import Config
from posab.data import CorpusData
from posab.data.tokenizer import ByteTokenizer
from posab.encodings import encoding_optimizer
from posab.logging import NullLogger
from posab.run.wiring import train_sampler
from posab.training.trainer import Trainer

STREAM_WINDOWS = 64  # the synthetic training split holds this many windows of the training length


def keep_no_checkpoint(state: dict[str, Any], kind: str) -> None:
    """The benchmark's Trainer saves nothing."""


def benchmark_trainer(model: nn.Module, cfg: Config) -> Trainer:
    """A Trainer as `posab.run` builds one for `cfg` (its sampler, with the passkey share `data.needle_rate`;
    AdamW with the encoding's group; the schedule; autocast), on the CPU, over a synthetic split of byte
    tokens, logging nothing. `model` is posab's, or any module called as model(inputs, sentence,
    paragraph) -> logits (the peer library's, through `TokensOnly`)."""
    stream = synthetic_stream(STREAM_WINDOWS * (cfg.train.seq_len + 1))
    data = CorpusData(ByteTokenizer(anchors=cfg.data.anchors), {"train": stream, "valid": stream}, Path())
    optimizer = encoding_optimizer(cfg.encoding)
    model.train()
    return Trainer(
        model, train_sampler(cfg, data), stream, cfg.train, NullLogger(), CPU, keep_no_checkpoint, optimizer
    )


def training_step(model: nn.Module, cfg: Config) -> Callable[[], object]:
    """One optimizer step of `benchmark_trainer(model, cfg)`: `Trainer.step`, as training takes it."""
    return benchmark_trainer(model, cfg).step
