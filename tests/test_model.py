"""The decoder LM: initial loss, learning, parameter counts."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from conftest import ENCODINGS, run_main, tiny_model
from posab.data.tokenizer import VOCAB_SIZE


@torch.no_grad()
def test_initial_loss_is_close_to_log_vocab(encoding: str) -> None:
    model = tiny_model(encoding)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB_SIZE, (4, 65), generator=g)
    zeros = torch.zeros(4, 64, dtype=torch.long)
    logits = model(tokens[:, :-1], zeros, zeros)
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    assert abs(float(loss) - math.log(VOCAB_SIZE)) < 0.1


def test_parameter_counts_add_up(encoding: str) -> None:
    model = tiny_model(encoding)
    counts = model.parameter_counts()
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    assert counts["total"] - counts["non_embedding"] == VOCAB_SIZE * model.cfg.d_model
    assert counts["encoding"] == sum(p.numel() for p in model.encoding.parameters())


def test_tiny_training_lowers_the_loss(tmp_path) -> None:
    """The real run path, a few dozen steps on the synthetic corpus: loss clearly below ln(V). In-process,
    with the JSONL logger (the W&B logger's runs: tests/test_wandb.py)."""
    overrides = ["+experiment=tiny", "encoding=alibi", "train.steps=40"]
    results = run_main([*overrides, f"data.cache_dir={tmp_path / 'cache'}"], tmp_path / "run")
    assert results["status"] == "finished"
    assert results["val_loss"] < math.log(VOCAB_SIZE) - 1.5
    metrics = [
        line for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if "val/loss" in line
    ]
    assert len(metrics) == 40 // 4


def test_every_encoding_is_tested() -> None:
    expected = {
        "nope",
        "sinusoidal",
        "learned",
        "alibi",
        "rope",
        "multiscale",
        "hierarchical",
        "t5",
        "fire",
        "kerple",
    }
    assert expected <= set(ENCODINGS)
