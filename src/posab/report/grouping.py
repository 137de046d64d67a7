"""Rows of the report: the finished runs of a study grouped by encoding and swept values, one run per seed.

A swept value is a config key whose value differs between the finished runs of the study (for
`encoding.*` hyper-parameters: between finished runs of the same encoding), except the seed and keys that
do not change the experiment (`IGNORED_KEYS`). A RoPE run evaluated with scalings also gives one row per
scaling (`rope + pi`). A label names an algorithmic task (`data.task.name=copy`) and leaves out the
lengths the task's config sets, unless one task ran at several (`set_by_task`).

The resolved precision is part of a run's identity: `train.precision: auto` resolves to bf16 on a CPU with
AVX-512 bf16 and to fp32 elsewhere, so a study continued on another machine may hold both. Runs of
different precisions never share a row, and in a study that has more than one each label says which
(`alibi, precision=fp32`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from posab.errors import ConfigError
from posab.paths import encoding_names, encoding_options
from posab.report.records import ReportError, RunRecord, natural_key
from posab.report.scaling import UNSCALED, scaled_view, scaling_kinds

# Config keys (and key prefixes) that never make a row of their own: the seed, the study itself, where
# files live, logging and progress settings, and Hydra's own keys.
IGNORED_KEYS = (
    "seed",
    "experiment",
    "threads",
    "hydra",
    "logger",
    "run_dir",
    "encoding.name",
    "encoding._target_",
    "data.path",
    "data.cache_dir",
    "data.hub_local_dir",
    "data.progress",
    "train.progress",
    "eval.progress",
    "passkey.progress",
    "eval.corpora",  # further corpora scored beside eval.split: their own keys, never the split's numbers
)
# Switches of measurements made after training: they never change the language model nor its perplexity and
# shift numbers (those measure the model before the passkey stage, results.json's `eval_source`), and a run
# with one off has no needle numbers (— in its row). So they make no label, but one row never mixes values.
MEASUREMENT_SWITCHES = ("passkey.enabled", "eval.needle.enabled")
# An algorithmic task's name, and the keys its config sets (conf/task/*.yaml; train.seq_len interpolates
# data.task.seq_len): a label names the task, and those keys only where one task ran with several values.
TASK_NAME, TASK_KEYS = "data.task.name", ("data.task.", "train.seq_len")
PRECISION = "precision"  # the RunRecord.info key of the precision the run resolved (bf16, fp32)


@dataclass
class Row:
    """The finished runs of one study that share an encoding and every swept value (one per seed)."""

    study: str
    label: str  # e.g. "multiscale, data.anchors=false", "rope + pi"
    encoding: str
    scaling: str  # the evaluation-time RoPE scaling of this view of the runs; "" for their own numbers
    runs: list[RunRecord]

    @property
    def variant(self) -> str:
        """The label without the encoding: swept values, scaling ("data.anchors=false", "pi"; "" for none)."""
        return self.label.removeprefix(self.encoding).lstrip(", +")


def _ignored(key: str) -> bool:
    return key in MEASUREMENT_SWITCHES or any(key == k or key.startswith(k + ".") for k in IGNORED_KEYS)


@cache
def shared_encoding_options() -> frozenset[str]:
    """`encoding.*` keys every encoding's yaml sets (lr_mult, weight_decay): the same setting for all of
    them, so compared across encodings like any other key, not only between runs of one encoding. None
    away from the checkout (a report rendered from runs.csv, whose config columns are already chosen)."""
    try:
        names = encoding_names()
    except ConfigError:
        return frozenset()
    options = [set(encoding_options(name)) for name in names]
    return frozenset(f"encoding.{k}" for k in set.intersection(*options)) if options else frozenset()


def swept_keys(runs: Sequence[RunRecord]) -> list[str]:
    """Config keys that differ between these runs (an option of some encodings only, `encoding.*`:
    between runs of the same encoding).

    A key only some runs have (a setting added to the schema after the others ran) is compared among the
    runs that have it."""
    shared = shared_encoding_options()

    def scope(run: RunRecord, key: str) -> str:
        return run.encoding if key.startswith("encoding.") and key not in shared else ""

    def differs(key: str) -> bool:
        having = [r for r in runs if key in r.config]
        return len({(scope(r, key), r.config[key]) for r in having}) > len({scope(r, key) for r in having})

    keys = sorted({k for r in runs for k in r.config if not _ignored(k)}, key=natural_key)
    return [k for k in keys if differs(k)]


def label_keys(runs: Sequence[RunRecord], keys: Sequence[str]) -> dict[str, list[str]]:
    """Per encoding, the swept keys its row labels show: those that vary among its runs, and those that
    are constant for every encoding but not the same for all of them (a confounded setting stays visible).
    A key swept for some encodings only (data.anchors for two of them) stays out of the others' labels."""
    values: dict[str, dict[str, set[str]]] = {k: {} for k in keys}  # key -> encoding -> its values
    for run in runs:
        for key in keys:
            if key in run.config:
                values[key].setdefault(run.encoding, set()).add(run.config[key])
    shown: dict[str, list[str]] = {}
    for encoding in {r.encoding for r in runs}:
        for key in keys:
            per_encoding = values[key]
            constants = {next(iter(v)) for v in per_encoding.values() if len(v) == 1}
            if encoding in per_encoding and (len(per_encoding[encoding]) > 1 or len(constants) > 1):
                shown.setdefault(encoding, []).append(key)
    named = set_by_task(runs, keys)
    return {e: [k for k in mine if k not in named or TASK_NAME not in mine] for e, mine in shown.items()}


def set_by_task(runs: Sequence[RunRecord], keys: Sequence[str]) -> set[str]:
    """The swept keys a task's config sets (TASK_KEYS) that take one value per task name in these runs:
    "copy" says its lengths, so a label that names the task leaves them out."""
    per_task: dict[str, set[tuple[str, str]]] = {}
    for run in runs:
        for key in keys:
            if key != TASK_NAME and key.startswith(TASK_KEYS) and key in run.config:
                per_task.setdefault(key, set()).add((run.config.get(TASK_NAME, ""), run.config[key]))
    return {key for key, pairs in per_task.items() if len(pairs) == len({task for task, _ in pairs})}


def run_label(run: RunRecord, keys: Sequence[str], precision: bool = False) -> str:
    """The encoding and the run's value of each of `keys` it has: "multiscale, data.anchors=false"; with
    `precision`, its resolved precision last ("alibi, precision=fp32")."""
    parts = [run.encoding, *(f"{k}={run.config[k]}" for k in keys if k in run.config)]
    return ", ".join([*parts, *([f"{PRECISION}={precision_of(run)}"] if precision else [])])


def precision_of(run: RunRecord) -> str:
    """The precision the run resolved, "unknown" where it recorded none."""
    return run.info.get(PRECISION) or "unknown"


def mixed_precision(runs: Sequence[RunRecord]) -> set[str]:
    """The studies whose finished runs ran at more than one precision: their labels name it."""
    precisions: dict[str, set[str]] = {}
    for run in runs:
        if run.finished:
            precisions.setdefault(run.study, set()).add(precision_of(run))
    return {study for study, found in precisions.items() if len(found) > 1}


def study_keys(runs: Sequence[RunRecord]) -> dict[str, list[str]]:
    """Swept keys per study, from its finished runs."""
    studies = sorted({r.study for r in runs}, key=natural_key)
    return {s: swept_keys([r for r in runs if r.study == s and r.finished]) for s in studies}


def group_rows(runs: Sequence[RunRecord]) -> dict[str, list[Row]]:
    """Finished runs per study, grouped into rows by encoding and swept values, rows sorted by label.

    A RoPE run evaluated with scalings also gives one row per scaling (`rope + pi`, ...); runs of different
    precisions are in different rows."""
    table: dict[str, list[Row]] = {}
    mixed = mixed_precision(runs)
    for study, keys in study_keys(runs).items():
        rows: dict[str, Row] = {}
        finished = [r for r in runs if r.study == study and r.finished]
        shown = label_keys(finished, keys)
        for run in finished:
            label = run_label(run, shown.get(run.encoding, []), study in mixed)
            views = [("", label, scaled_view(run, UNSCALED))]
            views += [(kind, f"{label} + {kind}", scaled_view(run, kind)) for kind in scaling_kinds(run)]
            for kind, name, view in views:
                rows.setdefault(name, Row(study, name, run.encoding, kind, [])).runs.append(view)
        for row in rows.values():
            _refuse_mixed_switches(row)
        if rows:
            table[study] = [rows[k] for k in sorted(rows, key=natural_key)]
    return table


def _refuse_mixed_switches(row: Row) -> None:
    """A ReportError naming the row and switch when the runs of it that measured the needle differ in a
    MEASUREMENT_SWITCHES value. A run with `eval.needle.enabled=false` has no needle numbers to average
    with another model's: it joins the row with its language-model numbers alone (a grid's later seeds run
    without the passkey stage; their needle cells then show `(n=k)`)."""
    measured = [r for r in row.runs if r.config.get("eval.needle.enabled") != "false"]
    for key in MEASUREMENT_SWITCHES:
        values = sorted({r.config[key] for r in measured if key in r.config})
        if len(values) > 1:
            raise ReportError(
                f"row {row.label!r} of study {row.study!r} mixes runs with {key}={' and '.join(values)}: "
                "their needle numbers measure different models; report them in separate folders"
            )
