"""Context extension as a second stage (issue 59): RoPE trained with PI's or YaRN's frequencies (the
methods' formulas, computed for the first stage's length, with no evaluation-time variants on top); a run
continued from another with its encoding changed (`train.init_encoding=changed`: DroPE's RoPE -> NoPE, an
extension's RoPE -> RoPE with YaRN at twice the length) takes that run's own weights exactly; a checkpoint
from before a setting existed stays compatible at the setting's old value; and the errors that say how."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from conftest import run_main, typed_config
from posab.build import build_model
from posab.config import config_container
from posab.data import prepare_data
from posab.encodings import Dims
from posab.encodings.rope import RoPE, attention_factor, rope_frequencies, scaled_frequencies
from posab.errors import ConfigError
from posab.report.rundirs import load_run
from posab.run.directory import CHECKPOINTS, check_compatible, load_checkpoint, load_initial_model

DIMS = Dims(d_model=32, n_heads=2, train_len=256)  # head_dim 16


def test_rope_trained_with_a_scaling_has_the_methods_frequencies() -> None:
    pi = RoPE(DIMS, scaling="pi", scaling_factor=4.0, original_len=64)
    assert torch.equal(pi.inv_freq, rope_frequencies(1e4, 16) / 4.0) and pi.attention_factor == 1.0
    yarn = RoPE(DIMS, scaling="yarn", scaling_factor=4.0, original_len=64)
    assert torch.equal(yarn.inv_freq, scaled_frequencies("yarn", 4.0, 1e4, 16, 64))
    assert yarn.attention_factor == attention_factor("yarn", 4.0) == 0.1 * math.log(4.0) + 1
    assert yarn.variants == () and RoPE(DIMS).variants == ("pi", "ntk", "yarn")
    with pytest.raises(ValueError, match="trained with scaling='yarn'"), yarn.variant("pi", 2.0):
        pass
    with pytest.raises(ConfigError, match="use a scaling of none, pi, ntk, yarn"):
        RoPE(DIMS, scaling="linear", scaling_factor=2.0)
    with pytest.raises(ConfigError, match="a factor >= 1"):
        RoPE(DIMS, scaling="pi", scaling_factor=0.5)


def test_a_checkpoint_from_before_a_setting_compares_at_its_old_value() -> None:
    current = config_container(typed_config(["+experiment=tiny"]))
    older = {**current, "model": {k: v for k, v in current["model"].items() if k not in ("ssmax", "canon")}}
    check_compatible(older, current, Path("run"), ("model", "encoding"))  # the defaults those runs had
    changed = config_container(typed_config(["+experiment=tiny", "model.ssmax=true"]))
    with pytest.raises(ConfigError, match="model.ssmax: None in the checkpoint, True now"):
        check_compatible(older, changed, Path("run"), ("model", "encoding"))


STAGE = ["+experiment=tiny", "train.steps=4", "train.val_every=2", "train.checkpoint_every=4"]


@pytest.fixture(scope="module")
def first_stage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("first")
    results = run_main([*STAGE, "encoding=rope"], folder)
    assert results["status"] == "finished"
    return folder


@pytest.mark.parametrize(
    "second",
    [
        ["encoding=nope"],  # DroPE: the rotation dropped, at the training length
        ["encoding=rope", "encoding.scaling=yarn", "encoding.scaling_factor=2", "encoding.original_len=128"]
        + ["train.seq_len=256", "eval.lengths=[256,512]"],  # YaRN trained at twice the length
    ],
)
def test_a_second_stage_starts_from_the_first_stages_weights(
    first_stage: Path, second: list[str], tmp_path: Path
) -> None:
    overrides = [*STAGE, *second, f"train.init_from={first_stage}", "train.init_encoding=changed"]
    cfg = typed_config(overrides)
    model = build_model(cfg, prepare_data(cfg.data).vocab_size)
    load_initial_model(cfg, model)
    saved = load_checkpoint(first_stage / CHECKPOINTS["latest"])["model"]
    for name, weight in model.state_dict().items():
        assert torch.equal(weight, saved[name]), name
    results = run_main(overrides, tmp_path)
    assert results["status"] == "finished" and math.isfinite(results["val_loss"])
    parent = results["parent"]  # the stage records the run it continues
    assert parent["run"] == str(first_stage) and parent["encoding"] == "rope" and parent["steps"] > 0
    # the report reads the stage's row by its parent's encoding, not by the folder (one per seed)
    assert load_run(tmp_path).config["train.init_from"] == "rope"


def test_a_second_stage_says_what_it_needs(first_stage: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="give train.init_from=RUN_DIR"):
        run_main([*STAGE, "train.init_encoding=changed"], tmp_path / "a")
    with pytest.raises(ConfigError, match=r"encoding\.name: 'rope' in the checkpoint, 'nope' now"):
        run_main([*STAGE, "encoding=nope", f"train.init_from={first_stage}"], tmp_path / "b")
    unfinished = tmp_path / "unfinished"
    shutil.copytree(first_stage, unfinished)
    results = json.loads((unfinished / "results.json").read_text())
    (unfinished / "results.json").write_text(json.dumps({**results, "status": "running"}))
    with pytest.raises(ConfigError, match=r"unfinished: that run has not finished \(status: running\)"):
        run_main([*STAGE, "encoding=nope", f"train.init_from={unfinished}", "train.init_encoding=changed"],
                 tmp_path / "d")  # fmt: skip
    with pytest.raises(ConfigError, match="does not exist"):  # a finished run whose weights are gone
        (unfinished / "results.json").write_text(json.dumps(results))
        (unfinished / CHECKPOINTS["latest"]).unlink()
        run_main([*STAGE, "encoding=nope", f"train.init_from={unfinished}", "train.init_encoding=changed"],
                 tmp_path / "e")  # fmt: skip
    with pytest.raises(ConfigError, match="train.init_encoding='sometimes': use same"):
        typed_config([*STAGE, "train.init_encoding=sometimes"])
    with pytest.raises(ConfigError, match="model.d_model"):
        run_main(
            [*STAGE, "encoding=nope", "model.d_model=64", f"train.init_from={first_stage}"]
            + ["train.init_encoding=changed"],
            tmp_path / "c",
        )
