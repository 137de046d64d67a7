"""The extrapolation audit beside the flat verdict (issue 28): for the runs that carry the audit, each run's
verdict with the audit's numbers, and for a row whose runs disagree the mean of its flat and of its broken
runs side by side: what differs between them is a candidate explanation of the breakage, and a number that
does not differ is not one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from posab.keys import key_lengths, metric_key
from posab.report.flat import FlatCount, flat_count, seeds_in_order, verdict_cells
from posab.report.grouping import Row
from posab.report.markdown import MISSING, markdown_table
from posab.report.records import RunRecord


@dataclass(frozen=True)
class AuditColumn:
    """One audit number of a run: its header and its key, given the training length T and the longest L."""

    header: Callable[[int, int], str]
    key: Callable[[int, int], str]
    fmt: str


COLUMNS = (
    AuditColumn(lambda t, n: "bias jump", lambda t, n: metric_key("bias_jump"), ".3g"),
    AuditColumn(lambda t, n: f"pull@{n}", lambda t, n: metric_key("bias_pull", n), ".3f"),
    AuditColumn(lambda t, n: f"outside@{n}", lambda t, n: metric_key("novelty_outside", n), ".3f"),
    AuditColumn(lambda t, n: f"nearest@{n}", lambda t, n: metric_key("novelty_nearest", n), ".3g"),
    AuditColumn(lambda t, n: f"near@{n}", lambda t, n: metric_key("novelty_near", n), ".3g"),
    AuditColumn(lambda t, n: f"entropy@{t}", lambda t, n: metric_key("entropy", t), ".3f"),
    AuditColumn(lambda t, n: f"entropy@{n}", lambda t, n: metric_key("entropy", n), ".3f"),
    AuditColumn(lambda t, n: f"distance@{t}", lambda t, n: metric_key("distance", t), ".1f"),
    AuditColumn(lambda t, n: f"distance@{n}", lambda t, n: metric_key("distance", n), ".1f"),
)
LEGEND = (
    "audit by verdict: the runs that carry the extrapolation audit (`eval.extrapolation`), each with its "
    "flat verdict and ratio (see above: on the tail past T) and its whole-window perplexities at T and at "
    "the longest length L",
    "bias jump: the largest step of the additive bias past T over its range within T, largest head "
    "(`audit/bias_jump`); — for an encoding without an additive bias",
    "pull@L: the share of a head's bias-only attention (the last query of a window of L) that lies past T, "
    "minus that share for the bias held at b(T − 1) past T; the largest over heads (`audit/bias_pull@L`): "
    "near 1 when a head that attends locally within T ranks some distance past T above every near one, 0 "
    "for a clamped or flat bias, below 0 for one that keeps decaying",
    "outside@L: the share of the bias MLP's input features (mean over features) whose value at the distances "
    "of length L lies outside the range it took over the training distances (`audit/novelty_outside@L`)",
    "nearest@L: the largest distance from an evaluation input vector to its nearest training input vector "
    "(`audit/novelty_nearest@L`); 0 when every input at L was seen in training",
    "near@L: that distance's mean over the trained distances d < T alone, at the last query of length L "
    "(`audit/novelty_near@L`): 0 for an input of d alone, where only new distances can be novel; above 0 "
    "when the distances training saw read new inputs past T (the FIRE input's growing normaliser)",
    "entropy@T, entropy@L: attention entropy, nats, mean over layers and heads (`audit/entropy@N`)",
    "distance@T, distance@L: mean attended distance, tokens, mean over layers and heads (`audit/distance@N`)",
    "flat vs broken: for a row whose runs disagree, the mean of each number over its flat runs and over its "
    "broken runs",
)


def audited(run: RunRecord) -> bool:
    return bool(key_lengths(run.metrics, "entropy"))


def audit_section(study: str, rows: Sequence[Row]) -> list[str]:
    """The study's audit-by-verdict tables, or nothing when no run of it carries the audit."""
    counts = [c for c in map(flat_count, rows) if c is not None and any(audited(r) for r in c.row.runs)]
    if not counts:
        return []
    train_len, longest = counts[0].train_len, max(c.lengths[-1] for c in counts)
    headers = [column.header(train_len, longest) for column in COLUMNS]
    body = [line for count in counts for line in _run_lines(count, longest)]
    header = ["encoding, swept values", "seed", "flat", "ratio", f"ppl@{train_len}", f"ppl@{longest}"]
    lines = [f"### Extrapolation audit by verdict (study {study})", ""]
    lines += [*markdown_table([*header, *headers], body), ""]
    split = [c for c in counts if c.disagree]
    if split:
        summary = [line for count in split for line in _verdict_means(count, longest)]
        lines += ["Flat vs broken runs of the rows whose runs disagree (means):", ""]
        lines += [*markdown_table(["encoding, swept values", "runs", "n", *headers], summary), ""]
    return [*lines, "Legend:", "", *(f"- {item}" for item in LEGEND), ""]


def _value(run: RunRecord, key: str, fmt: str) -> str:
    return format(run.metrics[key], fmt) if key in run.metrics else MISSING


def _run_lines(count: FlatCount, longest: int) -> list[list[str]]:
    t = count.train_len
    ppl = [metric_key("ppl", t), metric_key("ppl", longest)]
    return [
        [
            count.row.label,
            "?" if run.seed is None else str(run.seed),
            *verdict_cells(count, run),
            *(_value(run, key, ".2f") for key in ppl),
            *(_value(run, c.key(t, longest), c.fmt) for c in COLUMNS),
        ]
        for run in seeds_in_order(count.row)
        if audited(run)
    ]


def _verdict_means(count: FlatCount, longest: int) -> list[list[str]]:
    """Two lines, the flat runs' means and the broken runs' means of each audit number."""
    lines = []
    for verdict, name in ((True, "flat"), (False, "broken")):
        runs = [r for r in count.row.runs if count.flat.get(r.name) is verdict and audited(r)]
        cells = []
        for column in COLUMNS:
            key = column.key(count.train_len, longest)
            values = [r.metrics[key] for r in runs if key in r.metrics]
            cells.append(format(sum(values) / len(values), column.fmt) if values else MISSING)
        lines.append([count.row.label, name, str(len(runs)), *cells])
    return lines
