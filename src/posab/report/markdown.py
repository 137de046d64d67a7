"""Markdown tables of the report: a study's table of mean ± std cells with its legend, and plain tables."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
from tabulate import DataRow, TableFormat

from posab.report.columns import study_columns
from posab.report.grouping import Row
from posab.report.stats import aggregate

MISSING = "—"
PARAMS_KEY = "params/total"


def _separator(widths: Sequence[int], aligns: Sequence[str]) -> str:
    return "| " + " | ".join("---" for _ in widths) + " |"


# Pipe tables with one space around each cell and no padding to the column width: the rows stay short
# and a diff of two reports shows the cells that changed.
COMPACT_PIPES = TableFormat(
    lineabove=None,
    linebelowheader=_separator,
    linebetweenrows=None,
    linebelow=None,
    headerrow=DataRow("|", "|", "|"),
    datarow=DataRow("|", "|", "|"),
    padding=1,
    with_header_hide=None,
)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The lines of a Markdown table of these cells, shown as given (`|` escaped)."""
    frame = pd.DataFrame([[_escaped(c) for c in row] for row in rows], columns=[_escaped(h) for h in header])
    text = frame.to_markdown(
        index=False, tablefmt=COMPACT_PIPES, stralign=None, numalign=None, disable_numparse=True
    )
    return text.splitlines()


def _escaped(cell: str) -> str:
    return cell.replace("|", "\\|")


def mean_std(mean: float, std: float, count: int, fmt: str, n: int) -> str:
    """`mean ± std` (no ± for one value), `(n=k)` when only k of the row's n runs had it; MISSING for none."""
    if count == 0:
        return MISSING
    text = f"{mean:{fmt}}"
    if count >= 2:
        text += f" ± {std:{fmt}}"
    return text + (f" (n={count})" if count < n else "")


def _cell(statistics: pd.Series, fmt: str, n: int) -> str:
    """One table cell from a key's TABLE_STATISTICS over a row of n runs."""
    return mean_std(statistics["mean"], statistics["std"], int(statistics["count"]), fmt, n)


def study_table(rows: Sequence[Row]) -> list[str]:
    """The Markdown table of one study and its legend."""
    columns = study_columns(rows)
    summary = aggregate({row.label: row for row in rows}, [PARAMS_KEY, *(c.key for c in columns)])
    body = []
    for row in rows:
        cells = summary.loc[row.label]
        params = cells[(PARAMS_KEY, "mean")]
        body.append(
            [
                row.label,
                str(len(row.runs)),
                MISSING if math.isnan(params) else f"{params:,.0f}",
                *(_cell(cells[c.key], c.fmt, len(row.runs)) for c in columns),
            ]
        )
    header = ["encoding, swept values", "seeds n", "params", *(c.header for c in columns)]
    legend = [
        "encoding, swept values: the encoding and the config values (other than the seed) that differ "
        "between its finished runs in this study, or that are fixed per encoding but not the same for all",
        "seeds n: finished runs in the row (one per seed); every later cell is mean ± sample std "
        "(ddof=1) over them, ± left out when n = 1, `(n=k)` when only k runs have the value, "
        f"{MISSING} when none has",
        "params: total parameter count (mean over the runs; `params.total`)",
        *(f"{c.header}: {c.legend}" for c in columns),
    ]
    return [*markdown_table(header, body), "", "Legend:", "", *(f"- {item}" for item in legend)]
