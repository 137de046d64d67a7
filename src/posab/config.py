"""The run's typed configuration: one section per component, each defined and validated by its component.

Hydra composes YAML from `conf/`; `load_config` merges the result strictly into `Config`, so a misspelt
key or a value of the wrong type fails at start-up with a message naming the key; then every section
validates its values (`ModelConfig.validate`, `EvalConfig.validate`, ... and the encoding's
`Encoding.check_params`). Everything below `posab.run` receives these typed values, never a `DictConfig`.

This module sits above the components it assembles (model, data, training, evaluation, logging); none of
them imports it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from posab.data.config import DataConfig
from posab.encodings import encoding_class
from posab.errors import ConfigError
from posab.evaluate import EvalConfig
from posab.logging import LoggerConfig
from posab.model import ModelConfig
from posab.passkey.stage import PasskeyStageConfig
from posab.training.trainer import TrainConfig


@dataclass
class Config:
    # the encoding's node is a plain dict: each encoding has its own settings, checked by its class
    encoding: dict[str, Any] = field(default_factory=dict)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)  # type: ignore[valid-type]
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    passkey: PasskeyStageConfig = field(default_factory=PasskeyStageConfig)  # the passkey stage
    seed: int = 0
    experiment: str = "default"
    threads: int | None = None  # torch threads; None: all cores, shared out among parallel local jobs


def load_config(cfg: DictConfig) -> Config:
    """Merge a composed config strictly into the schema and validate every section."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Config), cfg)
        typed: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as err:
        raise ConfigError(_one_line(err)) from None
    for section in (typed.model, typed.data, typed.train, typed.eval, typed.logger):
        section.validate()
    if typed.passkey.enabled:
        typed.passkey.validate(typed.train.seq_len)
    encoding_class(typed.encoding)
    return typed


def _one_line(err: OmegaConfBaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    key = getattr(err, "full_key", None)
    summary = lines[0] if lines else type(err).__name__
    return f"invalid config key '{key}': {summary}" if key else f"invalid config: {summary}"


def config_container(cfg: Config) -> dict[str, Any]:
    """The typed config as plain dicts and lists (for checkpoints and their compatibility checks)."""
    return OmegaConf.to_container(OmegaConf.structured(asdict(cfg)))  # type: ignore[return-value]
