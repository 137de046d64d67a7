"""What an evaluation returns: scalars, data, tables, curves and figures as objects (no file names).

The run writes them (results.json, `<name>.csv`, `<name>.png`), the loggers log whatever they are given
(`Logger.log_evaluation`), and the report reads the `Column`s each evaluator declares. Needs no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from posab.keys import CORPUS_SEPARATOR


@dataclass(frozen=True)
class Column:
    """One metric column of a report table: the results key behind it and how its cells are formatted."""

    header: str
    key: str
    fmt: str  # format spec of the mean and the std
    legend: str


@dataclass
class Table:
    """Rows of values under named columns (a W&B table, a CSV file)."""

    columns: list[str]
    rows: list[list[Any]]


@dataclass
class Curves:
    """Line plots of y against x, one line per named series (a W&B line plot)."""

    title: str
    xname: str
    series: dict[str, tuple[list[float], list[float]]]  # name -> (xs, ys)


@dataclass
class EvalOutput:
    """The output of one or more evaluators.

    scalars: slash keys (`ppl/2048`, `needle/acc@4096`) -> numbers: results.json, metrics.jsonl, W&B summary.
    data: curves and grids as JSON values (`position_loss/512`, `needle/grid`): results.json.
    tables, curves, figures: by name, unique within the output.
    arrays: by name, named numeric arrays too large for JSON (per-window losses): the run writes each as
    `<name>.npz`, for reports that pair runs window by window.
    """

    scalars: dict[str, float] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, Table] = field(default_factory=dict)
    curves: dict[str, Curves] = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)
    arrays: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    @property
    def results(self) -> dict[str, Any]:
        """Scalars and data in one dict, as results.json keeps them under `eval`."""
        return {**self.scalars, **self.data}

    def update(self, other: EvalOutput) -> None:
        """Add another output's items; a name both outputs use is an error, not a silent overwrite."""
        for mine, theirs in (
            (self.scalars, other.scalars),
            (self.data, other.data),
            (self.tables, other.tables),
            (self.curves, other.curves),
            (self.figures, other.figures),
            (self.arrays, other.arrays),
        ):
            clashes = sorted(set(mine) & set(theirs))
            if clashes:
                raise ValueError(f"evaluation outputs clash on {clashes}")
            mine.update(theirs)


def for_corpus(output: EvalOutput, corpus: str) -> EvalOutput:
    """The output of evaluators run on the evaluation corpus `corpus`: every scalar, data and array key
    prefixed `corpus:` (`wikitext2:ppl/512`), every table, curve, figure and array set named `corpus.NAME`
    (the files `wikitext2.perplexity.csv`, `wikitext2.perplexity_windows.npz`)."""

    def keyed(values: dict[str, Any]) -> dict[str, Any]:
        return {f"{corpus}{CORPUS_SEPARATOR}{k}": v for k, v in values.items()}

    def named(values: dict[str, Any]) -> dict[str, Any]:
        return {f"{corpus}.{k}": v for k, v in values.items()}

    curves = {k: Curves(f"{c.title} ({corpus})", c.xname, c.series) for k, c in output.curves.items()}
    return EvalOutput(
        scalars=keyed(output.scalars),
        data=keyed(output.data),
        tables=named(output.tables),
        curves=named(curves),
        figures=named(output.figures),
        arrays=named({name: keyed(arrays) for name, arrays in output.arrays.items()}),
    )
