"""The extrapolation audit of position that depends on the content (issue 43): for the runs whose attention
forms report it (`Form.content_statistics`: FoX's forget gates, CoPE's position counts), each run's flat
verdict beside what its gates or counts do at the training length T and at the longest length L, so that a
break can be read against them (CoPE: how many pairs read a table row training barely reached) and a flat
run against its decay (FoX: how far the slowest head reaches).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from posab.keys import key_lengths, metric_key
from posab.report.flat import FlatCount, flat_count, seeds_in_order, verdict_cells
from posab.report.grouping import Row
from posab.report.markdown import MISSING, markdown_table
from posab.report.records import RunRecord


@dataclass(frozen=True)
class ContentColumn:
    """One number of a run: `statistic` at T or at L (`at_train`), its mean over layers and heads or its
    largest head (`largest_head`)."""

    statistic: str
    at_train: bool
    fmt: str
    largest_head: bool = False

    def header(self, train_len: int, longest: int) -> str:
        length = train_len if self.at_train else longest
        return f"{self.statistic}@{length}" + (" (largest head)" if self.largest_head else "")

    def cell(self, run: RunRecord, train_len: int, longest: int) -> str:
        key = metric_key(self.statistic, train_len if self.at_train else longest)
        if not self.largest_head:
            return format(run.metrics[key], self.fmt) if key in run.metrics else MISSING
        heads = [v for k, v in run.metrics.items() if k.startswith(f"{key}/layer")]
        return format(max(heads), self.fmt) if heads else MISSING


@dataclass(frozen=True)
class ContentTable:
    """The statistics of one kind of content-dependent position, one table."""

    title: str
    columns: tuple[ContentColumn, ...]
    legend: tuple[str, ...]


TABLES = (
    ContentTable(
        "forget gates (FoX)",
        (
            ContentColumn("gate_log", True, ".3f"),
            ContentColumn("gate_log", False, ".3f"),
            ContentColumn("gate_log", False, ".4f", largest_head=True),
            ContentColumn("gate_bias_far", False, ".0f"),
        ),
        (
            "gate_log@N: the mean log forget gate per token at length N, mean over layers and heads "
            "(`audit/gate_log@N`): the slope of the decay D_ij = c_i − c_j; a head at g reaches about "
            "1/|g| tokens before its bias falls by 1 nat",
            "gate_log (largest head): the slowest-decaying head's (layer, head): the model's longest reach",
            "gate_bias_far@L: the mean gate bias at the window's longest distance L − 1 "
            "(`audit/gate_bias_far@L`)",
        ),
    ),
    ContentTable(
        "position counts (CoPE)",
        (
            ContentColumn("cope_count_max", True, ".0f"),
            ContentColumn("cope_count_max", False, ".0f"),
            ContentColumn("cope_count_last", False, ".0f"),
            ContentColumn("cope_clamped", False, ".3f"),
            ContentColumn("cope_past_trained", False, ".3f"),
            ContentColumn("cope_past_trained", False, ".3f", largest_head=True),
        ),
        (
            "cope_count_max@N: the largest position count of a window of N, mean over layers and heads "
            "(`audit/cope_count_max@N`); cope_count_last@L: the count at the last query, mean over its keys",
            "cope_clamped@L: the share of pairs counted past npos − 1, which read the last table row "
            "(`audit/cope_clamped@L`)",
            "cope_past_trained@L: the share of pairs counted past each head's largest count at T: keys that "
            "read a table row training barely reached, mean over heads and for the largest head",
        ),
    ),
)


def content_audit_section(study: str, rows: Sequence[Row]) -> list[str]:
    """One table per kind of content statistic that some audited run of the study reports; none without."""
    counts = [c for c in map(flat_count, rows) if c is not None]
    lines: list[str] = []
    for table in TABLES:
        reporting = [c for c in counts if any(_reports(r, table) for r in c.row.runs)]
        if reporting:
            lines += _table_lines(study, table, reporting)
    return lines


def _reports(run: RunRecord, table: ContentTable) -> bool:
    return bool(key_lengths(run.metrics, table.columns[0].statistic))


def _table_lines(study: str, table: ContentTable, counts: Sequence[FlatCount]) -> list[str]:
    train_len, longest = counts[0].train_len, max(c.lengths[-1] for c in counts)
    headers = [column.header(train_len, longest) for column in table.columns]
    body = [
        [
            count.row.label,
            "?" if run.seed is None else str(run.seed),
            *verdict_cells(count, run),
            *(column.cell(run, train_len, longest) for column in table.columns),
        ]
        for count in counts
        for run in seeds_in_order(count.row)
        if _reports(run, table)
    ]
    lines = [f"### Extrapolation audit: {table.title} (study {study})", ""]
    lines += [*markdown_table(["encoding, swept values", "seed", "flat", "ratio", *headers], body), ""]
    return [*lines, "Legend:", "", *(f"- {item}" for item in table.legend), ""]
