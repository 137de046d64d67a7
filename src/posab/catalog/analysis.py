"""The attention analysis's report columns (`posab.evaluate.attention_analysis`): none; its per-head
entropy and distance are read in its own table and figure (the extrapolation audit's entropy column gives
their mean)."""

from __future__ import annotations

from collections.abc import Collection

from posab.outputs import Column

ORDER = 40  # the evaluator's place among the others, in its runs and in a study's table


def report_columns(keys: Collection[str]) -> list[Column]:
    return []
