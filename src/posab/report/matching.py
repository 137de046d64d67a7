"""Matched or marked: what differs between the runs of a comparison besides the rows' settings, and the one
name a comparison has in every report.

A difference between two rows is the encoding (or arm) only if their runs also agree on what the study does
not vary on purpose: the precision they trained in, the CPU model and torch's kernel set they ran on, and the
commit they started from. `unmatched` names each of those that differs (for paired designs, within some pair
of runs; otherwise between the two rows' sets of runs), with `?` where a run did not record it (runs made
before provenance recorded the CPU model or the kernel set). It marks; it does not judge: two commits may
hold the same model code, and the report's reading says where that matters.

`comparison_id` names a comparison by the runs it compares, its metric, length and corpus, so that the
same comparison, copied into two report folders under two row labels, is found to be one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from posab.report.records import RunRecord

UNKNOWN = "?"  # suffix of a factor some run did not record


def cpu_of(run: RunRecord) -> str:
    """The CPU model in the run's `machine` line (`platform, arch, MODEL, N CPUs, torch X`); "" where the
    line has none (runs made before it was recorded)."""
    parts = [p.strip() for p in run.info.get("machine", "").split(",")]
    return parts[2] if len(parts) >= 5 else ""


def commit_of(run: RunRecord) -> str:
    """The commit the run's training started from (`git_commit_start`, else `git_commit`)."""
    return run.info.get("git_commit_start") or run.info.get("git_commit", "")


FACTORS: dict[str, Callable[[RunRecord], str]] = {  # name -> the run's value ("" unknown)
    "precision": lambda run: run.info.get("precision", ""),
    "cpu": cpu_of,
    "kernels": lambda run: run.info.get("cpu_capability", ""),
    "commit": commit_of,
}


def unmatched(arm: Sequence[RunRecord], reference: Sequence[RunRecord], paired: bool) -> str:
    """The FACTORS that differ between the compared runs, comma-separated ("" when all match): `paired`, run
    i of `arm` against run i of `reference`; otherwise the set of the arm's values against the reference's.
    A factor that no known values separate but that some run lacks is `NAME?`."""
    marks = []
    for name, value_of in FACTORS.items():
        arm_values = [value_of(r) for r in arm]
        reference_values = [value_of(r) for r in reference]
        if _differs(arm_values, reference_values, paired):
            marks.append(name)
        elif "" in arm_values + reference_values:
            marks.append(name + UNKNOWN)
    return ", ".join(marks)


def _differs(arm: Sequence[str], reference: Sequence[str], paired: bool) -> bool:
    if paired:
        return any(a and b and a != b for a, b in zip(arm, reference, strict=True))
    known_arm, known_reference = {v for v in arm if v}, {v for v in reference if v}
    return bool(known_arm and known_reference and known_arm != known_reference)


def run_key(run: RunRecord) -> str:
    """A run's name with its training and validation loss: the same run in every folder that holds it, and
    two runs apart where two sweeps gave their jobs one directory name."""
    return f"{run.name}@{run.metrics.get('train_loss')!r}/{run.metrics.get('val_loss')!r}"


def comparison_id(
    arm: Sequence[RunRecord], reference: Sequence[RunRecord], metric: str, length: int, corpus: str
) -> str:
    """Twelve hex digits naming the comparison: the runs of each side (`run_key`), metric, length and
    corpus, whatever order a folder lists the runs in."""
    names = [",".join(sorted(run_key(r) for r in side)) for side in (arm, reference)]
    text = "|".join([*names, metric, str(length), corpus])
    return hashlib.sha256(text.encode()).hexdigest()[:12]
