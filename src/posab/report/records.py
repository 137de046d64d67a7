"""What the report knows of one run (`RunRecord`), the error it raises, and the names of its CSV columns."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posab.keys import Metrics

PROVENANCE_KEYS = (  # recorded by newer runs; empty in runs.csv files written before they were
    "git_dirty",  # uncommitted changes to tracked files at the end: true | false | null (no git)
    "git_commit_start",  # the commit the run started with (differs from git_commit after a resume)
    "git_dirty_start",
    "resumed_from_step",  # the step the last attempt resumed from; null: not resumed
    "cpu_capability",  # torch's CPU kernel set: DEFAULT, AVX2, AVX512, ...
    "math_isa",  # what sets MKL's and oneDNN's instruction sets (posab.provenance.math_isa)
    "versions",  # the installed dependencies: "torch=2.13.0+cpu numpy=2.1.3 ..."
    "started_at",  # when the run first started, UTC (`2026-12-06T07:01:02Z`; kept on resume)
    "claims_files_start",  # the claims files present at its start, `path:sha256[:12]` (posab.provenance)
    "git_untracked_start",  # untracked files under conf/, src/ and train.py at its start
)
# RunRecord.info's keys: where and how the run ran
RUN_INFO_KEYS = ("experiment", "overrides", "git_commit", "machine", "device", "precision", *PROVENANCE_KEYS)
INFO_COLUMNS = ("run", "study", "label", "status", "error", "encoding", "seed", *RUN_INFO_KEYS)
RUN_METRICS = ("tokens_per_s", "train_loss", "val_loss", "wall_time_s")  # top-level keys of results.json
SUMMARY_METRICS = (
    "params/total",
    "params/encoding",
    "params/non_embedding",
    *RUN_METRICS,
)
CONFIG_PREFIX = "config."
SERIES_PREFIX = "position_loss/"
VAL_CURVE_KEY = "val/loss"  # the metrics.jsonl key of the validation loss logged during training
VAL_CURVE_COLUMN = "val_loss_curve"  # its runs.csv column: [[step, loss], ...] as JSON
SEQ_LEN_KEY = "train.seq_len"
WINDOWS_FILE = "perplexity_windows.npz"  # a run's per-window mean losses (`loss/L`, ...) and `starts`
WINDOW_STARTS_KEY = "starts"  # the array of WINDOWS_FILE that holds the windows' start offsets
WINDOWS_PREFIX = "windows:"  # runs.csv: `windows:loss/512` holds that key's per-window losses as JSON
WINDOW_STARTS_COLUMN = "window_starts"  # runs.csv: the windows' start offsets as JSON
WINDOW_DOCUMENTS_KEY = "documents"  # the array of WINDOWS_FILE with each window's document (newer runs)
WINDOW_DOCUMENTS_COLUMN = "window_documents"  # runs.csv: each window's document as JSON
# An evaluation corpus NAME (`eval.corpora`) has its own windows: the file NAME.perplexity_windows.npz, whose
# arrays are keyed `NAME:loss/512`, `NAME:starts`, `NAME:documents`; runs.csv columns
# `windows:NAME:loss/512`, `NAME:window_starts`, `NAME:window_documents`.
STAGE_PREFIX = "passkey_stage/"  # the passkey stage's scalars (`passkey_stage/time_s`) and curves
STAGE_KEY_LOSS = STAGE_PREFIX + "key_loss"  # curve: (stage step, train/needle_loss) from metrics.jsonl
STAGE_PROBES = STAGE_PREFIX + "probes"  # curve: (stage step, greedy accuracy on the probe examples)
STAGE_LAST_START = STAGE_PREFIX + "last_length_start"  # scalar: the stage step its last length starts at
CURVE_PREFIX = "curve:"  # runs.csv: `curve:passkey_stage/key_loss` holds that curve as JSON [step, value]


class ReportError(Exception):
    """Nothing to report on, or inputs that cannot be combined; the message names the path."""


@dataclass(frozen=True)
class CorpusWindows:
    """Where the windows of one evaluation corpus (`eval.corpora`) lie: their starts and documents."""

    starts: list[int]
    documents: list[int]  # empty: not recorded


@dataclass
class RunRecord:
    """One run as the report sees it, read from its directory or from a runs.csv row."""

    name: str  # unique among the runs of a report; names the copied config
    status: str  # running | finished | failed
    error: str
    encoding: str
    seed: int | None
    study: str
    info: dict[str, str]  # RUN_INFO_KEYS: experiment, overrides, git_commit, ..., precision, git_dirty, ...
    config: dict[str, str]  # flattened config ("data.anchors" -> "false"); values as in YAML
    metrics: Metrics  # every scalar result: params/*, val_loss, ..., every scalar eval key (parsed once)
    series: dict[str, list[float]]  # position_loss/L: mean loss per position bin
    config_path: Path | None = None
    val_curve: list[tuple[int, float]] = field(default_factory=list)  # (step, val/loss) during training
    windows: dict[str, list[float]] = field(default_factory=dict)  # "loss/512" -> mean loss of each window
    window_starts: list[int] = field(default_factory=list)  # start offset of each of those windows
    window_documents: list[int] = field(default_factory=list)  # the document of each (most of its targets)
    # each evaluation corpus's windows (their losses are in `windows` as `NAME:loss/512`)
    corpus_windows: dict[str, CorpusWindows] = field(default_factory=dict)
    stage_curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # STAGE_KEY_LOSS, ...

    def __post_init__(self) -> None:
        if not isinstance(self.metrics, Metrics):  # a plain mapping (a test's, a view's): parsed here, once
            self.metrics = Metrics(self.metrics)

    @property
    def finished(self) -> bool:
        """Only finished runs enter the tables and plots; the others are listed as failed."""
        return self.status == "finished"


def natural_key(value: object) -> tuple[Any, ...]:
    """Sort key that orders the numbers inside strings by value: ppl/512 < ppl/1024."""
    parts = re.split(r"(\d+(?:\.\d+)?)", str(value))
    return tuple(float(p) if i % 2 else p for i, p in enumerate(parts))
