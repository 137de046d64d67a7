"""A new encoding is two files, its class and its `conf/encoding/<name>.yaml` (issue 42, part 4): the tests
and the presets pick it up from the yaml alone. Shown on a throwaway encoding in a copy of conf/
(`$POSAB_CONF`, which tests/conftest.py composes from) whose class lives in a module of its own on
PYTHONPATH; and the lists the presets derive (posab.sweep_lists), checked against what they replaced."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from conftest import CONF, ENCODINGS, ROOT, isolated_env, tiny_model
from posab.paths import CONF_ENV, encoding_options
from posab.sweep_lists import LEGACY_ORDER, has_parameters, sweep_order

MODULE = "posab_throwaway_encodings"
# Five throwaways a new user could add, each its class (or a second yaml of one) in a module of its own:
# a distance bias with a parameter (ALiBi at a fraction of its slopes times a learned gain per head, so that
# it joins both derived lists and the bias checks), the same class at another fraction, a rotary encoding
# (RoPE without its lowest frequencies, as p-RoPE), a content-dependent one (FoX with its gates starting
# near 1, x-transformers' DataDependentAlibi) and a NoPE by another name.
SOURCE = '''"""Throwaway encodings for tests/test_new_encoding.py."""

import torch
from torch import Tensor, nn

from posab.encodings.alibi import ALiBi
from posab.encodings.base import Dims
from posab.encodings.fox import FoX
from posab.encodings.nope import NoPE
from posab.encodings.rope import RoPE


class Throwaway(ALiBi):
    """ALiBi at `fraction` of its slopes, times a learned gain per head (starting at 1)."""

    def __init__(self, dims: Dims, fraction: float = 0.5) -> None:
        super().__init__(dims)
        self.slopes = self.slopes * fraction
        self.gain = nn.Parameter(torch.ones(dims.n_heads))

    def distance_bias(self, distance: Tensor) -> Tensor:
        return -(self.slopes * self.gain)[:, None] * distance[None, :]


class ThrowawayRotary(RoPE):
    """RoPE rotating by its `keep` highest frequencies only (the others at angle 0), as p-RoPE."""

    def __init__(self, dims: Dims, keep: float = 0.75) -> None:
        super().__init__(dims)
        self.kept = max(1, round(keep * self.rotary_dim / 2))

    def _grow(self, max_position: int) -> None:
        full = self.inv_freq
        self.inv_freq = torch.where(torch.arange(len(full), device=full.device) < self.kept, full, 0.0)
        try:
            super()._grow(max_position)
        finally:
            self.inv_freq = full


class ThrowawayForget(FoX):
    """FoX with its gate biases starting at 5 (forget gates near 1)."""

    def __init__(self, dims: Dims) -> None:
        super().__init__(dims, gate_bias_init=5.0)


class ThrowawayNope(NoPE):
    """NoPE by another name."""
'''
OPTIMIZER = """lr_mult: 1.0  # the encoding's parameters train at train.lr x lr_mult (an AdamW group)
weight_decay: 0.0  # on the encoding's parameters: none
"""
YAMLS = {  # name: its conf/encoding yaml
    "throwaway": f"""# A throwaway: ALiBi at half its slopes, times a learned gain per head.
name: throwaway
_target_: {MODULE}.Throwaway
fraction: 0.5  # of ALiBi's slopes
{OPTIMIZER}""",
    "throwaway_quarter": f"""# A throwaway: ALiBi at a quarter of its slopes, times a learned gain per head.
name: throwaway_quarter
_target_: {MODULE}.Throwaway
fraction: 0.25  # of ALiBi's slopes
{OPTIMIZER}""",
    "throwaway_rotary": f"""# A throwaway: RoPE at its highest 3/4 of frequencies (as p-RoPE).
name: throwaway_rotary
_target_: {MODULE}.ThrowawayRotary
keep: 0.75  # of the frequencies, the highest
{OPTIMIZER}""",
    "throwaway_forget": f"""# A throwaway: FoX with its gate biases at 5 (x-transformers' DataDependentAlibi).
name: throwaway_forget
_target_: {MODULE}.ThrowawayForget
{OPTIMIZER}""",
    "throwaway_nope": f"""# A throwaway: NoPE by another name.
name: throwaway_nope
_target_: {MODULE}.ThrowawayNope
{OPTIMIZER}""",
}
# The tests the throwaways must go through besides their own parametrized ones: the presets that cover
# every encoding sweep them, tune_lr grids the lr_mult of those with a parameter, and the figures' colours
# (an encoding's colour once moved with every added name).
PRESET_TESTS = ("preset_that_says_every_encoding", "tune_lr_gives_every_encoding", "colour")
SUBPROCESS_TIMEOUT = 1800  # seconds: the fast tier's tests of one encoding, collected from every test file


def test_sweep_order_keeps_the_hand_written_order_and_puts_a_later_encoding_after_it_by_name() -> None:
    assert sweep_order(ENCODINGS)[: len(LEGACY_ORDER)] == [n for n in LEGACY_ORDER if n in ENCODINGS]
    assert sweep_order(["zeta", "rope", "beta", "nope"]) == ["nope", "rope", "beta", "zeta"]
    assert sorted(sweep_order(ENCODINGS)) == ENCODINGS


def test_has_parameters_agrees_with_the_model_s_encoding(encoding: str) -> None:
    """What tune_lr's lr_mult grid derives from the yaml (at small sizes) is what a model built from the
    composed config has: trainable encoding parameters."""
    built = tiny_model(encoding).encoding
    trainable = sum(p.numel() for p in built.parameters() if p.requires_grad)
    assert has_parameters(encoding_options(encoding, CONF)) == (trainable > 0)


def test_deriving_the_list_with_parameters_leaves_torch_s_generator_where_it_was() -> None:
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    assert any(has_parameters(encoding_options(name, CONF)) for name in ENCODINGS)
    assert torch.equal(torch.rand(3), expected)


def test_a_preset_read_without_hydra_takes_the_encodings_of_the_conf_folder() -> None:
    """Without the composed `hydra.runtime.config_sources` (a preset loaded by OmegaConf alone), the lists
    come from posab.paths.conf_dir(), the folder the tests compose from."""
    preset = OmegaConf.load(CONF / "experiment" / "tune_lr.yaml")
    every, with_parameters = (grid.encoding for grid in preset.hydra.sweeper.grids)
    assert every == ",".join(sweep_order(ENCODINGS))
    assert with_parameters.split(",") == [
        name for name in sweep_order(ENCODINGS) if has_parameters(encoding_options(name, CONF))
    ]


def two_file_conf(root: Path) -> tuple[Path, Path]:
    """A copy of conf/ with the throwaways' yamls, and a folder holding their module: (conf folder, module
    folder)."""
    conf, modules = root / "conf", root / "modules"
    shutil.copytree(CONF, conf)
    for name, text in YAMLS.items():
        (conf / "encoding" / f"{name}.yaml").write_text(text)
    modules.mkdir()
    (modules / f"{MODULE}.py").write_text(SOURCE)
    return conf, modules


def junit_cases(path: Path) -> list[tuple[str, str, str]]:
    """(class name, test name, outcome) of each test case of a JUnit XML report; outcome: passed, failed,
    error or skipped."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcomes = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcome = {"failure": "failed"}.get(outcomes[0], outcomes[0]) if outcomes else "passed"
        cases.append((case.get("classname", ""), case.get("name", ""), outcome))
    return cases


@pytest.mark.e2e
def test_a_new_encoding_is_its_class_and_its_yaml(tmp_path: Path) -> None:
    """The fast tier's tests of every encoding, run on the five throwaways alone (`-k`): their parametrized
    tests in whichever test files have them (at least test_model's), the preset tests and the colour tests
    pass with no other file edited."""
    conf, modules = two_file_conf(tmp_path)
    report = tmp_path / "junit.xml"
    selection = " or ".join(["throwaway", *PRESET_TESTS])
    env = {**isolated_env(), CONF_ENV: str(conf)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(modules), env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", selection,
               f"--junitxml={report}", str(ROOT / "tests")]  # fmt: skip
    proc = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    cases = junit_cases(report)
    assert not [c for c in cases if c[2] in ("failed", "error")]
    ran = [(module, name) for module, name, outcome in cases if outcome == "passed"]
    for name in YAMLS:
        mine = [(module, test) for module, test in ran if f"[{name}]" in test or f"[{name}-" in test
                or f"-{name}]" in test or f"-{name}-" in test]  # fmt: skip
        assert any(module.endswith("test_model") for module, _ in mine), (name, mine)  # `encoding` fixture's
        assert any(test.startswith("test_has_parameters_agrees") for _, test in mine), (name, mine)
    for test in PRESET_TESTS:
        assert any(test in name for _, name in ran), f"no passing test matched {test}"
