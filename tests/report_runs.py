"""Finished runs as the report reads them, built in memory for the report's tests."""

from __future__ import annotations

from typing import Any

from posab.report.records import RUN_INFO_KEYS, RunRecord

RUN_INFO = dict.fromkeys(RUN_INFO_KEYS, "")


def finished_run(
    name: str,
    encoding: str,
    seed: int,
    study: str,
    config: dict[str, str] | None = None,
    metrics: dict[str, float] | None = None,
    **fields: Any,
) -> RunRecord:
    """A finished run with empty provenance; `config` is added to the seed; `fields`: any other
    RunRecord field (val_curve, windows, window_starts, ...)."""
    return RunRecord(
        name=name,
        status="finished",
        error="",
        encoding=encoding,
        seed=seed,
        study=study,
        info=dict(RUN_INFO),
        config={"seed": str(seed), **(config or {})},
        metrics=metrics or {},
        series={},
        **fields,
    )
