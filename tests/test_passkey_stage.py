"""The passkey stage: curriculum, key-only loss, `train.init_from`, evaluation order, a run end to end."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from conftest import run_main, tiny_model, typed_config
from posab.data import CorpusData
from posab.errors import ConfigError
from posab.passkey.examples import passkey_batch
from posab.passkey.stage import PasskeyStageConfig, key_accuracy, key_loss
from posab.report import main as report_main
from posab.run.reevaluation import reevaluate
from posab.studies import needle as needle_report
from posab.training.loop import warmup_cosine
from posab.training.losses import token_losses
from posab.training.trainer import TrainConfig, lr_multiplier

STAGE = ["passkey.enabled=true", "passkey.lengths=[96,128]", "passkey.steps=[3,2]", "passkey.log_every=1",
         "passkey.probe_every=2", "passkey.probe_examples=4"]  # fmt: skip


def run(tmp_path: Path, name: str, *more: str) -> dict[str, Any]:
    """A tiny alibi run in-process, into tmp_path/name (a bad input raises its ConfigError)."""
    args = ["+experiment=tiny", "encoding=alibi", f"data.cache_dir={tmp_path / 'cache'}", *more]
    return run_main(args, tmp_path / name)


def test_the_curriculum_schedule() -> None:
    cfg = PasskeyStageConfig(lengths=[96, 192, 384, 512], steps=[400, 200, 150, 150], batch_tokens=3072)
    assert cfg.total_steps == 900
    assert [cfg.length_at(s) for s in (0, 399, 400, 599, 600, 749, 750, 899)] == [
        96,
        96,
        192,
        192,
        384,
        384,
        512,
        512,
    ]
    assert [cfg.batch_size(n) for n in cfg.lengths] == [32, 16, 8, 6]
    with pytest.raises(ValueError, match="past the curriculum"):
        cfg.length_at(900)


def test_the_stage_and_the_language_model_share_one_schedule() -> None:
    """`lr_factor` is `warmup_cosine`, the language model's: the same rates for the same settings (the
    stage's cosine reached min_lr_ratio at its last step before issue 29; now one step later, as
    training's)."""
    constant = PasskeyStageConfig(steps=[60, 20, 10, 10], warmup_steps=10, schedule="constant")
    assert [constant.lr_factor(s) for s in (0, 4, 9, 10, 99)] == [0.1, 0.5, 1.0, 1.0, 1.0]
    cosine = PasskeyStageConfig(steps=[60, 20, 10, 10], warmup_steps=10, schedule="cosine", min_lr_ratio=0.1)
    factors = [cosine.lr_factor(s) for s in range(100)]
    assert factors[:10] == [constant.lr_factor(s) for s in range(10)]
    language_model = TrainConfig(steps=100, warmup_steps=10, min_lr_ratio=0.1)
    assert factors == [lr_multiplier(s, language_model) for s in range(100)]
    assert factors[10] == 1.0 and warmup_cosine(100, 10, 100, 0.1) == pytest.approx(0.1)  # min after the last
    assert factors[99] == pytest.approx(0.1 + 0.45 * (1 - math.cos(math.pi / 90)))
    assert factors[55] == pytest.approx(0.55)  # halfway through the decay
    assert all(a >= b for a, b in zip(factors[10:], factors[11:], strict=False))  # never rises


def test_key_accuracy_is_greedy_retrieval_of_the_whole_key(corpus: CorpusData) -> None:
    model = tiny_model("alibi").eval()
    batch = passkey_batch(corpus.streams["train"], corpus.tokenizer, 4, 96, np.random.default_rng(0), 5)
    assert batch.key_mask is not None
    with torch.no_grad():
        predicted = model(batch.inputs, batch.sentence, batch.paragraph).argmax(dim=-1)  # (B, T)
    targets = torch.where(batch.key_mask, predicted, batch.targets)  # keys the model predicts exactly
    exact = type(batch)(batch.inputs, targets, batch.sentence, batch.paragraph, batch.key_mask)
    assert key_accuracy(model, exact) == 1.0
    one_wrong = targets.clone()
    last_key_position = int(batch.key_mask[1].nonzero()[-1])
    one_wrong[1, last_key_position] = (one_wrong[1, last_key_position] + 1) % model.vocab_size
    wrong = type(batch)(batch.inputs, one_wrong, batch.sentence, batch.paragraph, batch.key_mask)
    assert key_accuracy(model, wrong) == 0.75  # one digit of one example's key
    other = targets.clone()
    other[~batch.key_mask] = (other[~batch.key_mask] + 1) % model.vocab_size  # every non-key target
    assert (
        key_accuracy(model, type(batch)(batch.inputs, other, batch.sentence, batch.paragraph, batch.key_mask))
        == 1.0
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["passkey.lengths=[64,256]", "passkey.steps=[1,1]"],
            r"passkey.lengths=\[64, 256\]: every length must be in 1..train.seq_len=128",
        ),
        (["passkey.lengths=[64]", "passkey.steps=[1,1]"], "must be non-empty lists of one length"),
        (["passkey.steps=[0,1]", "passkey.lengths=[64,128]"], "every count must be positive"),
        (
            ["passkey.lr=0", "passkey.lengths=[64,128]", "passkey.steps=[1,1]"],
            "passkey.lr=0.0 must be positive",
        ),
        (
            ["passkey.schedule=linear", "passkey.lengths=[64,128]", "passkey.steps=[1,1]"],
            r"passkey.schedule='linear' is not one of \['constant', 'cosine'\]",
        ),
    ],
)
def test_no_curriculum_length_exceeds_the_training_length(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        typed_config(["+experiment=tiny", "passkey.enabled=true", *overrides])
    typed_config(["+experiment=tiny", "passkey.lengths=[64,256]", "passkey.steps=[1,1]"])  # off: not checked


def test_only_key_positions_carry_gradient(corpus: CorpusData) -> None:
    model = tiny_model("alibi").train()
    batch = passkey_batch(corpus.streams["train"], corpus.tokenizer, 2, 96, np.random.default_rng(0), 5)
    assert batch.key_mask is not None
    loss = key_loss(model, batch)
    expected = token_losses(model, batch)[:, -5:].mean()  # the key is the last 5 targets
    assert float(loss.detach()) == pytest.approx(float(expected.detach()), rel=1e-6)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    changed = batch.targets.clone()
    changed[~batch.key_mask] = (changed[~batch.key_mask] + 1) % model.vocab_size  # every other target
    other = type(batch)(batch.inputs, changed, batch.sentence, batch.paragraph, batch.key_mask)
    other_grads = torch.autograd.grad(key_loss(model, other), list(model.parameters()))
    for a, b in zip(grads, other_grads, strict=True):
        assert torch.equal(a, b)  # the non-key targets take no part in the loss or its gradient


def header(summary: Path) -> list[str]:
    """The column names of needle.md's first table."""
    line = next(line for line in (summary / "needle.md").read_text().splitlines() if line.startswith("| row"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_a_run_with_the_stage(tmp_path: Path) -> None:
    """Perplexity and shift measure the language model (the same numbers as without the stage), the needle
    the stage's model; the stage logs its key loss after the language model's steps and checkpoints."""
    assert run(tmp_path, "plain")["status"] == run(tmp_path, "staged", *STAGE)["status"] == "finished"
    a = json.loads((tmp_path / "plain" / "results.json").read_text())
    b = json.loads((tmp_path / "staged" / "results.json").read_text())
    assert b["eval"]["ppl/128"] == a["eval"]["ppl/128"]
    assert b["eval"]["shift/prefix16/dloss"] == a["eval"]["shift/prefix16/dloss"]
    assert b["eval"]["needle/logprob"] != a["eval"]["needle/logprob"]  # five steps on keys changed the model
    assert b["eval_source"]["perplexity"] == "language model, step 8"
    assert b["eval_source"]["needle"] == "passkey stage, step 13"
    assert b["passkey_stage"]["steps"] == 5 and b["passkey_stage"]["curriculum"]["lengths"] == [96, 128]
    lines = [json.loads(line) for line in (tmp_path / "staged" / "metrics.jsonl").read_text().splitlines()]
    stage = [(line["step"], line["passkey/length"]) for line in lines if "passkey/length" in line]
    assert stage == [(9, 96), (10, 96), (11, 96), (12, 128), (13, 128)]
    assert all(0 < line["train/needle_loss"] < 30 for line in lines if "passkey/length" in line)
    probes = [(line["step"], line["passkey/acc"]) for line in lines if "passkey/acc" in line]
    assert [step for step, _ in probes] == [10, 12, 13] and all(0 <= acc <= 1 for _, acc in probes)
    assert b["passkey_stage"]["probes"] == [[step - 8, acc] for step, acc in probes]
    summary = tmp_path / "summary"
    assert needle_report.main([str(tmp_path / "staged"), "--out", str(summary)]) == 0
    row = next(
        line for line in (summary / "needle.md").read_text().splitlines() if line.startswith("| alibi")
    )
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1:4] == ["1", *(f"{b['eval'][f'needle/acc@{n}']:.2f}" for n in (128, 256))]  # one seed
    assert cells[-2:] == [f"{b['eval'][f'ppl/{n}']:.2f}" for n in (128, 256)]  # the LM's, before the stage
    assert cells[header(summary).index("stage key loss")] == f"{b['passkey_stage']['needle_loss']:.3f}"
    assert (summary / "stage_curves.png").stat().st_size > 0
    # the same summary from the run's report folder (runs.csv keeps the stage's scalars and curves)
    assert report_main([str(tmp_path / "staged"), "--out", str(tmp_path / "report")]) == 0
    assert needle_report.main([str(tmp_path / "report"), "--out", str(tmp_path / "again_summary")]) == 0
    assert (tmp_path / "again_summary/needle.md").read_text() == (summary / "needle.md").read_text()
    with pytest.raises(SystemExit, match="2"):
        needle_report.main([str(tmp_path / "plain"), "--out", str(summary)])  # no stage: named, exit 2
    assert (tmp_path / "staged" / "checkpoint_passkey.pt").stat().st_size > 0
    # re-evaluation (posab evaluate's) scores each evaluator on the model it measured: the LM, and the
    # stage's for the needle
    reevaluate(tmp_path / "staged", [], tmp_path / "again")
    reevaluated = json.loads((tmp_path / "again" / "results.json").read_text())["eval"]
    for key in ("ppl/128", "needle/logprob", "needle/acc", "shift/prefix16/dloss"):
        assert reevaluated[key] == pytest.approx(b["eval"][key], rel=1e-6, abs=1e-9)


def test_init_from_takes_a_trained_runs_model(tmp_path: Path) -> None:
    a = run(tmp_path, "first")
    b = run(tmp_path, "again", f"train.init_from={tmp_path / 'first'}", "train.steps=0")
    assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-6) and b["eval"]["ppl/128"] == pytest.approx(
        a["eval"]["ppl/128"], rel=1e-6
    )
    with pytest.raises(ConfigError, match="incompatible config"):
        run(tmp_path, "bad", f"train.init_from={tmp_path / 'first'}", "encoding=rope")
    with pytest.raises(ConfigError, match="0 only with train.init_from"):
        run(tmp_path, "zero", "train.steps=0")
    with pytest.raises(
        ConfigError, match=re.escape("passkey.lengths=[32, 128]: a passkey example of 33 tokens")
    ):
        run(tmp_path, "short", *STAGE, "passkey.lengths=[32,128]")
    assert not (tmp_path / "short" / "checkpoint.pt").exists()  # before any training


def test_the_needle_preset_trains_a_base_then_the_stage() -> None:
    cfg = typed_config(["+experiment=needle", "encoding=alibi"])
    assert cfg.passkey.enabled and cfg.data.needle_rate == 0.5 and cfg.train.steps >= 600
    assert max(cfg.passkey.lengths) == cfg.train.seq_len  # ends at the training length, never past it
    assert cfg.eval.lengths == [512, 1024, 2048, 4096] and cfg.eval.needle.enabled
