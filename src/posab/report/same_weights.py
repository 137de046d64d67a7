"""Same weights, read two ways: for every two rows of a study that are the same trained models (`pairing`
says SAME_WEIGHTS: an option that does not act in training, such as the clamp, re-evaluated), each run's
perplexities at every length on every corpus both ways, the audit's pull, and each run's flat verdict both
ways, with the count of runs that change kind (broken → flat, flat → broken). One trained model per line:
the evidence an option repairs a model is a model it repairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

from posab.keys import key_corpora, key_lengths, metric_key
from posab.report.flat import FLAT_RATIO, RunRatio, run_ratio
from posab.report.grouping import Row
from posab.report.markdown import MISSING, markdown_table
from posab.report.records import SEQ_LEN_KEY, RunRecord
from posab.report.stats import SAME_WEIGHTS, Pairing, pairing

PULL_KEY = "audit/bias_pull@{length}"  # the largest head's share of bias-only attention past L_train
LEGEND = (
    "each line one trained model (one seed), read as the first row (before →) and as the second (after); "
    "the rows are the same weights: every pair has the same training and validation loss to the last bit",
    "ppl@L: perplexity at evaluation length L on the corpus; pull@L: the extrapolation audit's "
    "`audit/bias_pull@L`, the largest share of a head's bias-only attention that lies past the training "
    f"length ({MISSING} where the run has none)",
    f"flat: the run's tail ratio (max over L past the training length of ppl_tail/L ÷ ppl at it) ≤ "
    f"{FLAT_RATIO:.2f}, with the ratio",
)


def same_weight_pairs(rows: Sequence[Row]) -> list[tuple[Row, Row, Pairing]]:
    """Every two rows (in row order) whose runs are the same weights, with their pairing; scaling views
    left out."""
    plain = [row for row in rows if not row.scaling]
    pairs = [(a, b, pairing(a.runs, b.runs)) for a, b in combinations(plain, 2)]
    return [(a, b, pair) for a, b, pair in pairs if pair.design == SAME_WEIGHTS]


def same_weights_section(study: str, rows: Sequence[Row]) -> list[str]:
    """The study's same-weights pairs, one table per pair and corpus, with the count of runs that change
    kind; none where the study has no such pair."""
    lines = []
    for before, after, pair in same_weight_pairs(rows):
        lines += [f"#### `{before.label}` → `{after.label}`", ""]
        runs = sorted(zip(pair.arm, pair.reference, strict=True), key=lambda two: two[0].seed or 0)
        for corpus in (None, *key_corpora(k for r in before.runs for k in r.metrics)):
            lines += _pair_table(runs, corpus)
    if not lines:
        return []
    heading = f"### Same weights, read two ways (study {study})"
    return [heading, "", *lines, "Legend:", "", *(f"- {item}" for item in LEGEND), ""]


def _pair_table(runs: Sequence[tuple[RunRecord, RunRecord]], corpus: str | None) -> list[str]:
    train_len = int(runs[0][0].config.get(SEQ_LEN_KEY, 0))
    lengths = sorted(key_lengths({k for two in runs for r in two for k in r.metrics}, "ppl", corpus=corpus))
    longer = [n for n in lengths if n > train_len]
    if not longer:
        return []
    verdicts = [[run_ratio(r, train_len, longer, corpus) for r in two] for two in runs]
    body = [
        [str(before.seed), *(_both(before, after, metric_key("ppl", n, corpus=corpus)) for n in lengths)]
        + ([] if corpus else [_both(before, after, PULL_KEY.format(length=longer[-1]), ".3f")])
        + [" → ".join(_flat(v) for v in judged)]
        for (before, after), judged in zip(runs, verdicts, strict=True)
    ]
    pull = [] if corpus else [f"pull@{longer[-1]}"]
    header = ["seed", *(f"ppl@{n}" for n in lengths), *pull, "flat"]
    on = f"On `{corpus}`" if corpus else "On `eval.split`"
    return [f"{on}: {_changes(verdicts)}.", "", *markdown_table(header, body), ""]


def _both(before: RunRecord, after: RunRecord, key: str, form: str = ".2f") -> str:
    values = [r.metrics.get(key) for r in (before, after)]
    return " → ".join(MISSING if v is None else f"{v:{form}}" for v in values)


def _flat(ratio: RunRatio | None) -> str:
    if ratio is None:
        return MISSING
    return f"{'flat' if ratio.flat else 'broken'} {ratio.ratio:.3f}"


def _changes(verdicts: Sequence[Sequence[RunRatio | None]]) -> str:
    """How many runs change kind between the two readings, and how many keep theirs."""
    kinds = [tuple(None if v is None else v.flat for v in two) for two in verdicts]
    repaired = sum(1 for a, b in kinds if a is False and b is True)
    broken = sum(1 for a, b in kinds if a is True and b is False)
    flat_both = sum(1 for a, b in kinds if a is True and b is True)
    return (
        f"broken → flat in {repaired}, flat → broken in {broken}, flat both ways in {flat_both}, "
        f"broken both ways in {sum(1 for a, b in kinds if a is False and b is False)}, of {len(kinds)} runs"
    )
