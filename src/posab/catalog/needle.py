"""The needle evaluator's report columns (`posab.evaluate.needle`): passkey accuracy, key log-probability and
the retrieval gain."""

from __future__ import annotations

from collections.abc import Collection

from posab.keys import metric_key
from posab.outputs import Column

ORDER = 20  # the evaluator's place among the others, in its runs and in a study's table


def report_columns(keys: Collection[str]) -> list[Column]:
    columns = []
    if metric_key("acc") in keys:
        columns.append(
            Column(
                "needle acc",
                metric_key("acc"),
                ".2f",
                "passkey accuracy over every length and depth (`needle/acc`)",
            )
        )
    if metric_key("logprob") in keys:
        columns.append(
            Column(
                "key logprob",
                metric_key("logprob"),
                ".2f",
                "log-probability (nats) of the whole passkey given the prompt (summed over its digits), "
                "mean over every length and depth (`needle/logprob`; uniform over the 10 digits: "
                "5 ln 0.1 = -11.51 for 5-digit keys)",
            )
        )
    if metric_key("gain") in keys:
        columns.append(
            Column(
                "needle gain",
                metric_key("gain"),
                ".2f",
                "retrieval control: log p(key | the needle holds it) - log p(key | the needle holds "
                "another key), nats, mean over every length and depth (`needle/gain`; 0 = the needle is "
                "not read)",
            )
        )
    return columns
