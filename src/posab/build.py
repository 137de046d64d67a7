"""Building a run's model from its config (used by the run, the benchmark and the tests)."""

from __future__ import annotations

from typing import Any

from posab.config import Config
from posab.encodings import Dims, build_encoding
from posab.evaluate import enabled_evaluators
from posab.model import DecoderLM
from posab.paths import encoding_options


def max_positions(cfg: Config) -> int:
    """One more than the largest token position any part of the run will use: training, `eval.lengths` and
    what each enabled evaluator declares (`Evaluator.positions`)."""
    train_len = cfg.train.seq_len
    declared = [e.positions(cfg.eval, train_len) for e in enabled_evaluators(cfg.eval)]
    return max([train_len + 1, *(n + 1 for n in cfg.eval.lengths), *declared])


def with_earlier_options(spec: dict[str, Any]) -> dict[str, Any]:
    """An encoding node with every option it lacks that changed its default (`_before_` in
    `conf/encoding/<name>.yaml`) set as runs made before that option had it: re-evaluating an old run's
    checkpoint builds the model it trained. A node composed now has every option: returned unchanged."""
    name = spec.get("name")
    before = encoding_options(name).get("_before_") if isinstance(name, str) else None
    return {**(before or {}), **spec}


def build_model(cfg: Config, vocab_size: int) -> DecoderLM:
    """The run's model; its encoding sees the run's seed (`Dims.seed`)."""
    dims = Dims(
        cfg.model.d_model,
        cfg.model.n_heads,
        cfg.train.seq_len,
        max_positions(cfg),
        seed=cfg.seed,
        n_layers=cfg.model.n_layers,
    )
    return DecoderLM(cfg.model, vocab_size, build_encoding(with_earlier_options(cfg.encoding), dims))


def encoding_name(cfg: Config) -> str:
    return str(cfg.encoding.get("name") or cfg.encoding["_target_"].rsplit(".", 1)[-1].lower())
