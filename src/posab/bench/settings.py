"""What one benchmark run measures (quick or full sizes, repetitions) and the run config it composes."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from hydra import compose, initialize_config_dir

from posab.config import Config, load_config
from posab.device import autocast_dtype
from posab.paths import conf_dir, encoding_names

CPU = torch.device("cpu")
QUICK_MODEL = "tiny"
QUICK_OVERRIDES = (
    f"model={QUICK_MODEL}",
    "train.seq_len=64",
    "train.batch_size=2",
    "eval.lengths=[64,128]",
    "eval.batch_tokens=256",
    "eval.shift.prefix_lengths=[16,32]",  # below the quick training length
    "data.needle_rate=0",  # a passkey example needs more than 64 tokens
)


@dataclass(frozen=True)
class Settings:
    """What one benchmark run measures: config overrides and repetition counts."""

    quick: bool
    repeats: int
    warmup: int
    overrides: tuple[str, ...]
    matmul_size: int
    flops_models: tuple[str, ...]  # section 5's model configs
    encodings: tuple[str, ...] = ()  # sections 2 and 3 time these (every encoding when empty)

    @staticmethod
    def build(quick: bool, repeats: int | None, encodings: tuple[str, ...] = ()) -> Settings:
        if quick:
            return Settings(True, repeats or 1, 1, QUICK_OVERRIDES, 256, (QUICK_MODEL,), encodings)
        return Settings(False, repeats or 5, 2, (), 2048, ("small", "medium"), encodings)

    def encoding_names(self) -> list[str]:
        """The encodings sections 2 and 3 time: the chosen ones, or every conf/encoding/*.yaml."""
        return list(self.encodings) or encoding_names()

    def config(self, encoding: str | None = None, *extra: str) -> Config:
        """The composed run config with the benchmark's overrides (and `encoding=NAME` when given, and
        `extra` overrides)."""
        overrides = [*self.overrides, *([f"encoding={encoding}"] if encoding else []), *extra]
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            return load_config(compose(config_name="config", overrides=overrides))


def precision(cfg: Config) -> torch.dtype | None:
    """The autocast dtype training uses on this CPU (None: fp32)."""
    return autocast_dtype(cfg.train.precision, CPU)


def dtype_name(dtype: torch.dtype | None) -> str:
    return "bf16" if dtype == torch.bfloat16 else "fp32"


def positive(text: str) -> int:
    """An argparse type: a positive integer, else an error naming the value."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value
