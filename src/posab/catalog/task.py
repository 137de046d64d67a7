"""The task evaluator's report columns (`posab.evaluate.task`): exact match at and past the training
lengths."""

from __future__ import annotations

from collections.abc import Collection

from posab.keys import key_variants, metric_key
from posab.outputs import Column

ORDER = 5  # the evaluator's place among the others, in its runs and in a study's table


def report_columns(keys: Collection[str]) -> list[Column]:
    columns = []
    for name, legend in (
        ("exact_seen", "exact match at the training lengths, mean over them (`task/exact_seen`)"),
        ("exact_unseen", "exact match past the training lengths, mean over them (`task/exact_unseen`)"),
        (
            "oracle_exact_unseen",
            "exact match of the answer's tokens past the training lengths with EOS suppressed for the "
            "answer's length (the oracle-length reading), mean over them (`task/oracle_exact_unseen`)",
        ),
    ):
        key = metric_key(name)
        if key in keys:
            columns.append(Column(name.replace("_", " "), key, ".3f", legend))
    for test in key_variants(k for k in keys if k.startswith("task@")):
        key = metric_key("exact_unseen", variant=test)
        if key in keys:
            legend = f"exact match past the training lengths on the test distribution {test} (`{key}`)"
            columns.append(Column(f"exact unseen {test}", key, ".3f", legend))
    return columns
