"""The shift evaluator's report columns (`posab.evaluate.shift`): KL at the largest offset and the loss
change of the largest unrelated prefix and real context."""

from __future__ import annotations

from collections.abc import Collection

from posab.keys import metric_key, shift_sizes
from posab.outputs import Column

ORDER = 30  # the evaluator's place among the others, in its runs and in a study's table


def report_columns(keys: Collection[str]) -> list[Column]:
    columns = []
    if (k := _largest(keys, "offset", "kl")) is not None:
        columns.append(
            Column(
                f"KL offset {k}",
                metric_key("kl", shift="offset", k=k),
                ".3g",
                f"mean KL(p_ref ‖ p_shift) of next-token distributions when every position is offset "
                f"by {k}, the largest offset evaluated (`shift/offset{k}/kl`; 0 = offset-invariant)",
            )
        )
    return columns + _prefix_columns(keys)


def _prefix_columns(keys: Collection[str]) -> list[Column]:
    """Δloss of the largest unrelated prefix and of the largest real context, each where the runs have it."""
    columns = []
    if (k := _largest(keys, "prefix", "dloss")) is not None:
        columns.append(
            Column(
                f"Δloss prefix {k}",
                metric_key("dloss", shift="prefix", k=k),
                ".3f",
                f"mean loss change on the last (training length − {k}) tokens of each window when {k} tokens "
                f"of unrelated text come before them, the input staying within the training length; mean "
                f"over the prefix texts, the largest prefix evaluated (`shift/prefix{k}/dloss`; > 0: the "
                f"unrelated text distracts)",
            )
        )
    if (k := _largest(keys, "context", "dloss")) is not None:
        columns.append(
            Column(
                f"Δloss context {k}",
                metric_key("dloss", shift="context", k=k),
                ".3f",
                f"mean loss change on the same tokens when the {k} tokens that really precede them in the "
                f"text come before them (the whole window), the largest evaluated "
                f"(`shift/context{k}/dloss`; < 0: the model uses the real context)",
            )
        )
    return columns


def _largest(keys: Collection[str], kind: str, metric: str) -> int | None:
    """The largest k of the keys `shift/{kind}k/{metric}` among `keys`, or None."""
    return max(shift_sizes(keys, kind, metric), default=None)
