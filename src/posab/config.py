"""Typed configuration schema.

Hydra composes YAML from `conf/`; `load_config` merges the result strictly into these dataclasses, so a
misspelt key or a value of the wrong type fails at start-up with a message naming the key. Everything
below `posab.run` receives these typed values, never a `DictConfig`.

The `encoding` group is the exception: each encoding has its own hyper-parameters, so its node is kept as
a plain dict and checked against the constructor of its `_target_` (see `posab.encodings.build`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from posab.encodings import encoding_class
from posab.errors import ConfigError


@dataclass
class ModelConfig:
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4
    dropout: float = 0.0


@dataclass
class SyntheticConfig:
    seed: int = 0
    vocab_size: int = 2000
    train_docs: int = 400
    valid_docs: int = 40
    test_docs: int = 40


@dataclass
class DataConfig:
    source: str = "synthetic"  # synthetic | text | hub
    path: str | None = None  # text: a folder (with train/valid/test or not), a file, or a glob
    hub_dataset: str | None = None  # hub: e.g. Salesforce/wikitext
    hub_subset: str | None = None  # hub: e.g. wikitext-103-raw-v1
    hub_local_dir: str | None = None  # hub: an offline copy (parquet or text files) instead of the hub
    text_field: str = "text"
    anchors: bool = True
    cache_dir: str = ".cache/posab"
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)


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


@dataclass
class EvalConfig:
    batch_tokens: int = 16384


@dataclass
class LoggerConfig:
    backend: str = "jsonl"  # jsonl | wandb
    project: str = "posab"
    mode: str = "offline"


@dataclass
class Config:
    encoding: dict[str, Any] = field(default_factory=dict)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = 0
    experiment: str = "default"


def load_config(cfg: DictConfig) -> Config:
    """Merge a composed config strictly into the schema and validate it."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Config), cfg)
        typed: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as err:
        raise ConfigError(_one_line(err)) from None
    validate(typed)
    return typed


def _one_line(err: OmegaConfBaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    key = getattr(err, "full_key", None)
    summary = lines[0] if lines else type(err).__name__
    return f"invalid config key '{key}': {summary}" if key else f"invalid config: {summary}"


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def validate(cfg: Config) -> None:
    """Check values that types alone cannot, before any work is done."""
    m, t = cfg.model, cfg.train
    for name in ("d_model", "n_layers", "n_heads", "mlp_ratio"):
        value = getattr(m, name)
        _require(value > 0, f"model.{name}={value} must be a positive integer")
    _require(
        m.d_model % m.n_heads == 0,
        f"model.d_model={m.d_model} is not divisible by model.n_heads={m.n_heads}",
    )
    for name in ("seq_len", "batch_size", "grad_accum", "steps", "val_every", "val_windows", "log_every"):
        value = getattr(t, name)
        _require(value > 0, f"train.{name}={value} must be a positive integer")
    _require(t.lr > 0, f"train.lr={t.lr} must be positive")
    _require(t.warmup_steps >= 0, f"train.warmup_steps={t.warmup_steps} must be >= 0")
    _require(0 <= t.min_lr_ratio <= 1, f"train.min_lr_ratio={t.min_lr_ratio} must be in [0, 1]")
    precisions = ("auto", "bf16", "fp32")
    _require(t.precision in precisions, f"train.precision={t.precision!r}: use auto, bf16 or fp32")
    _require(t.device in ("auto", "cpu", "cuda"), f"train.device={t.device!r}: use auto, cpu or cuda")
    sources = ("synthetic", "text", "hub")
    _require(cfg.data.source in sources, f"data.source={cfg.data.source!r}: use one of {', '.join(sources)}")
    _require("_target_" in cfg.encoding, "encoding: no _target_; pick one with encoding=NAME")
    encoding_class(cfg.encoding)
    _require(cfg.eval.batch_tokens > 0, f"eval.batch_tokens={cfg.eval.batch_tokens} must be positive")
