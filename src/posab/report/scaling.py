"""RoPE runs evaluated with evaluation-time scalings (`ppl@pi/4096`), seen as if unscaled, one view each.

A view shows exactly what was measured under its scaling, and blank cells for the rest: never another
view's numbers. Keys: `posab.keys`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from posab.keys import PPL, format_key, key_variants, parse_key
from posab.report.records import RUN_METRICS, SEQ_LEN_KEY, RunRecord

UNSCALED = "none"  # the view of the run's own, unscaled numbers
MODEL_PREFIXES = ("params/",)  # keys that describe the trained model, not an evaluation (and RUN_METRICS)


def scaled_view(run: RunRecord, kind: str) -> RunRecord:
    """The run seen through evaluation-time RoPE scaling `kind`, in its metrics, series and per-window
    losses; `UNSCALED`: the run's own numbers, every scaled key left out.

    Under a scaling: every key measured under it is read without it (`ppl@kind/L` as `ppl/L`,
    `loss_tail@kind/L` as `loss_tail/L`, and so for any metric the evaluators measured under the scaling);
    perplexity-family keys at lengths L <= the training length T (`train.seq_len`) are kept, since there
    every scaling is the plain model by construction (the evaluator scales nothing up to T; a run without
    `train.seq_len` keeps none); what describes the trained model rather than an evaluation is kept
    (`params/*`, RUN_METRICS). Every other key is left out, so the report shows a blank cell and draws
    nothing where the scaling was not measured (capped perplexity, needle, shift, timings, the passkey
    stage's scalars), never the unscaled run's number."""
    train_len = int(run.config[SEQ_LEN_KEY]) if SEQ_LEN_KEY in run.config else None

    def viewed(values: dict[str, Any]) -> dict[str, Any]:
        names = {text: _view_name(text, kind, train_len) for text in values}
        return {name: values[text] for text, name in names.items() if name is not None}

    return replace(run, metrics=viewed(run.metrics), series=viewed(run.series), windows=viewed(run.windows))


def _view_name(text: str, kind: str, train_len: int | None) -> str | None:
    """The name of the key `text` in the view of scaling `kind` (see `scaled_view`), or None when the view
    leaves it out."""
    key = parse_key(text)
    if kind == UNSCALED:
        return text if key is None or key.variant is None else None
    if key is None:
        return text if text in RUN_METRICS or text.startswith(MODEL_PREFIXES) else None
    if key.variant == kind:
        return format_key(replace(key, variant=None))
    within = train_len is not None and key.length is not None and key.length <= train_len
    return text if key.variant is None and key.family == PPL and within else None


def scaling_kinds(run: RunRecord) -> list[str]:
    """The RoPE scalings a run was evaluated with (`ppl@pi/4096` -> pi), in order of appearance."""
    return key_variants([*run.metrics, *run.series, *run.windows])
