"""Statistics over the seeds of a row: what the tables and plots show of several runs.

Mean, sample std (ddof=1), count, min and max of each metric per row, and the validation-loss curve per row
(mean, min, max at each step).

Paired differences: each row of a study against the `nope` and `alibi` rows in mean per-window loss, with
a paired bootstrap interval. Every run of a study scores the same evaluation windows, so most of the
variation between windows (some text is harder) is shared by both rows and cancels when the windows are
resampled together; the seeds of each row are resampled on their own, as runs of different rows are not
paired.

A missing value and a NaN result are the same to these statistics: neither enters the mean or the count.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from posab.report.grouping import Row
from posab.report.records import RunRecord

ROW = "row"  # the column of run_values that names each run's row
TABLE_STATISTICS = ("mean", "std", "count")  # std: pandas' sample std, ddof=1
BAND_STATISTICS = ("mean", "min", "max")
PAIRED_REFERENCES = ("nope", "alibi")  # the default rows every other row is compared with (`reference_rows`)
PAIRED_METRICS = ("loss", "loss_tail")  # compared per-window keys: `loss/L`, `loss_tail/L` (L > training)
PAIRED_KEY = re.compile(rf"({'|'.join(PAIRED_METRICS)})/(\d+)")  # "loss_tail/1024" -> metric, length
DRAWS = 2000
PAIRED_COLUMNS = (
    "study",
    "row",
    "reference",
    "length",
    "metric",
    "difference",  # arm minus reference, mean per-window loss, nats per token
    "low",  # 2.5th percentile of the bootstrap replicates
    "high",  # 97.5th percentile
    "excludes_zero",
    "seeds_row",
    "seeds_reference",
    "windows",
)


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


@dataclass
class PairedDifferences:
    """Every paired comparison of a report and, per study, the comparisons not made and why."""

    frame: pd.DataFrame  # one line per (study, row, reference, length, metric); columns PAIRED_COLUMNS
    notes: dict[str, list[str]]  # study -> comparisons not made


def paired_bootstrap(
    arm: np.ndarray, reference: np.ndarray, draws: int = DRAWS
) -> tuple[float, float, float]:
    """Arm minus reference in mean loss over seeds and windows, and its 95% percentile interval, from the
    per-window losses (seeds, W) of two rows that scored the same W windows.

    Each of `draws` replicates resamples the W windows with replacement, the same windows for both rows (the
    pairing), and each row's seeds with replacement, independently. The generator is seeded
    (`default_rng(0)`): the same losses give the same interval."""
    rng = np.random.default_rng(0)
    windows = rng.integers(0, arm.shape[1], size=(draws, arm.shape[1]))  # (draws, W) window indices
    replicates = _resampled_means(arm, windows, rng) - _resampled_means(reference, windows, rng)  # (draws,)
    low, high = np.percentile(replicates, [2.5, 97.5])
    return float(arm.mean() - reference.mean()), float(low), float(high)


def _resampled_means(losses: np.ndarray, windows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each replicate's mean of `losses` (seeds, W) over seeds drawn with replacement and its `windows`."""
    seeds = rng.integers(0, len(losses), size=(len(windows), len(losses)))  # (draws, seeds) run indices
    by_window = losses[seeds].mean(axis=1)  # (draws, seeds, W) -> (draws, W)
    return np.take_along_axis(by_window, windows, axis=1).mean(axis=1)  # (draws, W) -> (draws,)


def paired_differences(
    table: Mapping[str, Sequence[Row]],
    references: Sequence[str] = PAIRED_REFERENCES,
    draws: int = DRAWS,
) -> PairedDifferences:
    """Every row of each study whose runs have per-window losses against each reference row of the study
    (`references` that it has), at every length and PAIRED_METRICS key all their runs have.

    A reference is not compared with itself; rows of a RoPE scaling view are no arm. A pair whose runs
    lack per-window losses or scored different windows is not compared: a note says so."""
    lines: list[dict[str, Any]] = []
    notes: dict[str, list[str]] = {}
    for study, rows in table.items():
        if not any(run.windows for row in rows for run in row.runs):
            continue
        found = reference_rows(rows, references)
        for arm in (row for row in rows if not row.scaling):
            for reference in found:
                if reference is arm:
                    continue
                compared, note = _compare(arm, reference, draws)
                lines += [{"study": study, **line} for line in compared]
                if note:
                    notes.setdefault(study, []).append(note)
    return PairedDifferences(pd.DataFrame(lines, columns=list(PAIRED_COLUMNS)), notes)


def reference_rows(rows: Sequence[Row], references: Sequence[str] = PAIRED_REFERENCES) -> list[Row]:
    """The row of each of `references` that the study has: the row labelled with it, else its encoding's
    only row (a study that tunes each encoding labels it `nope, train.lr=0.003`)."""
    unscaled = [row for row in rows if not row.scaling]
    found = []
    for name in references:
        labelled = [row for row in unscaled if row.label == name]
        of_encoding = [row for row in unscaled if row.encoding == name]
        found += labelled or (of_encoding if len(of_encoding) == 1 else [])
    return found


def _compare(arm: Row, reference: Row, draws: int) -> tuple[list[dict[str, Any]], str]:
    """The lines of one pair of rows (all but the study), or none and the reason why."""
    runs = [*arm.runs, *reference.runs]
    pair = f"`{arm.label}` vs `{reference.label}`"
    lacking = [r.name for r in runs if not r.windows]
    if lacking:
        return [], f"{pair}: no per-window losses (`perplexity_windows.npz`) for {', '.join(lacking)}"
    if len({tuple(r.window_starts) for r in runs}) > 1:
        return [], f"{pair}: their runs scored different windows (`window_starts` differ), no pairing"
    keys = _common_keys(runs)
    if not keys:
        return [], f"{pair}: no `loss/L` that every run of both rows has"
    lines = []
    for metric, length in keys:
        arm_losses = _losses(arm, f"{metric}/{length}")  # (seeds, W)
        difference, low, high = paired_bootstrap(arm_losses, _losses(reference, f"{metric}/{length}"), draws)
        lines.append(
            {
                "row": arm.label,
                "reference": reference.label,
                "length": length,
                "metric": metric,
                "difference": difference,
                "low": low,
                "high": high,
                "excludes_zero": low > 0 or high < 0,
                "seeds_row": len(arm.runs),
                "seeds_reference": len(reference.runs),
                "windows": arm_losses.shape[1],
            }
        )
    return lines, ""


def _common_keys(runs: Sequence[RunRecord]) -> list[tuple[str, int]]:
    """(metric, length) of each PAIRED_METRICS key every run has, by length, then in PAIRED_METRICS order."""
    common = set.intersection(*(set(r.windows) for r in runs))
    keys = [(m[1], int(m[2])) for k in common if (m := PAIRED_KEY.fullmatch(k))]
    return sorted(keys, key=lambda key: (key[1], PAIRED_METRICS.index(key[0])))


def _losses(row: Row, key: str) -> np.ndarray:
    """The per-window losses of `key` in each run of the row: (seeds, W)."""
    return np.array([r.windows[key] for r in row.runs], dtype=np.float64)
