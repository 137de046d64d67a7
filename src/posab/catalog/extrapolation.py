"""The extrapolation audit's report columns (`posab.evaluate.extrapolation`): the bias jump, its pull, the MLP
input novelty and the attention entropy at the longest length audited."""

from __future__ import annotations

from collections.abc import Collection

from posab.keys import key_lengths, metric_key
from posab.outputs import Column

ORDER = 25  # the evaluator's place among the others, in its runs and in a study's table


def report_columns(keys: Collection[str]) -> list[Column]:
    """The largest relative bias jump, and novelty and mean entropy at the longest length audited."""
    columns = []
    if metric_key("bias_jump") in keys:
        legend = (
            "largest step |b_h(d) − b_h(d−1)| of the additive bias past the training length, over "
            "the range b_h takes within it; the largest over heads (`audit/bias_jump`; ALiBi: "
            "1/(L_train − 1))"
        )
        columns.append(Column("bias jump", metric_key("bias_jump"), ".3g", legend))
    if (n := max(key_lengths(keys, "bias_pull"), default=None)) is not None:
        legend = (
            f"the pull of the bias past the training length at length {n}: the share of a head's "
            f"bias-only attention past it, over that of the bias held at its last trained value; the "
            f"largest over heads (`audit/bias_pull@{n}`; ~1: a local head drawn far, 0: none)"
        )
        columns.append(Column(f"pull@{n}", metric_key("bias_pull", n), ".3f", legend))
    if (n := max(key_lengths(keys, "novelty_outside"), default=None)) is not None:
        legend = (
            f"fraction of the bias MLP's input features outside their training range at length {n}, "
            f"mean over features (`audit/novelty_outside@{n}`; 0 = no unseen inputs)"
        )
        columns.append(Column(f"novelty@{n}", metric_key("novelty_outside", n), ".3f", legend))
    if (n := max(key_lengths(keys, "entropy"), default=None)) is not None:
        legend = f"attention entropy at length {n}, mean over layers and heads, nats (`audit/entropy@{n}`)"
        columns.append(Column(f"entropy@{n}", metric_key("entropy", n), ".3f", legend))
    return columns
