"""A study's claim verdicts as a report takes them: `posab claims` (`posab.studies.verdicts`) writes
claims/verdicts.csv, and `posab report --claims` gives each comparison a claim names that claim's family,
adjusted p and verdict, so a comparison has one verdict wherever it is reported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from posab.report.records import ReportError

CLAIMED_FIELDS = ("family", "claim", "p_holm", "verdict")  # what a report takes from a claim's line


def read_verdicts(path: Path) -> dict[str, dict[str, Any]]:
    """A verdicts.csv as `paired_differences` takes it: comparison id -> CLAIMED_FIELDS."""
    try:
        frame = pd.read_csv(path, dtype={"comparison": str}, keep_default_na=False)
    except (OSError, ValueError) as err:
        raise ReportError(f"verdicts file {path}: unreadable ({err}); `posab claims` writes it") from err
    return {
        line["comparison"]: {**{k: line[k] for k in CLAIMED_FIELDS}, "p_holm": float(line["p_holm"])}
        for line in frame.to_dict("records")
    }
