"""Building a run's model from its config (used by the run, the benchmark and the tests)."""

from __future__ import annotations

from posab.config import Config
from posab.encodings import Dims, build_encoding
from posab.evaluate import enabled_evaluators
from posab.model import DecoderLM


def max_positions(cfg: Config) -> int:
    """One more than the largest token position any part of the run will use: training, `eval.lengths`,
    what each enabled evaluator declares (`Evaluator.positions`) and a task's longest test example."""
    train_len = cfg.train.seq_len
    declared = [e.positions(cfg.eval, train_len) for e in enabled_evaluators(cfg.eval)]
    if cfg.data.source == "task":  # a task's test examples, decoded to their EOS
        declared.append(cfg.data.task.test_positions)
    return max([train_len + 1, *(n + 1 for n in cfg.eval.lengths), *declared])


def model_dims(cfg: Config) -> Dims:
    """The dimensions the run's encoding is built with; it sees the run's seed (`Dims.seed`)."""
    return Dims(
        cfg.model.d_model,
        cfg.model.n_heads,
        cfg.train.seq_len,
        max_positions(cfg),
        seed=cfg.seed,
        n_layers=cfg.model.n_layers,
        window=cfg.model.window,
    )


def build_model(cfg: Config, vocab_size: int) -> DecoderLM:
    """The run's model."""
    return DecoderLM(cfg.model, vocab_size, build_encoding(cfg.encoding, model_dims(cfg)))


def encoding_name(cfg: Config) -> str:
    return str(cfg.encoding.get("name") or cfg.encoding["_target_"].rsplit(".", 1)[-1].lower())
