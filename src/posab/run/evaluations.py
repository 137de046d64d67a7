"""A run's evaluations: the split they score, the context they receive, the passkey stage between the
language model's and retrieval's evaluations, and the evaluators' tables, figures and arrays as files."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import numpy as np
import torch

from posab.build import encoding_name
from posab.config import Config, config_container
from posab.data import CorpusData, TokenStream, eval_corpus_stream
from posab.encodings import encoding_optimizer
from posab.errors import ConfigError
from posab.evaluate import EvalContext, enabled_evaluators, run_evaluations
from posab.io import atomic_write, write_text
from posab.logging import Logger
from posab.model import DecoderLM
from posab.outputs import EvalOutput, Table
from posab.passkey.examples import filler_length
from posab.passkey.stage import PasskeyStage
from posab.plots import save_figure
from posab.run.directory import CHECKPOINTS, load_checkpoint, save_checkpoint


def eval_split(cfg: Config, data: CorpusData) -> TokenStream:
    """The split the evaluators score (`eval.split`)."""
    if cfg.eval.split not in data.streams:
        raise ConfigError(
            f"eval.split={cfg.eval.split!r}: the corpus has no such split; it has {', '.join(data.streams)}"
        )
    return data.streams[cfg.eval.split]


def corpus_streams(cfg: Config, data: CorpusData) -> dict[str, TokenStream]:
    """`eval.corpora`, each encoded with the run's tokenizer, by name; each checked like `eval.split`, so
    that a missing file or a corpus too short fails before training."""
    streams = {}
    for i, corpus in enumerate(cfg.eval.corpora):
        where = f"eval.corpora[{i}]"
        stream = eval_corpus_stream(
            corpus.path, corpus.format, data.tokenizer, where, corpus.windows_per_document
        )
        check_eval_lengths(cfg, stream, per_corpus=True)
        if corpus.windows_per_document is not None:
            stream.document_windows(
                max(cfg.eval.lengths), corpus.windows_per_document
            )  # fails before training
        streams[corpus.name] = stream
    return streams


def check_eval_lengths(cfg: Config, valid: TokenStream, per_corpus: bool = False) -> None:
    """Fail before training when the evaluated split cannot supply an evaluation length (`eval.lengths`
    and the window lengths of every enabled evaluator)."""
    lengths = set(cfg.eval.lengths)
    for evaluator in enabled_evaluators(cfg.eval):
        if evaluator.per_corpus or not per_corpus:
            lengths |= set(evaluator.window_lengths(cfg.eval))
    too_long = sorted(n for n in lengths if valid.windows_available(n) == 0)
    if too_long:
        raise ConfigError(
            f"eval length(s) {too_long} longer than the {valid.split} split can supply: it has {len(valid)} "
            f"tokens, a window of L tokens needs L+1; use eval.lengths up to {len(valid) - 1} or more data"
        )


def check_stage_lengths(cfg: Config, data: CorpusData) -> None:
    """Fail before training when the passkey stage's shortest length cannot hold an example."""
    shortest = min(cfg.passkey.lengths)
    try:
        filler_length(data.tokenizer, shortest + 1, cfg.eval.needle.key_digits)
    except ConfigError as err:
        raise ConfigError(f"passkey.lengths={cfg.passkey.lengths}: {err}") from None


def eval_context(
    cfg: Config,
    model: DecoderLM,
    data: CorpusData,
    device: torch.device,
    dtype: torch.dtype | None,
    corpora: dict[str, TokenStream] | None = None,
) -> EvalContext:
    """What the evaluators receive; `corpora`: `eval.corpora`'s streams (built here when not given)."""
    valid = eval_split(cfg, data)
    return EvalContext(
        model,
        data.tokenizer,
        valid,
        device,
        dtype,
        cfg.train.seq_len,
        cfg.eval,
        title=encoding_name(cfg),
        corpora=corpus_streams(cfg, data) if corpora is None else corpora,
    )


def evaluate_around_stage(
    cfg: Config, ctx: EvalContext, data: CorpusData, run_dir: Path, logger: Logger, lm_steps: int
) -> dict[str, Any]:
    """Evaluate the language model, run the passkey stage, then evaluate retrieval on the stage's model;
    `eval_source` says which model each evaluator measured."""
    before = evaluate(ctx, run_dir, logger, step=lm_steps, after_stage=False)
    stage = PasskeyStage(
        ctx.model,
        data.streams["train"],
        data.tokenizer,
        cfg.passkey,
        encoding_optimizer(cfg.encoding),
        cfg.eval.needle.key_digits,
        cfg.seed,
        logger,
        ctx.dtype,
        lambda state: save_checkpoint(
            run_dir / CHECKPOINTS["passkey"], {**state, "config": config_container(cfg)}
        ),
        first_step=lm_steps,
    )
    path = run_dir / CHECKPOINTS["passkey"]
    if cfg.train.resume == "auto" and path.is_file():
        stage.load_state_dict(load_checkpoint(path))
    stage_summary = stage.fit()
    total = lm_steps + cfg.passkey.total_steps
    after = evaluate(ctx, run_dir, logger, step=total, after_stage=True)
    sources = {e.name: e.after_stage for e in enabled_evaluators(cfg.eval)}
    return {
        "eval": {**before, **after},
        "passkey_stage": stage_summary,
        "eval_source": {
            name: f"passkey stage, step {total}" if late else f"language model, step {lm_steps}"
            for name, late in sources.items()
        },
    }


def evaluate(
    ctx: EvalContext, run_dir: Path, logger: Logger, step: int, after_stage: bool | None = None
) -> dict[str, Any]:
    """Run the evaluators (those with the given `after_stage`, or all), write their tables and figures into
    `run_dir` and log their output; returns the scalars and data (results.json's `eval`)."""
    output = run_evaluations(ctx, after_stage)
    write_output_files(output, run_dir)
    logger.log_evaluation(output, step)
    return output.results


def write_output_files(output: EvalOutput, folder: Path) -> list[Path]:
    """Each table as `<name>.csv`, each figure as `<name>.png` and each set of arrays as `<name>.npz` in
    `folder`."""
    written = [write_text(folder / f"{name}.csv", table_csv(table)) for name, table in output.tables.items()]
    written += [save_figure(figure, folder / f"{name}.png") for name, figure in output.figures.items()]
    written += [write_arrays(folder / f"{name}.npz", arrays) for name, arrays in output.arrays.items()]
    return written


def write_arrays(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    """Compressed `.npz`, keys as given (`np.load(path)[key]`)."""

    def save(tmp: Path) -> None:
        with tmp.open("wb") as f:
            np.savez_compressed(f, **arrays)

    return atomic_write(path, save)


def table_csv(table: Table) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(table.columns)
    writer.writerows(table.rows)
    return buffer.getvalue()
