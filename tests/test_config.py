"""Every config composes and instantiates; bad settings fail at start-up, naming the setting."""

from __future__ import annotations

import re

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from conftest import CONF, compose_config, typed_config
from posab.build import build_model
from posab.config import Config
from posab.data.tokenizer import VOCAB_SIZE
from posab.errors import ConfigError

GROUP_OPTIONS = [
    (group.name, yaml.stem)
    for group in sorted(CONF.iterdir())
    if group.is_dir() and group.name not in ("experiment", "hydra")
    for yaml in sorted(group.glob("*.yaml"))
]
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


@pytest.mark.parametrize(("group", "option"), GROUP_OPTIONS)
def test_every_group_option_composes_and_instantiates(group: str, option: str) -> None:
    overrides = [f"{group}={option}"]
    if group == "task":
        overrides.insert(0, "data=task")  # a task is data=task's choice
    if option == "text":
        overrides.append("data.path=anywhere")  # required by the text source; not read here
    cfg = typed_config(overrides)
    assert isinstance(cfg, Config)
    model = build_model(cfg, VOCAB_SIZE)
    assert model.parameter_counts()["total"] > 0


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes(experiment: str) -> None:
    cfg = typed_config([f"+experiment={experiment}"])
    assert cfg.experiment == experiment
    build_model(cfg, VOCAB_SIZE)


def test_default_config() -> None:
    cfg = typed_config()
    assert cfg.train.seq_len == 512
    assert cfg.data.source == "synthetic"
    assert cfg.encoding["name"] == "rope"


def test_misspelt_key_is_named() -> None:
    with pytest.raises(ConfigError, match=r"train\.lrr"):
        typed_config(["+train.lrr=0.1"])
    with pytest.raises(ConfigCompositionException, match="lrr"):
        compose_config(["train.lrr=0.1"])


def test_misspelt_encoding_key_lists_valid_ones() -> None:
    with pytest.raises(
        ConfigError, match=r"no setting num_freq; valid settings: num_freqs, max_dist, hidden"
    ):
        typed_config(["encoding=multiscale", "+encoding.num_freq=8"])


def test_wrong_type_is_named() -> None:
    with pytest.raises(ConfigError, match=r"train\.steps"):
        typed_config(["train.steps=many"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.n_heads=3", "model.d_model=128 is not divisible by model.n_heads=3"),
        ("train.seq_len=0", "train.seq_len=0 must be a positive integer"),
        ("train.steps=-5", "train.steps=-5 must be a positive integer"),
        ("train.batch_size=0", "train.batch_size=0 must be a positive integer"),
        ("train.lr=0", "train.lr=0.0 must be positive"),
        ("train.precision=fp8", "train.precision='fp8'"),
        ("data.source=ftp", "data.source='ftp'"),
        ("data.needle_rate=1.5", "data.needle_rate=1.5 must be in [0, 1]"),
        ("data.needle_rate=-0.1", "data.needle_rate=-0.1 must be in [0, 1]"),
        ("eval.lengths=[512,0]", "eval.lengths=[512, 0]: every length must be >= 1 (bad: [0])"),
        ("train.batch_size=-2", "train.batch_size=-2 must be a positive integer"),
        ("train.lr=-0.001", "train.lr=-0.001 must be positive"),
        ("logger.mode=cloud", "logger.mode='cloud'"),
    ],
)
def test_bad_values_fail_with_the_setting_named(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        typed_config([override])


def test_schema_round_trip() -> None:
    cfg = typed_config(["encoding=alibi"])
    again = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.structured(cfg)))
    assert again == cfg
