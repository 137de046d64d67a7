"""The passkey stage takes the language model's optimizer (issue 42, one optimizer path): the same AdamW
groups, the encoding's at the stage's lr x `encoding.lr_mult` with `encoding.weight_decay`, KERPLE's
projection after every step, and a checkpoint of the one-group optimizer before it refused by name."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from conftest import tiny_model, typed_config
from posab.build import build_model
from posab.config import Config
from posab.data import CorpusData
from posab.data.tokenizer import VOCAB_SIZE
from posab.encodings import EncodingOptimizer, encoding_optimizer
from posab.encodings.kerple import FLOOR, Kerple
from posab.errors import ConfigError
from posab.logging import NullLogger
from posab.model import DecoderLM
from posab.passkey.stage import BETAS, PasskeyStage, PasskeyStageConfig
from posab.training.trainer import train_optimizer

QUICK = {"lengths": [96], "steps": [3], "batch_tokens": 192, "log_every": 1, "probe_every": 0}


def stage_of(model: DecoderLM, corpus: CorpusData, enc: EncodingOptimizer, **settings: Any) -> PasskeyStage:
    """A stage of 3 steps at length 96 (2 examples a step) on `corpus`, saving nothing."""
    cfg = PasskeyStageConfig(enabled=True, progress=False, **{**QUICK, **settings})
    train = corpus.streams["train"]
    return PasskeyStage(
        model, train, corpus.tokenizer, cfg, enc, 5, 0, NullLogger(), None, lambda state: None
    )


def kerple_after_stage(corpus: CorpusData) -> torch.Tensor:
    """KERPLE's raw p and a (clamp form) after a stage from just inside the floor, the encoding's group at
    lr 1e-3 x 1000 = 1: any step that lowers a parameter takes it far below the floor."""
    model = tiny_model("kerple", "encoding.param=clamp")
    with torch.no_grad():
        model.encoding.raw_p.fill_(FLOOR + 1e-3)
        model.encoding.raw_a.fill_(FLOOR + 1e-3)
    torch.manual_seed(0)
    stage = stage_of(model, corpus, EncodingOptimizer(lr_mult=1000.0), lr=1e-3, warmup_steps=0)
    stage.fit()
    return torch.cat([model.encoding.raw_p, model.encoding.raw_a]).detach()


def test_kerple_stays_in_its_constraint_set_through_the_stage(
    corpus: CorpusData, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = kerple_after_stage(corpus)
    assert torch.isfinite(raw).all() and (raw >= FLOOR).all(), raw
    assert (raw == FLOOR).any(), raw  # a step went below the floor and the projection put it back
    monkeypatch.setattr(Kerple, "constrain", lambda self: None)
    unconstrained = kerple_after_stage(corpus)
    assert (unconstrained < FLOOR).any(), unconstrained  # without the projection the set is left


def t5_config() -> Config:
    overrides = [
        "encoding.lr_mult=3",
        "encoding.weight_decay=0.05",
        "passkey.lr=0.002",
        "passkey.weight_decay=0.1",
    ]
    return typed_config(["+experiment=tiny", "encoding=t5", *overrides])


def group_ids(optimizer: torch.optim.Optimizer) -> list[list[int]]:
    return [[id(p) for p in group["params"]] for group in optimizer.param_groups]


def test_the_stage_groups_as_training_at_its_own_base_values(corpus: CorpusData) -> None:
    cfg = t5_config()
    model, enc = build_model(cfg, VOCAB_SIZE), encoding_optimizer(cfg.encoding)
    stage = stage_of(model, corpus, enc, lr=cfg.passkey.lr, weight_decay=cfg.passkey.weight_decay)
    groups = stage.optimizer.param_groups
    train = train_optimizer(model, cfg.train, enc)
    assert group_ids(stage.optimizer) == group_ids(train)  # matrices, other parameters, the encoding's
    assert group_ids(stage.optimizer)[2] == [id(model.encoding.table)]
    assert [g["initial_lr"] for g in groups] == pytest.approx([0.002, 0.002, 0.006])
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0, 0.05]
    assert all(g["betas"] == BETAS for g in groups)
    assert [g["lr"] for g in train.param_groups] == pytest.approx(
        [cfg.train.lr, cfg.train.lr, 3 * cfg.train.lr]
    )
    assert [g["weight_decay"] for g in train.param_groups] == [cfg.train.weight_decay, 0.0, 0.05]
    model.train()
    for step in range(1, 3):  # the schedule scales every group alike: the encoding's stays at 3x
        stage.step()
        factor = stage.cfg.lr_factor(step)
        assert [g["lr"] for g in groups] == pytest.approx([0.002 * factor, 0.002 * factor, 0.006 * factor])


def test_a_stage_checkpoint_resumes_and_an_old_one_group_checkpoint_is_refused(corpus: CorpusData) -> None:
    cfg = t5_config()
    model, enc = build_model(cfg, VOCAB_SIZE), encoding_optimizer(cfg.encoding)
    stage = stage_of(model, corpus, enc)
    model.train()
    stage.step()
    state = stage.state_dict()
    again = stage_of(build_model(cfg, VOCAB_SIZE), corpus, enc)
    again.load_state_dict(state)
    assert again.optimizer.state_dict()["param_groups"] == state["optimizer"]["param_groups"]
    old = torch.optim.AdamW(model.parameters(), lr=1e-3)  # the stage's optimizer before issue 42
    fresh = build_model(cfg, VOCAB_SIZE)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(ConfigError, match=r"1 parameter group.*delete checkpoint_passkey\.pt"):
        stage_of(fresh, corpus, enc).load_state_dict({**state, "optimizer": old.state_dict()})
    assert all(torch.equal(v, before[k]) for k, v in fresh.state_dict().items())  # nothing was loaded
