"""Statistics over the seeds of a row: what the tables and plots show of several runs.

Mean, sample std (ddof=1), count, min and max of each metric per row, and the validation-loss curve per row
(mean, min, max at each step).

Paired differences: each row of a study against the `nope` and `alibi` rows in mean per-window loss, at
the level where independence holds (`resampling`). Every run of a study scores the same evaluation windows,
so most of the variation between windows (some text is harder) is shared by both rows and cancels when the
windows are resampled together. The windows are not independent: they come from a few documents (the test
split of pg-books is two books) whose effects differ, so the interval resamples the documents, then the
windows within them, and each row's seeds on their own (runs of different rows are not paired). Beside it,
an exact permutation test on the per-seed means, Holm-adjusted over each family of comparisons (`FAMILY`),
and a verdict from both (`verdict`).

A missing value and a NaN result are the same to these statistics: neither enters the mean or the count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from posab.keys import key_lengths, metric_key
from posab.report.claims import CLAIMS_FAMILY, Claim, claim_mask
from posab.report.grouping import Row
from posab.report.records import RunRecord
from posab.report.resampling import bootstrap_interval, holm, permutation_p

ROW = "row"  # the column of run_values that names each run's row
TABLE_STATISTICS = ("mean", "std", "count")  # std: pandas' sample std, ddof=1
BAND_STATISTICS = ("mean", "min", "max")
PAIRED_REFERENCES = ("nope", "alibi")  # the default rows every other row is compared with (`reference_rows`)
PAIRED_METRICS = ("loss", "loss_tail")  # compared per-window keys: `loss/L`, `loss_tail/L` (L > training)
ALPHA = 0.05  # the level of the seed-level test, Holm-adjusted
# one Holm family (the `family` column within a study): the rows compared with one reference in one metric
# at one length on one corpus, except the comparisons a claims file names, which form their own (`claims`)
FAMILY = ("study", "family")
ORDERED, SUGGESTIVE, INDISTINGUISHABLE = "ordered", "suggestive", "indistinguishable"
PAIRED_COLUMNS = (
    "study",
    "corpus",  # the evaluation corpus (`eval.corpora`) whose windows were compared; "": `eval.split`
    "row",
    "reference",
    "length",
    "metric",
    "difference",  # arm minus reference, mean per-window loss, nats per token
    "low",  # 2.5th percentile of the bootstrap replicates
    "high",  # 97.5th percentile
    "excludes_zero",
    "unstable",  # 0 lies within an end ± its Monte Carlo error: `excludes_zero` could flip with more draws
    "seeds_row",
    "seeds_reference",
    "windows",
    "documents",  # the documents resampled; empty: runs without window documents, windows resampled alone
    "draws",  # bootstrap replicates drawn (until both ends' Monte Carlo error < MC_BOUND, or MAX_DRAWS)
    "mc_error_low",  # Monte Carlo error of `low`, nats
    "mc_error_high",
    "p_seeds",  # exact two-sided permutation test on the per-seed means
    "family",  # its Holm family: CLAIMS_FAMILY, or `REFERENCE | METRIC/LENGTH` (` | CORPUS`)
    "p_holm",  # p_seeds Holm-adjusted within its FAMILY
    "verdict",  # ORDERED, SUGGESTIVE or INDISTINGUISHABLE (`verdict`)
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
    """Every paired comparison of a report and, per study, the comparisons not made and why, and those whose
    intervals resample the windows alone."""

    frame: pd.DataFrame  # one line per (study, row, reference, length, metric); columns PAIRED_COLUMNS
    notes: dict[str, list[str]]  # study -> comparisons not made
    windows_only: dict[str, list[str]] = field(default_factory=dict)  # study -> pairs without documents


def paired_differences(
    table: Mapping[str, Sequence[Row]],
    references: Sequence[str] = PAIRED_REFERENCES,
    claims: Sequence[Claim] = (),
) -> PairedDifferences:
    """Every row of each study whose runs have per-window losses against each reference row of the study
    (`references` that it has), at every length and PAIRED_METRICS key all their runs have, on `eval.split`
    and on each evaluation corpus both rows have runs on, with the Holm-adjusted p-values and verdicts
    (`with_verdicts`; `claims` form a family of their own).

    A reference is not compared with itself; rows of a RoPE scaling view are no arm. A pair whose runs
    lack per-window losses or scored different windows is not compared: a note says so. On an evaluation
    corpus, each row's runs that scored it are compared (earlier seeds may not have)."""
    lines: list[dict[str, Any]] = []
    paired = PairedDifferences(pd.DataFrame(), {}, {})
    for study, rows in table.items():
        if not any(run.windows for row in rows for run in row.runs):
            continue
        found = reference_rows(rows, references)
        for arm in (row for row in rows if not row.scaling):
            for reference, corpus in _pairs(arm, found):
                compared, note, documents = _compare(arm, reference, corpus)
                lines += [{"study": study, **line} for line in compared]
                pair = f"`{arm.label}` vs `{reference.label}`" + (f" on {corpus}" if corpus else "")
                if note:
                    paired.notes.setdefault(study, []).append(f"{pair}: {note}")
                elif documents is None:
                    paired.windows_only.setdefault(study, []).append(pair)
    paired.frame = with_verdicts(pd.DataFrame(lines, columns=list(PAIRED_COLUMNS)), claims)
    return paired


def _pairs(arm: Row, references: Sequence[Row]) -> list[tuple[Row, str]]:
    """(reference, corpus) of each comparison of `arm`: every reference but itself, on `eval.split` ("") and
    on each evaluation corpus that runs of both rows scored."""

    def corpora(row: Row) -> set[str]:
        return {c for r in row.runs for c in r.corpus_windows}

    return [
        (reference, corpus)
        for reference in references
        if reference is not arm
        for corpus in ["", *sorted(corpora(arm) & corpora(reference))]
    ]


def with_verdicts(frame: pd.DataFrame, claims: Sequence[Claim] = ()) -> pd.DataFrame:
    """The comparisons with their `family`, `p_holm` (Holm 1979, within each FAMILY) and `verdict`;
    `documents` as integers (empty where none)."""
    frame = frame.copy()
    frame["documents"] = frame["documents"].astype("Int64")
    exploratory = [
        f"{line.reference} | {line.metric}/{line.length}" + (f" | {line.corpus}" if line.corpus else "")
        for line in frame.itertuples()
    ]
    claimed = claim_mask(frame, claims) if claims else pd.Series(False, index=frame.index)
    frame["family"] = [CLAIMS_FAMILY if hit else name for hit, name in zip(claimed, exploratory, strict=True)]
    for _, index in frame.groupby(list(FAMILY), sort=False).groups.items():
        frame.loc[index, "p_holm"] = holm(frame.loc[index, "p_seeds"].tolist())
    frame["p_holm"] = frame["p_holm"].astype("float64")
    frame["verdict"] = [
        verdict(bool(line.excludes_zero and not line.unstable), float(line.p_holm))
        for line in frame.itertuples()
    ]
    return frame


def verdict(interval_excludes_zero: bool, p_holm: float) -> str:
    """ORDERED when the interval excludes 0 (stably: beyond its ends' Monte Carlo error) and the
    Holm-adjusted seed-level p < ALPHA; SUGGESTIVE when one of the two holds; else INDISTINGUISHABLE."""
    holds = int(interval_excludes_zero) + int(p_holm < ALPHA)
    return (INDISTINGUISHABLE, SUGGESTIVE, ORDERED)[holds]


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


@dataclass(frozen=True)
class _Side:
    """One row of a comparison: its label and the runs compared (those that scored the corpus)."""

    label: str
    runs: list[RunRecord]


def _places(run: RunRecord, corpus: str) -> tuple[list[int], list[int]]:
    """The starts and documents of a run's windows on `corpus` ("": `eval.split`)."""
    if not corpus:
        return run.window_starts, run.window_documents
    return run.corpus_windows[corpus].starts, run.corpus_windows[corpus].documents


def _compare(
    arm: Row, reference: Row, corpus: str = ""
) -> tuple[list[dict[str, Any]], str, np.ndarray | None]:
    """The lines of one pair of rows on `corpus` (all but the study, family, p_holm and verdict) and the
    documents their windows were resampled within (None: windows alone), or no lines and the reason why."""
    sides = [
        _Side(row.label, [r for r in row.runs if not corpus or corpus in r.corpus_windows])
        for row in (arm, reference)
    ]
    runs = [*sides[0].runs, *sides[1].runs]
    lacking = [r.name for r in runs if not r.windows]
    if lacking:
        return [], f"no per-window losses (`perplexity_windows.npz`) for {', '.join(lacking)}", None
    places = [_places(r, corpus) for r in runs]
    if len({tuple(starts) for starts, _ in places}) > 1:
        return [], "their runs scored different windows (`window_starts` differ), no pairing", None
    if len({tuple(documents) for _, documents in places if documents}) > 1:
        return [], "their runs place the windows in different documents (`window_documents`)", None
    keys = _common_keys(runs, corpus)
    if not keys:
        return [], "no `loss/L` that every run of both rows has", None
    documents = np.array(places[0][1]) if all(d for _, d in places) else None
    lines = [_line(*sides, metric, length, corpus, documents) for metric, length in keys]
    return lines, "", documents


def _line(
    arm: _Side, reference: _Side, metric: str, length: int, corpus: str, documents: np.ndarray | None
) -> dict[str, Any]:
    """One comparison: the hierarchical bootstrap interval and the seed-level permutation test."""
    key = metric_key(metric, length, corpus=corpus or None)
    arm_losses = _losses(arm, key)  # (seeds, W)
    reference_losses = _losses(reference, key)  # (seeds, W)
    interval = bootstrap_interval(arm_losses, reference_losses, documents)
    return {
        "corpus": corpus,
        "row": arm.label,
        "reference": reference.label,
        "length": length,
        "metric": metric,
        "difference": interval.difference,
        "low": interval.low,
        "high": interval.high,
        "excludes_zero": interval.excludes_zero,
        "unstable": interval.unstable,
        "seeds_row": len(arm.runs),
        "seeds_reference": len(reference.runs),
        "windows": arm_losses.shape[1],
        "documents": None if documents is None else len(np.unique(documents)),
        "draws": interval.draws,
        "mc_error_low": interval.mc_error_low,
        "mc_error_high": interval.mc_error_high,
        "p_seeds": permutation_p(arm_losses.mean(axis=1), reference_losses.mean(axis=1)),  # (seeds,) each
    }


def _common_keys(runs: Sequence[RunRecord], corpus: str) -> list[tuple[str, int]]:
    """(metric, length) of each PAIRED_METRICS key on `corpus` every run has, by length, then in
    PAIRED_METRICS order."""
    common = set.intersection(*(set(r.windows) for r in runs))
    keys = [(m, n) for m in PAIRED_METRICS for n in key_lengths(common, m, corpus=corpus or None)]
    return sorted(keys, key=lambda key: (key[1], PAIRED_METRICS.index(key[0])))


def _losses(row: _Side, key: str) -> np.ndarray:
    """The per-window losses of `key` in each run of the row: (seeds, W)."""
    return np.array([r.windows[key] for r in row.runs], dtype=np.float64)
