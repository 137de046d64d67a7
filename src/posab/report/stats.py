"""Statistics over the seeds of a row: what the tables and plots show of several runs.

Mean, sample std (ddof=1), count, min and max of each metric per row, and the validation-loss curve per row
(mean, min, max at each step).

Paired differences: each row of a study against the `nope` and `alibi` rows in mean per-window loss, at
the level where independence holds (`resampling`). Every run of a study scores the same evaluation windows,
so most of the variation between windows (some text is harder) is shared by both rows and cancels when the
windows are resampled together. The windows are not independent: they come from a few documents (the test
split of pg-books is two books) whose effects differ, so the interval resamples the documents, then the
windows within them, and the seeds.

How the seeds enter depends on the comparison's design (`pairing`), named on every line:
- `same-weights`: the two rows are the same trained models read two ways (a re-evaluation with an option
  that does not act in training: every pair of runs of one seed has the same training and validation loss,
  to the last bit). The runs are pairs; the test is the exact sign-flip test on the per-seed differences.
- `seed-matched`: runs of one seed of both rows, under one training protocol. A seed fixes the order of the
  training windows for every encoding (`TrainSampler`'s own generator), and the initialisation of every
  shared weight for the encodings whose constructor draws nothing from torch's generator (nope, alibi,
  rope, sinusoidal, learned); an encoding with parameters draws them first and shifts the rest. Paired by
  seed: the sign-flip test on the seeds both rows have, the bootstrap over those pairs.
- `unpaired`: fewer than two seeds in common, or protocols that differ: the exact permutation test on the
  per-seed means and each row's seeds resampled on their own.
The verdict of a comparison depends on its runs alone, never on which rows share its report: an exploratory
comparison is never `ordered`; a claimed one (a claims file's, `posab.studies.claims`) takes its verdict from
its declared family, computed once for the whole study (`posab.studies.verdicts.claim_verdicts`).

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
from posab.report.grouping import Row
from posab.report.matching import comparison_id, unmatched
from posab.report.records import ReportError, RunRecord
from posab.report.resampling import bootstrap_interval, permutation_p, sign_flip_p

ROW = "row"  # the column of run_values that names each run's row
TABLE_STATISTICS = ("mean", "std", "count")  # std: pandas' sample std, ddof=1
BAND_STATISTICS = ("mean", "min", "max")
PAIRED_REFERENCES = ("nope", "alibi")  # the default rows every other row is compared with (`reference_rows`)
PAIRED_METRICS = ("loss", "loss_tail")  # compared per-window keys: `loss/L`, `loss_tail/L` (L > training)
ALPHA = 0.05  # the level of the seed-level test (adjusted within a claim's declared family)
ORDERED, SUGGESTIVE, INDISTINGUISHABLE = "ordered", "suggestive", "indistinguishable"
OPPOSITE = "opposite"  # a claim whose interval excludes 0 on the side it did not claim
EXPLORATORY = "exploratory"  # the `family` of a comparison no claims file names
SAME_WEIGHTS, SEED_MATCHED, UNPAIRED = "same-weights", "seed-matched", "unpaired"
PAIRED_DESIGNS = (SAME_WEIGHTS, SEED_MATCHED)
TESTS = {  # the seed-level test of each design, as the report names it
    SAME_WEIGHTS: "sign-flip",
    SEED_MATCHED: "sign-flip",
    UNPAIRED: "permutation",
}
# config keys that must agree for two runs of one seed to be a pair: what the model trained on, and how long
PROTOCOL_KEYS = (
    "train.steps",
    "train.batch_size",
    "train.seq_len",
    "train.grad_accum",
    "train.warmup_steps",
    "data.anchors",
    "data.tokenizer",
    "data.vocab_size",
    "data.needle_rate",
)
SAME_TRAINING = ("train_loss", "val_loss")  # equal to the last bit in every pair: the same weights
ClaimedLines = Mapping[str, Mapping[str, Any]]  # comparison id -> family, claim, p_holm, verdict
PAIRED_COLUMNS = (
    "study",
    "corpus",  # the evaluation corpus (`eval.corpora`) whose windows were compared; "": `eval.split`
    "row",
    "reference",
    "length",
    "metric",
    "design",  # SAME_WEIGHTS, SEED_MATCHED or UNPAIRED (`pairing`)
    "test",  # the seed-level test of the design (TESTS)
    "unmatched",  # what differs between the compared runs: precision, cpu, kernels, commit ("?": unknown)
    "comparison",  # an id of (the runs compared, metric, length, corpus): the same in every report
    "difference",  # arm minus reference, mean per-window loss, nats per token
    "low",  # 2.5th percentile of the bootstrap replicates
    "high",  # 97.5th percentile
    "excludes_zero",
    "unstable",  # 0 lies within an end ± its Monte Carlo error: `excludes_zero` could flip with more draws
    "seeds_row",  # the row's runs compared (paired designs: the pairs)
    "seeds_reference",
    "windows",
    "documents",  # the documents resampled; empty: runs without window documents, windows resampled alone
    "draws",  # bootstrap replicates drawn (until both ends' Monte Carlo error < MC_BOUND, or MAX_DRAWS)
    "mc_error_low",  # Monte Carlo error of `low`, nats
    "mc_error_high",
    "p_seeds",  # the design's test, exact, two-sided
    "family",  # EXPLORATORY, or the family of the claim that names the comparison
    "claim",  # the claim's id (`FAMILY.N`), "" for an exploratory comparison
    "p_holm",  # a claim's one-sided p adjusted within its family (its procedure); empty when exploratory
    "verdict",  # ORDERED, SUGGESTIVE, INDISTINGUISHABLE or OPPOSITE (`exploratory_verdict`, claims)
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
    claimed: ClaimedLines | None = None,
) -> PairedDifferences:
    """Every row of each study whose runs have per-window losses against each reference row of the study
    (`references` that it has), at every length and PAIRED_METRICS key all their runs have, on `eval.split`
    and on each evaluation corpus both rows have runs on, with their verdicts (`with_verdicts`: `claimed`,
    the study's claim verdicts by comparison id, give theirs).

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
    paired.frame = with_verdicts(pd.DataFrame(lines, columns=list(PAIRED_COLUMNS)), claimed or {})
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


def with_verdicts(frame: pd.DataFrame, claimed: ClaimedLines) -> pd.DataFrame:
    """The comparisons with their `family`, `claim`, `p_holm` and `verdict`: a comparison `claimed` names
    (by id) takes its claim's; every other one is EXPLORATORY (`exploratory_verdict`, no p_holm).
    `documents` as integers (empty where none)."""
    frame = frame.copy()
    frame["documents"] = frame["documents"].astype("Int64")
    found = [claimed.get(cid, {}) for cid in frame["comparison"]]
    frame["family"] = [c.get("family", EXPLORATORY) for c in found]
    frame["claim"] = [c.get("claim", "") for c in found]
    frame["p_holm"] = pd.array([c.get("p_holm", math.nan) for c in found], dtype="float64")
    frame["verdict"] = [
        c.get("verdict") or exploratory_verdict(bool(line.excludes_zero and not line.unstable), line.p_seeds)
        for c, line in zip(found, frame.itertuples(), strict=True)
    ]
    return frame


def exploratory_verdict(interval_excludes_zero: bool, p_seeds: float) -> str:
    """SUGGESTIVE when the interval excludes 0 (stably) or the design's two-sided p < ALPHA, unadjusted;
    else INDISTINGUISHABLE. Never ORDERED: a comparison no claims file stated before its runs is where
    the next study's claims come from, not a finding (Bender & Lange 2001)."""
    return SUGGESTIVE if interval_excludes_zero or p_seeds < ALPHA else INDISTINGUISHABLE


def verdict(interval_on_claimed_side: bool, interval_on_other_side: bool, p_holm: float) -> str:
    """A claim's verdict: ORDERED when its interval excludes 0 on the claimed side (stably) and its one-sided
    p, adjusted within its family by the family's procedure (Holm, or a fixed sequence), < ALPHA; SUGGESTIVE
    when one of the two holds; OPPOSITE when the interval excludes 0 on the other side; else
    INDISTINGUISHABLE."""
    if interval_on_other_side:
        return OPPOSITE
    holds = int(interval_on_claimed_side) + int(p_holm < ALPHA)
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


@dataclass(frozen=True)
class Pairing:
    """How two rows' runs are compared: the design and the runs it uses, in pair order for a paired one."""

    design: str
    arm: list[RunRecord]
    reference: list[RunRecord]

    @property
    def paired(self) -> bool:
        return self.design in PAIRED_DESIGNS


def pairing(arm: Sequence[RunRecord], reference: Sequence[RunRecord]) -> Pairing:
    """SAME_WEIGHTS when the rows share two or more seeds, each pair trained under one protocol
    (PROTOCOL_KEYS) and with the same training and validation loss to the last bit; SEED_MATCHED when
    they share two or more seeds under one protocol; else UNPAIRED, with every run of both rows."""
    arm_by_seed = {r.seed: r for r in arm if r.seed is not None}
    ref_by_seed = {r.seed: r for r in reference if r.seed is not None}
    common = sorted(set(arm_by_seed) & set(ref_by_seed))
    pairs = [(arm_by_seed[s], ref_by_seed[s]) for s in common]
    if len(pairs) < 2 or not all(_same_protocol(a, b) for a, b in pairs):
        return Pairing(UNPAIRED, list(arm), list(reference))
    design = SAME_WEIGHTS if all(_same_training(a, b) for a, b in pairs) else SEED_MATCHED
    return Pairing(design, [a for a, _ in pairs], [b for _, b in pairs])


def _same_protocol(a: RunRecord, b: RunRecord) -> bool:
    return all(a.config.get(k) == b.config.get(k) for k in PROTOCOL_KEYS)


def _same_training(a: RunRecord, b: RunRecord) -> bool:
    values = [(a.metrics.get(k), b.metrics.get(k)) for k in SAME_TRAINING]
    return all(x is not None and not math.isnan(x) and x == y for x, y in values)


def _places(run: RunRecord, corpus: str) -> tuple[list[int], list[int]]:
    """The starts and documents of a run's windows on `corpus` ("": `eval.split`)."""
    if not corpus:
        return run.window_starts, run.window_documents
    return run.corpus_windows[corpus].starts, run.corpus_windows[corpus].documents


def _compare(
    arm: Row,
    reference: Row,
    corpus: str = "",
    only: tuple[str, int] | None = None,
    alternative: str | None = None,
) -> tuple[list[dict[str, Any]], str, np.ndarray | None]:
    """The lines of one pair of rows on `corpus` (all but the study, family, claim, p_holm and verdict) and
    the documents their windows were resampled within (None: windows alone), or no lines and the reason
    why. `only`: the one (metric, length) to compare; `alternative`: add its one-sided p (`compare_sides`)."""
    on_corpus = [
        [r for r in row.runs if not corpus or corpus in r.corpus_windows] for row in (arm, reference)
    ]
    pair = pairing(*on_corpus)
    sides = (_Side(arm.label, pair.arm), _Side(reference.label, pair.reference))
    runs = [*pair.arm, *pair.reference]
    lacking = [r.name for r in runs if not r.windows]
    if lacking:
        return [], f"no per-window losses (`perplexity_windows.npz`) for {', '.join(lacking)}", None
    places = [_places(r, corpus) for r in runs]
    if len({tuple(starts) for starts, _ in places}) > 1:
        return [], "their runs scored different windows (`window_starts` differ), no pairing", None
    if len({tuple(documents) for _, documents in places if documents}) > 1:
        return [], "their runs place the windows in different documents (`window_documents`)", None
    keys = [k for k in _common_keys(runs, corpus) if only is None or k == only]
    if not keys:
        return [], "no `loss/L` that every run of both rows has", None
    documents = np.array(places[0][1]) if all(d for _, d in places) else None
    lines = [
        compare_sides(*sides, pair.design, metric, length, corpus, documents, alternative)
        for metric, length in keys
    ]
    return lines, "", documents


def compare_sides(
    arm: _Side,
    reference: _Side,
    design: str,
    metric: str,
    length: int,
    corpus: str,
    documents: np.ndarray | None,
    alternative: str | None = None,
) -> dict[str, Any]:
    """One comparison: the hierarchical bootstrap interval and the design's seed-level test (runs in pair
    order for a paired design), two-sided, and with `alternative` (`less`, `greater`) also that side's p
    (`p_claim`)."""
    key = metric_key(metric, length, corpus=corpus or None)
    arm_losses = _losses(arm, key)  # (seeds, W)
    reference_losses = _losses(reference, key)  # (seeds, W)
    paired = design in PAIRED_DESIGNS
    interval = bootstrap_interval(arm_losses, reference_losses, documents, paired=paired)
    means = (arm_losses.mean(axis=1), reference_losses.mean(axis=1))  # (seeds,) each
    one_sided = {} if alternative is None else {"p_claim": seed_p(*means, paired, alternative)}
    return {
        "corpus": corpus,
        "row": arm.label,
        "reference": reference.label,
        "length": length,
        "metric": metric,
        "design": design,
        "test": TESTS[design],
        "unmatched": unmatched(arm.runs, reference.runs, paired),
        "comparison": comparison_id(arm.runs, reference.runs, metric, length, corpus),
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
        "p_seeds": seed_p(*means, paired),
        **one_sided,
    }


def compare_one(
    arm: Row, reference: Row, metric: str, length: int, corpus: str, alternative: str
) -> dict[str, Any]:
    """One comparison of two rows, as `paired_differences` makes it, with `p_claim`, the design's test on
    the side `alternative` (`less`, `greater`); a ReportError says why they cannot be compared."""
    lines, note, _ = _compare(arm, reference, corpus, (metric, length), alternative)
    if not lines:
        raise ReportError(f"`{arm.label}` vs `{reference.label}`, {metric}/{length}: {note or 'no such key'}")
    return lines[0]


def seed_p(arm: np.ndarray, reference: np.ndarray, paired: bool, alternative: str = "two-sided") -> float:
    """The seed-level p of per-seed means (seeds,): the sign-flip test of their differences when `paired`
    (in pair order), else the permutation test of the two samples."""
    if paired:
        return sign_flip_p(arm - reference, alternative)
    return permutation_p(arm, reference, alternative)


def _common_keys(runs: Sequence[RunRecord], corpus: str) -> list[tuple[str, int]]:
    """(metric, length) of each PAIRED_METRICS key on `corpus` every run has, by length, then in
    PAIRED_METRICS order."""
    common = set.intersection(*(set(r.windows) for r in runs))
    keys = [(m, n) for m in PAIRED_METRICS for n in key_lengths(common, m, corpus=corpus or None)]
    return sorted(keys, key=lambda key: (key[1], PAIRED_METRICS.index(key[0])))


def _losses(row: _Side, key: str) -> np.ndarray:
    """The per-window losses of `key` in each run of the row: (seeds, W)."""
    return np.array([r.windows[key] for r in row.runs], dtype=np.float64)
