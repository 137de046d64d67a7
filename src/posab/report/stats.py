"""Statistics over the seeds of a row: what the tables and plots show of several runs.

Today: mean, sample std (ddof=1), count, min and max of each metric per row, and the validation-loss curve
per row (mean, min, max at each step). Paired comparisons between rows (bootstrap intervals over seeds or
windows) belong here too.

A missing value and a NaN result are the same to these statistics: neither enters the mean or the count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pandas as pd

from posab.report.grouping import Row

ROW = "row"  # the column of run_values that names each run's row
TABLE_STATISTICS = ("mean", "std", "count")  # std: pandas' sample std, ddof=1
BAND_STATISTICS = ("mean", "min", "max")


def run_values(rows: Mapping[str, Row], keys: Sequence[str]) -> pd.DataFrame:
    """One line per run of each row: the row's name (column ROW) and the run's value of each key, NaN
    where the run has none."""
    records = [
        {ROW: name, **{k: run.metrics.get(k, math.nan) for k in keys}}
        for name, row in rows.items()
        for run in row.runs
    ]
    return pd.DataFrame.from_records(records, columns=[ROW, *keys])


def aggregate(
    rows: Mapping[str, Row], keys: Sequence[str], statistics: Sequence[str] = TABLE_STATISTICS
) -> pd.DataFrame:
    """Each statistic of each key over the runs of each row: index = row names in order, columns =
    (key, statistic). `count` is the number of runs with the value."""
    unique = list(dict.fromkeys(keys))
    grouped = run_values(rows, unique).groupby(ROW, sort=False)[unique]
    return grouped.agg(list(statistics))


def curve_band(curves: Sequence[Sequence[tuple[int, float]]]) -> pd.DataFrame:
    """(step, value) curves of several runs -> mean, min and max over the runs at each step (index: step,
    sorted; a step only some runs logged is over those)."""
    by_run = pd.concat([pd.Series(dict(c), dtype="float64") for c in curves], axis=1)
    return by_run.sort_index().agg(list(BAND_STATISTICS), axis=1)
