"""A stated family of claims: the comparisons a study's reading rests on, corrected among themselves.

Holm's correction over every row compared with a reference (nine or more comparisons in the main grid) asks
more of each comparison than the few a reading actually claims need: at 5 vs 5 seeds the smallest exact
permutation p is 2 / 252 = 0.0079, and 0.0079 x 9 > 0.05, so no ordering could ever pass. A claims file
names the comparisons a study's reading tests (written before the runs that decide them, e.g. before a
new seed), and the report corrects them as one family of their own (Holm 1979 within it; Bender & Lange
2001, "Adjusting for multiple testing -- when and how?", on a confirmatory family of stated hypotheses);
every other comparison stays in its exploratory family (one reference, metric, length and corpus).

The file is CSV with the header `row,reference,metric,length` and, optionally, `corpus` (empty or absent:
`eval.split`) and `study` (empty or absent: any study); rows and references are row labels as report.md
heads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from posab.report.records import ReportError

CLAIMS_FAMILY = "claims"  # the `family` of every comparison a claims file names
REQUIRED = ("row", "reference", "metric", "length")
OPTIONAL = ("corpus", "study")


@dataclass(frozen=True)
class Claim:
    """One stated comparison: `row` against `reference` in `metric` at `length` on `corpus`."""

    row: str
    reference: str
    metric: str
    length: int
    corpus: str = ""  # "": the runs' eval.split
    study: str = ""  # "": whichever study has the comparison


def read_claims(path: Path, metrics: Sequence[str]) -> list[Claim]:
    """The claims of a CSV file; an unreadable file, a missing column, a metric not in `metrics` or a length
    that is not a positive integer is an error naming the line and what would be valid."""
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, ValueError) as err:
        raise ReportError(f"claims file {path}: unreadable ({err})") from err
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise ReportError(
            f"claims file {path}: no column {missing}; columns: {', '.join(REQUIRED + OPTIONAL)}"
        )
    claims = [_claim(path, number, line) for number, line in enumerate(frame.to_dict("records"), start=2)]
    _check_metrics(claims, metrics)
    return claims


def _claim(path: Path, number: int, line: dict[str, str]) -> Claim:
    where = f"claims file {path}, line {number}"
    if not line["length"].isdigit() or int(line["length"]) == 0:
        raise ReportError(f"{where}: length {line['length']!r} is not a positive integer (e.g. 512)")
    return Claim(
        line["row"],
        line["reference"],
        line["metric"],
        int(line["length"]),
        *(line.get(c, "") for c in OPTIONAL),
    )


def _check_metrics(claims: Sequence[Claim], metrics: Sequence[str]) -> None:
    for claim in claims:
        if claim.metric not in metrics:
            raise ReportError(
                f"claim {describe(claim)}: metric {claim.metric!r}; metrics: {', '.join(metrics)}"
            )


def describe(claim: Claim) -> str:
    """`multiscale vs alibi, loss/512` (on CORPUS, in study S where given)."""
    text = f"`{claim.row}` vs `{claim.reference}`, {claim.metric}/{claim.length}"
    return (
        text
        + (f" on {claim.corpus}" if claim.corpus else "")
        + (f" in study {claim.study}" if claim.study else "")
    )


def claim_mask(frame: pd.DataFrame, claims: Sequence[Claim]) -> pd.Series:
    """Which comparisons of `frame` (paired-difference lines) a claim names; a claim that names none is an
    error listing the rows and references the frame has."""
    mask = pd.Series(False, index=frame.index)
    for claim in claims:
        hit = (
            (frame["row"] == claim.row)
            & (frame["reference"] == claim.reference)
            & (frame["metric"] == claim.metric)
            & (frame["length"] == claim.length)
            & (frame["corpus"] == claim.corpus)
        )
        if claim.study:
            hit &= frame["study"] == claim.study
        if not hit.any():
            rows = sorted(set(frame["row"]))
            references = sorted(set(frame["reference"]))
            raise ReportError(
                f"claim {describe(claim)} names no comparison of this report; rows: {rows}; "
                f"references: {references}"
            )
        mask |= hit
    return mask
