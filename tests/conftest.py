"""Shared helpers: every encoding is discovered from conf/encoding/*.yaml, so a new one is tested at once."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from posab.build import build_model
from posab.config import Config, load_config
from posab.data import CorpusData, DataConfig, SyntheticConfig, prepare_data
from posab.data.tokenizer import VOCAB_SIZE
from posab.model import DecoderLM
from posab.paths import encoding_names

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
ENCODINGS = encoding_names(CONF)


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides or [])


def typed_config(overrides: list[str] | None = None) -> Config:
    return load_config(compose_config(overrides))


def tiny_model(encoding: str, *overrides: str, seed: int = 0) -> DecoderLM:
    """A tiny fp32 model with the given encoding, in eval mode, sized for positions up to 1000 + 512."""
    reach = ["eval.lengths=[128,256,512]", "eval.shift.offsets=[1,64,1000]"]  # learned tables cover the tests
    cfg = typed_config(["+experiment=tiny", *reach, f"encoding={encoding}", *overrides])
    torch.manual_seed(seed)
    return build_model(cfg, VOCAB_SIZE).eval()


def isolated_env() -> dict[str, str]:
    """The environment for subprocess runs: W&B offline, its staging and cache folders in a temp folder."""
    scratch = Path(tempfile.gettempdir()) / "posab-tests-wandb"
    return {
        **os.environ,
        "HYDRA_FULL_ERROR": "0",
        "WANDB_MODE": "offline",
        "WANDB_DATA_DIR": str(scratch / "data"),
        "WANDB_CACHE_DIR": str(scratch / "cache"),
    }


def run_train(args: list[str], cwd: Path = ROOT, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """`python train.py ARGS` as a user would run it."""
    env = isolated_env()
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> CorpusData:
    """A small synthetic corpus, tokenized once per test session (a test module may define its own)."""
    synthetic = SyntheticConfig(vocab_size=300, train_docs=3, valid_docs=2, test_docs=1)
    return prepare_data(
        DataConfig(cache_dir=str(tmp_path_factory.mktemp("corpus") / "cache"), synthetic=synthetic)
    )


@pytest.fixture(params=ENCODINGS)
def encoding(request: pytest.FixtureRequest) -> str:
    return request.param
