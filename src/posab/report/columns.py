"""The metric catalog of a study's table: the run's own columns, then each evaluator's (`posab.catalog`,
torch-free), so that adding an evaluator adds its columns without touching the report."""

from __future__ import annotations

from collections.abc import Sequence

from posab.catalog import evaluator_columns
from posab.outputs import Column
from posab.report.grouping import Row

RUN_COLUMNS = (
    Column("tokens/s", "tokens_per_s", ".0f", "training throughput, tokens per second (`tokens_per_s`)"),
    Column(
        "wall s",
        "wall_time_s",
        ".0f",
        "wall time of the whole job in seconds: start-up, training and evaluations (`wall_time_s`; "
        "of the last attempt only for a resumed run)",
    ),
    Column(
        "val loss",
        "val_loss",
        ".3f",
        "final validation loss, nats/token, on `train.val_windows` windows of `train.seq_len` tokens "
        "after the last step (`val_loss`)",
    ),
)


def study_columns(rows: Sequence[Row]) -> list[Column]:
    """The columns of one study's table: the run's own, then those each evaluator declares for the keys
    the study's runs have (`posab.catalog`), in the evaluators' order."""
    keys = {k for row in rows for r in row.runs for k in r.metrics}
    return [*RUN_COLUMNS, *evaluator_columns(keys)]
