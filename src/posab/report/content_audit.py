"""The extrapolation audit of position that depends on the content (issue 43): for the runs whose attention
forms report it (`Form.content_statistics`: FoX's forget gates, CoPE's position counts), each run's flat
verdict beside what its gates or counts do at the training length T and at the longest length L, so that a
break can be read against them (CoPE: how many pairs read a table row training barely reached) and a flat
run against its decay (FoX: how far the slowest head reaches).
"""

from __future__ import annotations

from collections.abc import Sequence

from posab.content_statistics import CONTENT_TABLES, ContentColumn, ContentTable
from posab.keys import key_lengths, metric_key
from posab.report.flat import FlatCount, flat_count, seeds_in_order, verdict_cells
from posab.report.grouping import Row
from posab.report.markdown import MISSING, markdown_table
from posab.report.records import RunRecord


def content_audit_section(study: str, rows: Sequence[Row]) -> list[str]:
    """One table per kind of content statistic that some audited run of the study reports; none without."""
    counts = [c for c in map(flat_count, rows) if c is not None]
    lines: list[str] = []
    for table in CONTENT_TABLES:
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
            *(cell(column, run, train_len, longest) for column in table.columns),
        ]
        for count in counts
        for run in seeds_in_order(count.row)
        if _reports(run, table)
    ]
    lines = [f"### Extrapolation audit: {table.title} (study {study})", ""]
    lines += [*markdown_table(["encoding, swept values", "seed", "flat", "ratio", *headers], body), ""]
    return [*lines, "Legend:", "", *(f"- {item}" for item in table.legend), ""]


def cell(column: ContentColumn, run: RunRecord, train_len: int, longest: int) -> str:
    """The run's number in `column`: the statistic's mean at T or L, or its largest head there."""
    key = metric_key(column.statistic, train_len if column.at_train else longest)
    if not column.largest_head:
        return format(run.metrics[key], column.fmt) if key in run.metrics else MISSING
    heads = [v for k, v in run.metrics.items() if k.startswith(f"{key}/layer")]
    return format(max(heads), column.fmt) if heads else MISSING
