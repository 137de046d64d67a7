"""The tests behind the paired differences and the flat counts: a hierarchical bootstrap with its Monte Carlo
error, exact permutation tests on the seeds (unpaired and paired), Holm's correction and Wilson's interval.

- `bootstrap_interval`: arm minus reference in mean per-window loss, with a 95% percentile interval (Efron &
  Tibshirani 1993, ch. 13) of a hierarchical bootstrap (Davison & Hinkley 1997, §3.8): documents of the
  evaluation text, windows within each drawn document (the same draws for both rows: the pairing), and
  each row's seeds, independently (`paired=True`: the pairs of runs, one draw for both rows). Batches of
  draws are added until the Monte Carlo error of both interval ends is below a bound, or a cap is reached.
- `permutation_p`: the seed-level test of unpaired rows, on each run's mean loss over the windows (Good 2005).
- `sign_flip_p`: the seed-level test of paired rows (the same weights, or runs matched by seed), on the
  per-seed differences of those means (Good 2005, ch. 3: the paired permutation test, every sign flipped).
- `least_one_sided_p`: the smallest p either seed-level test can give at a number of seeds (a design's floor).
- `least_holm_p`, `least_fixed_sequence_p`: the least adjusted p a family of such designs can reach.
- `holm`: Holm's (1979) step-down adjustment of a family of p-values.
- `fixed_sequence`: the fixed-sequence (gatekeeping) adjustment of an ordered family of p-values.
- `wilson_interval`: Wilson's (1927) score interval of a proportion k of n.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054  # the standard normal's 97.5th percentile
LEVEL = (2.5, 97.5)  # percentiles of the 95% interval
BATCH = 2000  # bootstrap draws added at a time
MAX_DRAWS = 64000  # ... up to this many
MC_BOUND = 0.0005  # nats: the Monte Carlo error below which both interval ends count as settled
EXACT_SPLITS = 16  # a + b seeds up to which the permutation test enumerates every split (C(16, 8) = 12,870)
PERMUTATIONS = 20000  # random splits beyond that: Monte Carlo error <= 0.003 at p = 0.05
TIE = 1e-12  # a split's statistic counts as extreme when >= |observed| - TIE (float noise of the means)


@dataclass(frozen=True)
class Interval:
    """A bootstrap interval of arm minus reference, its draws and the Monte Carlo error of each end."""

    difference: float
    low: float
    high: float
    draws: int
    mc_error_low: float
    mc_error_high: float

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    @property
    def unstable(self) -> bool:
        """0 lies within an end ± its Monte Carlo error: more draws could flip `excludes_zero`."""
        return abs(self.low) < self.mc_error_low or abs(self.high) < self.mc_error_high


def window_counts(documents: np.ndarray, draws: int, rng: np.random.Generator) -> np.ndarray:
    """(draws, W) how often each of W windows enters each replicate (Davison & Hinkley 1997, §3.8): the D
    documents of `documents` (W,) are drawn D times with replacement, then within each drawn document as
    many windows as it holds, with replacement."""
    _, index, sizes = np.unique(documents, return_inverse=True, return_counts=True)  # (W,), (D,)
    order = np.argsort(index, kind="stable")  # window indices grouped by document
    firsts = np.cumsum(sizes) - sizes  # (D,) where each document's windows start in `order`
    picks = rng.integers(0, len(sizes), size=(draws, len(sizes))).ravel()  # (draws * D,) drawn documents
    slot = np.repeat(np.arange(len(picks)), sizes[picks])  # (total,) the drawn document of each window
    document = picks[slot]  # (total,)
    position = firsts[document] + (rng.random(len(slot)) * sizes[document]).astype(np.int64)  # uniform in it
    flat = (slot // len(sizes)) * len(documents) + order[position]  # (total,) index into (draws, W)
    return np.bincount(flat, minlength=draws * len(documents)).reshape(draws, len(documents))


def _seed_weights(seeds: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """(draws, seeds) the share of each run in each replicate's seeds, drawn with replacement."""
    drawn = rng.integers(0, seeds, size=(draws, seeds)) + seeds * np.arange(draws)[:, None]  # (draws, seeds)
    return np.bincount(drawn.ravel(), minlength=draws * seeds).reshape(draws, seeds) / seeds


def replicates(
    arm: np.ndarray,
    reference: np.ndarray,
    documents: np.ndarray,
    draws: int,
    rng: np.random.Generator,
    paired: bool = False,
) -> np.ndarray:
    """(draws,) bootstrap replicates of the mean over the drawn windows of (arm's drawn-seed mean minus the
    reference's), from per-window losses (seeds, W) of two rows that scored the same W windows. `paired`:
    run i of the arm and run i of the reference are one pair (the same weights, or the same seed), and one
    draw of the pairs weighs both rows, so the replicate is the mean of the drawn pairs' differences."""
    counts = window_counts(documents, draws, rng).astype(np.float64)  # (draws, W)
    if paired:
        weights = _seed_weights(len(arm), draws, rng)  # (draws, pairs)
        return ((counts @ (arm - reference).T) * weights).sum(axis=1) / counts.sum(axis=1)
    arm_sums = ((counts @ arm.T) * _seed_weights(len(arm), draws, rng)).sum(axis=1)  # (draws, a) -> (draws,)
    ref_sums = ((counts @ reference.T) * _seed_weights(len(reference), draws, rng)).sum(axis=1)
    return (arm_sums - ref_sums) / counts.sum(axis=1)


def percentile_mc_error(ordered: np.ndarray, percentile: float) -> float:
    """Monte Carlo error of the `percentile` of sorted bootstrap replicates: half the width of the
    order-statistic (binomial) 95% confidence interval of that quantile, between the sorted values at ranks
    n p ± 1.96 sqrt(n p (1 - p)) (Efron & Tibshirani 1993, §19.3)."""
    n, p = len(ordered), percentile / 100
    spread = Z95 * math.sqrt(n * p * (1 - p))
    lo = min(max(math.floor(n * p - spread), 0), n - 1)
    hi = min(max(math.ceil(n * p + spread), 0), n - 1)
    return float(ordered[hi] - ordered[lo]) / 2


def bootstrap_interval(
    arm: np.ndarray,
    reference: np.ndarray,
    documents: np.ndarray | None = None,
    bound: float = MC_BOUND,
    cap: int = MAX_DRAWS,
    paired: bool = False,
) -> Interval:
    """Arm minus reference in mean loss over seeds and windows, and its 95% percentile interval from
    `replicates`, drawn BATCH at a time until the Monte Carlo error of both ends is below `bound` or `cap`
    draws are made. `documents` (W,): the document of each window; None: each window is its own document,
    which resamples the windows alone. `paired`: the rows' runs are pairs in order (`replicates`). The
    generator is seeded (`default_rng(0)`): the same losses give the
    same interval."""
    rng = np.random.default_rng(0)
    units = np.arange(arm.shape[1]) if documents is None else np.asarray(documents)
    ordered = np.empty(0)
    while True:
        batch = np.sort(replicates(arm, reference, units, min(BATCH, cap), rng, paired))
        ordered = np.sort(np.concatenate([ordered, batch]), kind="stable")  # a merge of two sorted runs
        errors = [percentile_mc_error(ordered, p) for p in LEVEL]
        if max(errors) < bound or len(ordered) >= cap:
            break
    low, high = np.percentile(ordered, LEVEL)
    difference = float(arm.mean() - reference.mean())
    return Interval(difference, float(low), float(high), len(ordered), errors[0], errors[1])


def permutation_p(arm: Sequence[float], reference: Sequence[float], alternative: str = "two-sided") -> float:
    """Permutation test of the difference in means of two samples (Good 2005, ch. 3). A one-sided p is the
    share of the splits of the pooled values into groups of their sizes whose difference of means is at
    most (`less`) or at least (`greater`) the observed one; `two-sided` is twice the smaller (at most 1).
    Exact, over every one of the C(a + b, a) splits, for a + b <= EXACT_SPLITS: fully separated samples give
    2 / C(a + b, a) two-sided whatever their values (0.1 at 3 vs 3, 0.2 at 2 vs 3, 1/3 at 2 vs 2), the least
    there is. Beyond, PERMUTATIONS random splits, each one-sided p = (1 + hits) / (1 + n)."""
    _check_side(alternative)
    pooled = np.asarray([*arm, *reference], dtype=np.float64)
    size, total = len(arm), pooled.sum()
    observed = pooled[:size].mean() - pooled[size:].mean()
    exact = len(pooled) <= EXACT_SPLITS
    if exact:
        splits = np.array(list(itertools.combinations(range(len(pooled)), size)))  # (C, a)
    else:
        rng = np.random.default_rng(0)
        splits = rng.permuted(np.tile(np.arange(len(pooled)), (PERMUTATIONS, 1)), axis=1)[:, :size]
    sums = pooled[splits].sum(axis=1)  # (C,)
    statistics = sums / size - (total - sums) / (len(pooled) - size)  # (C,)
    return _sided_p(statistics, observed, exact, alternative)


def _sided_p(statistics: np.ndarray, observed: float, exact: bool, alternative: str) -> float:
    """The p of `alternative` from a test's statistics under every (or `PERMUTATIONS` random)
    rearrangements: the share at most / at least the observed one, or twice the smaller."""
    low = int((statistics <= observed + TIE).sum())
    high = int((statistics >= observed - TIE).sum())

    def share(hits: int) -> float:
        return hits / len(statistics) if exact else (1 + hits) / (1 + len(statistics))

    if alternative == "less":
        return share(low)
    if alternative == "greater":
        return share(high)
    return min(1.0, 2 * share(min(low, high)))


def _check_side(alternative: str) -> None:
    if alternative not in SIDES:
        raise ValueError(f"alternative {alternative!r}; valid: {', '.join(SIDES)}")


SIDES = ("two-sided", "less", "greater")  # alternatives: arm - reference != 0, < 0, > 0


def sign_flip_p(differences: Sequence[float], alternative: str = "two-sided") -> float:
    """Permutation test of paired differences (Good 2005, ch. 3): under the null each pair's two runs are
    exchangeable, so each difference's sign is a fair coin. The statistic is the mean difference; a
    one-sided p is the share of the 2^n sign assignments whose mean is at most (`less`) or at least
    (`greater`) the observed one, and `two-sided` is twice the smaller (at most 1). Exact for n <=
    EXACT_SPLITS pairs: five pairs that all point one way give 1/32 one-sided, 1/16 two-sided, the least
    there is at n = 5. Beyond, PERMUTATIONS random assignments, each one-sided p = (1 + hits) / (1 + n)."""
    _check_side(alternative)
    values = np.asarray(differences, dtype=np.float64)
    exact = len(values) <= EXACT_SPLITS
    if exact:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(values))))  # (2^n, n)
    else:
        signs = np.random.default_rng(0).choice((1.0, -1.0), size=(PERMUTATIONS, len(values)))
    return _sided_p((signs * values).mean(axis=1), float(values.mean()), exact, alternative)


def least_one_sided_p(arm_seeds: int, reference_seeds: int, paired: bool) -> float:
    """The smallest one-sided p the seed-level test can give these rows, whatever their values: 2^-n for n
    pairs (`sign_flip_p`, every difference on one side), 1 / C(a + b, a) for unpaired samples of a and b
    (`permutation_p`, fully separated), and 1 / (1 + PERMUTATIONS) where either test samples at random."""
    if paired:
        return 2.0**-arm_seeds if arm_seeds <= EXACT_SPLITS else 1 / (1 + PERMUTATIONS)
    if arm_seeds + reference_seeds <= EXACT_SPLITS:
        return 1 / math.comb(arm_seeds + reference_seeds, arm_seeds)
    return 1 / (1 + PERMUTATIONS)


def least_holm_p(least_p_values: Sequence[float]) -> float:
    """The least Holm-adjusted p a family can reach, given each claim's least one-sided p: Holm's first step,
    m times the smallest of them; every adjusted p of the family is at least this."""
    return len(least_p_values) * min(least_p_values)


def least_fixed_sequence_p(least_p_values: Sequence[float]) -> float:
    """The least fixed-sequence-adjusted p a family can reach, given each claim's least one-sided p in the
    family's order: its first claim's (every adjusted p is at least the first claim's p)."""
    return least_p_values[0]


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's (1979) step-down adjusted p-values: the i-th smallest of m becomes the largest of
    min(1, (m - j + 1) p_(j)) over j <= i; rejecting where adjusted p < alpha controls the family-wise error
    at alpha."""
    p = np.asarray(p_values, dtype=np.float64)
    order = np.argsort(p, kind="stable")
    scaled = (len(p) - np.arange(len(p))) * p[order]  # (m - j + 1) p_(j), j from 1
    adjusted = np.empty_like(p)
    adjusted[order] = np.minimum(1.0, np.maximum.accumulate(scaled))
    return adjusted.tolist()


def fixed_sequence(p_values: Sequence[float]) -> list[float]:
    """The fixed-sequence adjusted p-values of hypotheses tested in their given order (Maurer et al. 1995;
    Westfall & Krishen 2001): each is tested at alpha until the first that is not rejected, and the i-th
    adjusted p is the largest of p_1 .. p_i. Rejecting where adjusted p < alpha controls the family-wise
    error at alpha, as Holm's does, with no multiplier: a claim is tested only once every earlier one was
    rejected, so the first failure ends the family, however small the later p-values."""
    return np.maximum.accumulate(np.asarray(p_values, dtype=np.float64)).tolist()


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's (1927) score interval of a proportion of k successes in n trials: centre
    (k + z²/2) / (n + z²), half-width z / (n + z²) sqrt(k (n - k) / n + z²/4); NaNs for n = 0."""
    if n == 0:
        return math.nan, math.nan
    centre = (k + z * z / 2) / (n + z * z)
    half = z / (n + z * z) * math.sqrt(k * (n - k) / n + z * z / 4)
    return max(0.0, centre - half), min(1.0, centre + half)
