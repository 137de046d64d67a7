"""The study's claims tested once: every claims file's claims, over every run of the study, one verdict each.

`claim_verdicts` pools the finished runs of every report folder of a study (a run copied into two folders is
one run: the same name, the same per-window losses), builds each claim's two rows from its selectors,
compares them as `posab.report.stats` does (the design, its interval and its test, one-sided in the stated
direction), and adjusts within each declared family by its procedure (`claims.PROCEDURES`: Holm's
step-down, or a fixed sequence). `posab claims STUDY_DIR` writes the result, `claims/verdicts.csv`, and the
generated readings (`claims_section`); `posab report --claims claims/verdicts.csv` gives each claimed
comparison of a report that verdict, so a comparison has one verdict wherever it is reported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from posab.report.matching import run_key
from posab.report.records import ReportError, RunRecord
from posab.report.runs_csv import load_csv
from posab.report.stats import ORDERED, SUGGESTIVE, compare_one, verdict
from posab.studies.claims import POST_HOC, Claim, claim_rows, family_adjusted

VERDICT_COLUMNS = (
    "claim",
    "family",
    "status",
    "statement",
    "row",
    "reference",
    "metric",
    "length",
    "corpus",
    "direction",
    "design",
    "test",
    "unmatched",
    "comparison",
    "seeds_row",
    "seeds_reference",
    "difference",
    "low",
    "high",
    "p_claim",  # the design's test, one-sided in the claim's direction
    "procedure",  # the family's adjustment (`claims.PROCEDURES`): holm or fixed-sequence
    "p_holm",  # the family-adjusted p under its declared procedure (named for Holm, its default)
    "verdict",
    "registered",
)


def study_pool(study_dir: Path) -> list[RunRecord]:
    """The finished runs of every report folder under `study_dir` (`*/runs.csv`), each once (`run_key`): a
    run found in two folders must have the same per-window losses there, or it is an error naming it."""
    pool: dict[str, RunRecord] = {}
    for path in sorted(study_dir.glob("*/runs.csv")):
        for run in load_csv(path):
            seen = pool.setdefault(run_key(run), run)
            if seen is not run and seen.windows != run.windows:
                raise ReportError(f"run {run.name} differs between two folders of {study_dir} (its windows)")
    return [r for r in pool.values() if r.finished]


def claim_verdicts(claims: Sequence[Claim], pool: Sequence[RunRecord]) -> pd.DataFrame:
    """One line per claim (VERDICT_COLUMNS): its comparison over the pool's runs, its one-sided p, that p
    adjusted within its family by the family's procedure, and its verdict (`claim_verdict`)."""
    lines = [_claim_line(claim, pool) for claim in claims]
    frame = pd.DataFrame(lines)
    frame["p_holm"] = family_adjusted(frame)
    frame["verdict"] = [claim_verdict(line) for _, line in frame.iterrows()]
    return frame[list(VERDICT_COLUMNS)]


def _claim_line(claim: Claim, pool: Sequence[RunRecord]) -> dict[str, Any]:
    arm, reference = claim_rows(claim, pool)
    line = compare_one(arm, reference, claim.metric, claim.length, claim.corpus, claim.direction)
    return {
        **line,
        "claim": claim.id,
        "family": claim.family,
        "status": claim.status,
        "statement": claim.statement,
        "direction": claim.direction,
        "procedure": claim.procedure,
        "registered": claim.registered,
    }


def claim_verdict(line: Mapping[str, Any]) -> str:
    """`verdict` on the claimed side (`direction`), capped at SUGGESTIVE for a POST_HOC claim. An interval
    marked `unstable` excludes 0 on neither side; a line without the mark (the task suite's) is stable."""
    stable = not line.get("unstable", False)
    below, above = stable and line["high"] < 0, stable and line["low"] > 0
    claimed, other = (below, above) if line["direction"] == "less" else (above, below)
    found = verdict(claimed, other, float(line["p_holm"]))
    return SUGGESTIVE if found == ORDERED and line["status"] == POST_HOC else found
