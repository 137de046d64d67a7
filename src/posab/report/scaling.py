"""RoPE runs evaluated with evaluation-time scalings (`ppl@pi/4096`), seen as if unscaled, one view each."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from posab.report.records import RunRecord

SCALED = re.compile(r"(?:loss|ppl|position_loss)@(\w+)/\d+")
UNSCALED = "none"  # the view of the run's own, unscaled numbers


def scaled_view(run: RunRecord, kind: str) -> RunRecord:
    """The run seen through evaluation-time RoPE scaling `kind`: `ppl@kind/L` read as `ppl/L` (and loss,
    position_loss) where it exists; lengths within the training length keep the unscaled values."""

    def renamed(values: dict[str, Any]) -> dict[str, Any]:
        plain = {k: v for k, v in values.items() if not SCALED.fullmatch(k)}
        scaled = {
            k.replace(f"@{kind}/", "/"): v
            for k, v in values.items()
            if SCALED.fullmatch(k) and f"@{kind}/" in k
        }
        return {**plain, **scaled}

    return replace(run, metrics=renamed(run.metrics), series=renamed(run.series))


def scaling_kinds(run: RunRecord) -> list[str]:
    """The RoPE scalings a run was evaluated with (`ppl@pi/4096` -> pi), in order of appearance."""
    keys = [*run.metrics, *run.series]
    return list(dict.fromkeys(m.group(1) for k in keys if (m := SCALED.fullmatch(k))))
