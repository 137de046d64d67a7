"""Extrapolation as a count of runs: is each run flat past its training length, and in how many of a row's
runs, with a Wilson interval. A row whose seeds disagree in kind (one flat run, two that break) has a mean
± std that describes none of them; the count, and each seed's values, do.

A run is judged where a break happens: on the tail of each longer window (its positions past the training
length, `ppl_tail/L`), not on the whole window, whose first T positions dilute a break. Each run has a
ratio, its largest tail perplexity past T over its perplexity at T; the count is given at the chosen cutoff
and at the cutoffs around it, so that no verdict hangs on the third decimal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from posab.keys import key_corpora, key_lengths, metric_key
from posab.report.grouping import Row
from posab.report.markdown import MISSING, markdown_table
from posab.report.records import SEQ_LEN_KEY, RunRecord
from posab.report.resampling import wilson_interval

# A run is flat when ppl_tail/L <= FLAT_RATIO x ppl/T at every evaluated length L > T (T = train.seq_len),
# ppl_tail/L the perplexity of the positions >= T of the windows of L: its ratio, max over L of ppl_tail/L
# / ppl/T, is at most FLAT_RATIO. 10%: well above what separates seeds of one row at T (std 0.4-2.5% of the
# perplexity in study_main) and what the length-robust encodings move by on the tail from 512 to 4,096
# (ALiBi, T5, KERPLE: ratios 0.99-1.00 in study_main), below most breaks (x 1.3 and more). Some runs sit
# near it (NoPE's 1.09-1.17 in study_main): the counts at SENSITIVITY_RATIOS, shown beside it, say how many.
FLAT_RATIO = 1.10
SENSITIVITY_RATIOS = (1.05, 1.10, 1.20)
TAIL, WHOLE = "tail", "whole windows"  # what a run's ratio is measured on: ppl_tail/L, or ppl/L without it
_CUTOFFS = " / ".join(f"{c:.2f}" for c in SENSITIVITY_RATIOS)
FLAT_LEGEND = (
    "flat: a run is flat when, at every evaluated length L past the training length T (`train.seq_len`), "
    "the perplexity of the positions >= T of its windows of L (the tail, `ppl_tail/L`) is at most "
    f"{FLAT_RATIO:.2f} × its perplexity at T (`ppl/T`); for a RoPE scaling view, that scaling's "
    "perplexities. The tail leaves out each window's first T positions, which would dilute a break past T "
    f"(by 1/8 at 8×). k of n: the runs of the row that are flat at the cutoff {FLAT_RATIO:.2f}, of those "
    "with a perplexity at T and at every such length. The cutoff is more than the seeds of one row differ "
    "by at T and than length-robust encodings move by, less than most breaks",
    "ratio: a run's largest `ppl_tail/L` over those L, divided by its `ppl/T`: flat when it is at most "
    f"{FLAT_RATIO:.2f}",
    f"basis: {TAIL}, or {WHOLE}: a run without a tail perplexity at every such length (evaluated before "
    "`ppl_tail` was measured, or under a RoPE scaling it was not measured under) is judged on its "
    "whole-window perplexity `ppl/L` instead, which includes each window's first T positions and so "
    "understates a break; the seeds so judged are named",
    "lengths: T → the longest evaluated length (its multiple of T)",
    f"Wilson 95%: Wilson's (1927) score interval of the share of flat runs, k / n, at {FLAT_RATIO:.2f}",
    f"flat at {_CUTOFFS}: k, of the same n, at each of these cutoffs: a count that changes between them "
    "has runs near the cutoff, whose verdict a small change of the ratio would turn",
    "per seed: each run's verdict and ratio by seed; a row whose runs disagree (0 < k < n) is not summarised "
    "by its mean ± std (it describes neither kind of run): its table gives each seed's perplexity at T, its "
    "tail perplexity at every longer length (`tail@L`; for a run on whole windows its `ppl/L`, marked "
    "(whole)) and its ratio",
)


@dataclass(frozen=True)
class RunRatio:
    """One run's largest perplexity past the training length over its perplexity there."""

    ratio: float
    basis: str  # TAIL (ppl_tail/L) or WHOLE (ppl/L, for a run without the tail)

    @property
    def flat(self) -> bool:
        """Whether the ratio is at most FLAT_RATIO."""
        return self.ratio <= FLAT_RATIO


@dataclass
class FlatCount:
    """The runs of one row judged flat or not past the training length."""

    row: Row
    train_len: int
    lengths: list[int]  # the evaluated lengths above train_len, ascending
    ratios: dict[str, RunRatio]  # run name -> ratio, for the runs with a perplexity at train_len and past it
    corpus: str | None = None  # the evaluation corpus (`eval.corpora`) of the perplexities; None: eval.split

    @property
    def flat(self) -> dict[str, bool]:
        """Run name -> flat at FLAT_RATIO, for the judged runs."""
        return {name: r.flat for name, r in self.ratios.items()}

    def k_at(self, cutoff: float) -> int:
        """The runs whose ratio is at most `cutoff`."""
        return sum(r.ratio <= cutoff for r in self.ratios.values())

    @property
    def k(self) -> int:
        return self.k_at(FLAT_RATIO)

    @property
    def n(self) -> int:
        return len(self.ratios)

    @property
    def interval(self) -> tuple[float, float]:
        """Wilson 95% interval of the share of flat runs."""
        return wilson_interval(self.k, self.n)

    @property
    def disagree(self) -> bool:
        """Some runs flat, some not: the row is shown seed by seed."""
        return 0 < self.k < self.n


def run_ratio(
    run: RunRecord, train_len: int, lengths: Sequence[int], corpus: str | None = None
) -> RunRatio | None:
    """max over `lengths` of ppl_tail/L ÷ ppl/train_len (on `corpus`); of ppl/L (basis WHOLE) for a run
    without the tail at every one of them; None when ppl/train_len or a perplexity at a length is missing."""
    base = run.metrics.get(metric_key("ppl", train_len, corpus=corpus))
    if base is None:
        return None
    for metric, basis in (("ppl_tail", TAIL), ("ppl", WHOLE)):
        keys = [metric_key(metric, n, corpus=corpus) for n in lengths]
        if all(k in run.metrics for k in keys):
            return RunRatio(max(run.metrics[k] for k in keys) / base, basis)
    return None


def flat_count(row: Row, corpus: str | None = None) -> FlatCount | None:
    """The row's count on `corpus` (None: eval.split), or None when its runs have no training length or no
    perplexity past it there."""
    if not row.runs or SEQ_LEN_KEY not in row.runs[0].config:
        return None
    train_len = int(row.runs[0].config[SEQ_LEN_KEY])
    keys = [k for r in row.runs for k in r.metrics]
    found = {n for metric in ("ppl", "ppl_tail") for n in key_lengths(keys, metric, corpus=corpus)}
    lengths = sorted(n for n in found if n > train_len)
    if not lengths:
        return None
    judged = {r.name: run_ratio(r, train_len, lengths, corpus) for r in row.runs}
    return FlatCount(row, train_len, lengths, {k: v for k, v in judged.items() if v is not None}, corpus)


def flat_counts(rows: Sequence[Row], corpus: str | None = None) -> list[FlatCount]:
    """The count of every row of a study that has perplexities past its training length (on `corpus`), in
    row order."""
    counts = [flat_count(row, corpus) for row in rows]
    return [c for c in counts if c is not None and c.n]


def seeds_in_order(row: Row) -> list[RunRecord]:
    """The row's runs by seed (a run without one last)."""
    return sorted(row.runs, key=lambda r: (r.seed is None, r.seed or 0, r.name))


def _judged_in_order(count: FlatCount) -> list[RunRecord]:
    """The row's judged runs by seed."""
    return [r for r in seeds_in_order(count.row) if r.name in count.ratios]


def flat_section(study: str, rows: Sequence[Row]) -> list[str]:
    """The study's flat counts as a Markdown section, on eval.split and then on each evaluation corpus: one
    line per row, then a per-seed table of each row whose runs disagree; none for a study without
    perplexities past the training length."""
    lines = []
    for corpus in (None, *key_corpora(k for row in rows for r in row.runs for k in r.metrics)):
        lines += _flat_tables(study, flat_counts(rows, corpus), corpus)
    return [*lines, "Legend:", "", *(f"- {item}" for item in FLAT_LEGEND), ""] if lines else []


def _flat_tables(study: str, counts: Sequence[FlatCount], corpus: str | None) -> list[str]:
    if not counts:
        return []
    body = [
        [c.row.label, _span(c), _basis(c), f"{c.k} of {c.n}", _wilson_cell(c), _sensitivity(c), _verdicts(c)]
        for c in counts
    ]
    header = ["encoding, swept values", "lengths", "basis", "flat", "Wilson 95%", f"flat at {_CUTOFFS}"]
    on = f" on `{corpus}` (the runs that scored it)" if corpus else ""
    lines = [f"### Extrapolation: flat in k of n (study {study}){on}", ""]
    lines += [*markdown_table([*header, "per seed"], body), ""]
    for count in (c for c in counts if c.disagree):
        lines += [f"`{count.row.label}`: flat in {count.k} of {count.n} runs{on}; each seed:", ""]
        lines += [*seed_table(count), ""]
    return lines


def _span(count: FlatCount) -> str:
    longest = count.lengths[-1]
    return f"{count.train_len} → {longest} ({longest / count.train_len:g}×)"


def _basis(count: FlatCount) -> str:
    """TAIL, WHOLE, or the tail with the seeds judged on whole windows named."""
    whole = [_seed(r) for r in _judged_in_order(count) if count.ratios[r.name].basis == WHOLE]
    if not whole:
        return TAIL
    if len(whole) == count.n:
        return WHOLE
    return f"{TAIL}; {WHOLE}: seed{'s' if len(whole) > 1 else ''} {', '.join(whole)}"


def _wilson_cell(count: FlatCount) -> str:
    low, high = count.interval
    return f"[{low:.2f}, {high:.2f}]"


def _sensitivity(count: FlatCount) -> str:
    return " / ".join(str(count.k_at(cutoff)) for cutoff in SENSITIVITY_RATIOS)


def _verdicts(count: FlatCount) -> str:
    """`0: flat 1.020, 1: not 1.450`: each judged run's verdict and ratio by seed."""
    ratios = [(r, count.ratios[r.name]) for r in _judged_in_order(count)]
    return ", ".join(f"{_seed(r)}: {'flat' if q.flat else 'not'} {q.ratio:.3f}" for r, q in ratios)


def _seed(run: RunRecord) -> str:
    return "?" if run.seed is None else str(run.seed)


def seed_table(count: FlatCount) -> list[str]:
    """One line per run of the row: its seed, its perplexity at T, its tail perplexity at each longer length
    (its whole-window one, marked, for a run on WHOLE), flat or not, its ratio."""
    base = metric_key("ppl", count.train_len, corpus=count.corpus)
    body = [
        [_seed(r), _value(r, base), *(_past(count, r, n) for n in count.lengths), *verdict_cells(count, r)]
        for r in seeds_in_order(count.row)
    ]
    header = ["seed", f"ppl@{count.train_len}", *(f"tail@{n}" for n in count.lengths), "flat", "ratio"]
    return markdown_table(header, body)


def _value(run: RunRecord, key: str, mark: str = "") -> str:
    return f"{run.metrics[key]:.2f}{mark}" if key in run.metrics else MISSING


def _past(count: FlatCount, run: RunRecord, length: int) -> str:
    """The run's tail perplexity at `length`, or its whole-window one, marked, when it is judged on WHOLE."""
    if run.name in count.ratios and count.ratios[run.name].basis == WHOLE:
        return _value(run, metric_key("ppl", length, corpus=count.corpus), " (whole)")
    return _value(run, metric_key("ppl_tail", length, corpus=count.corpus))


def verdict_cells(count: FlatCount, run: RunRecord) -> list[str]:
    """The run's verdict (yes, no) and ratio cells; MISSING for a run not judged."""
    ratio = count.ratios.get(run.name)
    if ratio is None:
        return [MISSING, MISSING]
    return ["yes" if ratio.flat else "no", f"{ratio.ratio:.3f}"]
