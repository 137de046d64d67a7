"""Extrapolation as a count of runs: is each run flat past its training length, and in how many of a row's
runs, with a Wilson interval. A row whose seeds disagree in kind (one flat run, two that break) has a mean
± std that describes none of them; the count, and each seed's values, do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from posab.keys import key_corpora, key_lengths, metric_key
from posab.report.grouping import Row
from posab.report.markdown import MISSING, markdown_table
from posab.report.records import SEQ_LEN_KEY, RunRecord
from posab.report.resampling import wilson_interval

# A run is flat when ppl/L <= FLAT_RATIO x ppl/T at every evaluated length L > T (T = train.seq_len). 10%:
# well above what separates seeds of one row at T (std 0.4-2.5% of the perplexity in study_main) and what
# the length-robust encodings move by from 512 to 4,096 (at most 2%), well below a break (x 1.3 and more).
FLAT_RATIO = 1.10
FLAT_LEGEND = (
    "flat: a run is flat when its perplexity at every evaluated length L past the training length T "
    f"(`train.seq_len`) is at most {FLAT_RATIO:.2f} × its perplexity at T (`ppl/L` <= {FLAT_RATIO:.2f} × "
    "`ppl/T`; for a RoPE scaling view, that scaling's perplexities). k of n: the runs of the row that are, "
    "of those with a perplexity at T and at every such length. The bound is more than the seeds of one row "
    "differ by at T and than length-robust encodings move by, far less than a break",
    "lengths: T → the longest evaluated length (its multiple of T)",
    "Wilson 95%: Wilson's (1927) score interval of the share of flat runs, k / n",
    "per seed: each run's verdict by seed; a row whose runs disagree (0 < k < n) is not summarised by its "
    "mean ± std (it describes neither kind of run): its table gives each seed's perplexity at every length",
)


@dataclass
class FlatCount:
    """The runs of one row judged flat or not past the training length."""

    row: Row
    train_len: int
    lengths: list[int]  # the evaluated lengths above train_len, ascending
    flat: dict[str, bool]  # run name -> flat, for the runs with a perplexity at train_len and every length
    corpus: str | None = None  # the evaluation corpus (`eval.corpora`) of the perplexities; None: eval.split

    @property
    def k(self) -> int:
        return sum(self.flat.values())

    @property
    def n(self) -> int:
        return len(self.flat)

    @property
    def interval(self) -> tuple[float, float]:
        """Wilson 95% interval of the share of flat runs."""
        return wilson_interval(self.k, self.n)

    @property
    def disagree(self) -> bool:
        """Some runs flat, some not: the row is shown seed by seed."""
        return 0 < self.k < self.n


def is_flat(run: RunRecord, train_len: int, lengths: Sequence[int], corpus: str | None = None) -> bool | None:
    """Whether ppl/L <= FLAT_RATIO x ppl/train_len at every one of `lengths` (on `corpus`); None when one
    is missing."""
    keys = [metric_key("ppl", n, corpus=corpus) for n in (train_len, *lengths)]
    if not all(k in run.metrics for k in keys):
        return None
    base = run.metrics[keys[0]]
    return all(run.metrics[k] <= FLAT_RATIO * base for k in keys[1:])


def flat_count(row: Row, corpus: str | None = None) -> FlatCount | None:
    """The row's count on `corpus` (None: eval.split), or None when its runs have no training length or no
    perplexity past it there."""
    if not row.runs or SEQ_LEN_KEY not in row.runs[0].config:
        return None
    train_len = int(row.runs[0].config[SEQ_LEN_KEY])
    found = {n for r in row.runs for n in key_lengths(r.metrics, "ppl", corpus=corpus)}
    lengths = sorted(n for n in found if n > train_len)
    if not lengths:
        return None
    judged = {r.name: is_flat(r, train_len, lengths, corpus) for r in row.runs}
    return FlatCount(row, train_len, lengths, {k: v for k, v in judged.items() if v is not None}, corpus)


def flat_counts(rows: Sequence[Row], corpus: str | None = None) -> list[FlatCount]:
    """The count of every row of a study that has perplexities past its training length (on `corpus`), in
    row order."""
    counts = [flat_count(row, corpus) for row in rows]
    return [c for c in counts if c is not None and c.n]


def seeds_in_order(row: Row) -> list[RunRecord]:
    """The row's runs by seed (a run without one last)."""
    return sorted(row.runs, key=lambda r: (r.seed is None, r.seed or 0, r.name))


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
        [c.row.label, _span(c), f"{c.k} of {c.n}", _wilson_cell(c), ", ".join(_seed_verdicts(c))]
        for c in counts
    ]
    header = ["encoding, swept values", "lengths", "flat", "Wilson 95%", "per seed"]
    on = f" on `{corpus}` (the runs that scored it)" if corpus else ""
    lines = [f"### Extrapolation: flat in k of n (study {study}){on}", "", *markdown_table(header, body), ""]
    for count in (c for c in counts if c.disagree):
        lines += [f"`{count.row.label}`: flat in {count.k} of {count.n} runs{on}; each seed:", ""]
        lines += [*seed_table(count), ""]
    return lines


def _span(count: FlatCount) -> str:
    longest = count.lengths[-1]
    return f"{count.train_len} → {longest} ({longest / count.train_len:g}×)"


def _wilson_cell(count: FlatCount) -> str:
    low, high = count.interval
    return f"[{low:.2f}, {high:.2f}]"


def _seed_verdicts(count: FlatCount) -> list[str]:
    runs = [r for r in seeds_in_order(count.row) if r.name in count.flat]
    return [f"{_seed(r)}: {'flat' if count.flat[r.name] else 'not'}" for r in runs]


def _seed(run: RunRecord) -> str:
    return "?" if run.seed is None else str(run.seed)


def seed_table(count: FlatCount) -> list[str]:
    """One line per run of the row: its seed, its perplexity at T and at each longer length, flat or not."""
    lengths = [count.train_len, *count.lengths]
    keys = [metric_key("ppl", n, corpus=count.corpus) for n in lengths]
    body = [
        [_seed(r), *(f"{r.metrics[k]:.2f}" if k in r.metrics else MISSING for k in keys)]
        + [("yes" if count.flat[r.name] else "no") if r.name in count.flat else MISSING]
        for r in seeds_in_order(count.row)
    ]
    return markdown_table(["seed", *(f"ppl@{n}" for n in lengths), "flat"], body)
