"""Building a run's model from its config (used by the run, the benchmark and the tests)."""

from __future__ import annotations

from posab.config import Config
from posab.encodings import Dims, build_encoding
from posab.encodings.base import READS_POSITIONS, reads_given_positions
from posab.errors import require
from posab.evaluate import enabled_evaluators
from posab.model import DecoderLM


def max_positions(cfg: Config) -> int:
    """One more than the largest token position any part of the run will use: training, `eval.lengths`,
    what each enabled evaluator declares (`Evaluator.positions`) and a task's longest test example."""
    train_len = cfg.train.seq_len
    declared = [e.positions(cfg.eval, train_len) for e in enabled_evaluators(cfg.eval)]
    if cfg.data.source == "task":  # a task's test examples, decoded to their EOS; its coupled positions
        task = cfg.data.task
        declared.append(task.test_positions)
        declared += [task.max_position + 1] if task.positions == "coupled" and task.max_position else []
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
    """The run's model; a ConfigError where the run's task gives positions its encoding cannot read."""
    encoding = build_encoding(cfg.encoding, model_dims(cfg))
    if cfg.data.source == "task" and cfg.data.task.positions == "coupled":
        require(
            reads_given_positions(encoding),
            f"data.task.positions=coupled with encoding={encoding_name(cfg)} (a {encoding.kind} encoding, "
            f"acting {encoding.kind.acts}): coupled positions reach an encoding that reads each token's own "
            f"position (kinds {', '.join(READS_POSITIONS)}: sinusoidal, learned, rope, xpos); use one of "
            "those, or data.task.positions=sequential",
        )
    return DecoderLM(cfg.model, vocab_size, encoding)


def encoding_name(cfg: Config) -> str:
    return str(cfg.encoding.get("name") or cfg.encoding["_target_"].rsplit(".", 1)[-1].lower())
