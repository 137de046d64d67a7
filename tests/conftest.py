"""Shared helpers: every encoding is discovered from conf/encoding/*.yaml, so a new one is tested at once.

Two tiers: the fast tier runs in this process; a test that starts this venv's Python or one of its tools
(train.py, torchrun, scripts/, `wandb leet`) in a subprocess is marked `e2e`, and the guard below fails a
test that does so unmarked (module fixtures included: they run during their first test's setup).
"""

from __future__ import annotations

import copy
import functools
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig

from hydra_plugins.posab_grid_sweeper.grid_sweeper import expand_grids
from posab.build import build_model
from posab.config import Config, load_config
from posab.data import CorpusData, DataConfig, SyntheticConfig, prepare_data
from posab.data.tokenizer import VOCAB_SIZE
from posab.model import DecoderLM
from posab.paths import conf_dir, encoding_names
from posab.run import wiring as run

ROOT = Path(__file__).resolve().parents[1]
# The config tree the tests compose and take the encodings from: this checkout's conf/, or `$POSAB_CONF`
# (posab.paths.conf_dir), e.g. a copy with one more encoding (tests/test_new_encoding.py)
CONF = conf_dir()
ENCODINGS = encoding_names(CONF)
# In-process tests use one torch thread: their tensors are tiny, so a second thread saves nothing on an idle
# machine, and on a busy one threads that wait for each other make them many times slower. (Subprocess runs
# choose their own count, as a user's do.)
TEST_THREADS = 1
torch.set_num_threads(TEST_THREADS)


@functools.cache
def _composed(overrides: tuple[str, ...]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    """The config `python train.py OVERRIDES` composes. Composed once per distinct overrides (Hydra takes
    ~0.1 s a time, and the fast tier asks ~360 times for ~170 configs); each caller gets its own copy."""
    return copy.deepcopy(_composed(tuple(overrides or [])))


def preset_grids(name: str) -> list[dict[str, Any]]:
    """A preset's grids, values as its sweeper receives them (YAML null as None): the grids sweeper's
    `grids`, or the basic sweeper's `params` as one grid (BasicSweeper.split_arguments takes one product)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"+experiment={name}"], return_hydra_config=True)
    sweeper = cfg.hydra.sweeper
    grids = sweeper.grids if "grids" in sweeper else [sweeper.get("params") or {}]
    return [dict(grid.items()) for grid in grids]


def preset_jobs(name: str, overrides: Sequence[str] = ()) -> list[list[str]]:
    """The jobs `python train.py -m +experiment=NAME OVERRIDES` launches, each its overrides, as its
    sweeper expands them (a command-line override narrows or extends every grid)."""
    parser = OverridesParser.create()
    return expand_grids(preset_grids(name), parser.parse_overrides(list(overrides)), parser)


def typed_config(overrides: list[str] | None = None) -> Config:
    return load_config(compose_config(overrides))


def tiny_model(encoding: str, *overrides: str, seed: int = 0) -> DecoderLM:
    """A tiny fp32 model with the given encoding, in eval mode, sized for positions up to 1000 + 512."""
    reach = ["eval.lengths=[128,256,512]", "eval.shift.offsets=[1,64,1000]"]  # learned tables cover the tests
    cfg = typed_config(["+experiment=tiny", *reach, f"encoding={encoding}", *overrides])
    torch.manual_seed(seed)
    return build_model(cfg, VOCAB_SIZE).eval()


def run_main(overrides: list[str], run_dir: Path) -> dict[str, Any]:
    """In-process `python train.py OVERRIDES`: posab.run.wiring.main on the config train.py composes, with the
    JSONL logger (unless `overrides` choose one) on TEST_THREADS threads, writing into `run_dir`. A bad
    input raises its ConfigError (train.py prints it on one line and exits with 2: tests/test_cli.py)."""
    logger = [] if any(o.startswith("logger=") for o in overrides) else ["logger=jsonl"]
    cfg = compose_config([*logger, f"threads={TEST_THREADS}", *overrides])
    return run.main(cfg, run_dir)


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


def venv_program(args: object, executable: object = None) -> str | None:
    """The program a Popen call starts when it is this venv's Python or a tool beside it, else None."""
    if executable is not None:
        program = os.fsdecode(executable)  # type: ignore[arg-type]
    elif isinstance(args, str | bytes | os.PathLike):
        program = os.fsdecode(args).split(maxsplit=1)[0] if os.fsdecode(args).strip() else ""
    else:
        program = next((os.fsdecode(a) for a in args), "")  # type: ignore[attr-defined]
    return program if program and Path(program).parent == Path(sys.executable).parent else None


_in_e2e_test = False


def _guarded_popen_new(cls, args, *rest, **kwargs):  # type: ignore[no-untyped-def]
    """Popen's constructor, refused before any process starts when the running test is not marked e2e
    (or slow)."""
    program = venv_program(args, kwargs.get("executable"))
    if program is not None and not _in_e2e_test:
        raise AssertionError(f"a test that starts {program} in a subprocess must be marked e2e")
    return object.__new__(cls)


def pytest_configure(config: pytest.Config) -> None:
    subprocess.Popen.__new__ = _guarded_popen_new  # type: ignore[method-assign,assignment]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the item's fixtures are set up: whether it (and so the fixtures it starts) may launch: e2e
    tests, and slow ones (outside the fast tier too: FlexAttention's compile starts inductor's workers)."""
    global _in_e2e_test
    _in_e2e_test = any(item.get_closest_marker(marker) is not None for marker in ("e2e", "slow"))


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


@pytest.fixture(autouse=True)
def torch_threads() -> Iterator[None]:
    """Back to TEST_THREADS after each test: posab.run.wiring.main sets its run's thread count."""
    yield
    torch.set_num_threads(TEST_THREADS)


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


# Cached decoding and device placement (tests/test_cache_equivalence.py, tests/test_meta_device.py)
VOCAB = 250  # token ids drawn below VOCAB_SIZE (the byte tokenizer's 256 bytes and its anchors)
# the forms' options beside the defaults: the multi-scale bias's FIRE input (its normaliser moves past the
# training length: the dense form), the held input, the multiplicative form and the clamp; the
# hierarchical bias's structural levels alone (the low-rank form without a shared part) and its token level
VARIANTS = [
    ("multiscale", "encoding.input=fire"),
    ("multiscale", "encoding.input=fire_held"),
    ("multiscale", "encoding.form=multiplicative"),
    ("multiscale", "encoding.clamp=train"),
    ("hierarchical", "encoding.levels=[sentence,paragraph]"),
    ("hierarchical", "encoding.levels=[token]"),
    ("nope", "model.window=16"),  # sliding-window attention: the causal form's band
    ("alibi", "model.window=16"),  # and an additive form's
    ("fox", "model.window=16"),  # and the forget gate's own form
    ("fox", "encoding.gate_bias_init=5.0"),  # DataDependentAlibi's gate bias: a slow decay
    ("t5", "encoding.scale_logits=false"),  # T5's own logits, q . k (issue 58): its queries scaled in rotate
]
CASES = [(name, None) for name in ENCODINGS] + VARIANTS  # every encoding, then the variants


def text_like(length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(2, length) tokens with sentence and paragraph indices that grow like text's."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (2, length), generator=g)
    sentence = torch.cumsum(torch.rand(2, length, generator=g) < 0.15, dim=1)
    paragraph = torch.cumsum(torch.rand(2, length, generator=g) < 0.04, dim=1)
    return tokens, sentence, paragraph
