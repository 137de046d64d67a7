"""runs.csv: one row per run, written with every result and read back, so that a report renders again
from its own folder without the run directories."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from posab.keys import CORPUS_SEPARATOR
from posab.report.grouping import MEASUREMENT_SWITCHES, mixed_precision, run_label, study_keys
from posab.report.records import (
    CONFIG_PREFIX,
    CURVE_PREFIX,
    INFO_COLUMNS,
    RUN_INFO_KEYS,
    SEQ_LEN_KEY,
    SERIES_PREFIX,
    SUMMARY_METRICS,
    VAL_CURVE_COLUMN,
    WINDOW_DOCUMENTS_COLUMN,
    WINDOW_STARTS_COLUMN,
    WINDOWS_PREFIX,
    CorpusWindows,
    RunRecord,
    natural_key,
)
from posab.report.rundirs import read_config

LINE_END = "\r\n"  # as Python's csv module writes, so that runs.csv files written before stay unchanged


def write_csv(runs: Sequence[RunRecord], path: Path) -> Path:
    """One row per run: INFO_COLUMNS, the training length, measurement switches and swept config values
    (`config.KEY`), every scalar result (summary first, then the rest sorted), then position_loss/L as JSON
    lists, where a run has one, the validation-loss curve as JSON [step, loss] pairs (`val_loss_curve`)
    and, where a run has them, its per-window losses (`windows:loss/L`, ...), the windows' starts
    (`window_starts`) and documents (`window_documents`) as JSON lists, and the passkey stage's curves
    (`curve:passkey_stage/key_loss`, ...) as JSON [step, value] pairs."""
    keys = study_keys(runs)
    swept = {k for study in keys.values() for k in study}
    switches = {k for r in runs for k in MEASUREMENT_SWITCHES if k in r.config}  # rows check them
    config_keys = sorted(swept | switches | {SEQ_LEN_KEY}, key=natural_key)
    metric_keys = sorted({k for r in runs for k in r.metrics} - set(SUMMARY_METRICS), key=natural_key)
    series_keys = sorted({k for r in runs for k in r.series}, key=natural_key)
    window_keys = sorted({k for r in runs for k in r.windows}, key=natural_key)
    curve_keys = sorted({k for r in runs for k in r.stage_curves}, key=natural_key)
    columns = [
        *INFO_COLUMNS,
        *(CONFIG_PREFIX + k for k in config_keys),
        *SUMMARY_METRICS,
        *metric_keys,
        *series_keys,
        *([VAL_CURVE_COLUMN] if any(r.val_curve for r in runs) else []),
        *(WINDOWS_PREFIX + k for k in window_keys),
        *([WINDOW_STARTS_COLUMN] if any(r.window_starts for r in runs) else []),
        *([WINDOW_DOCUMENTS_COLUMN] if any(r.window_documents for r in runs) else []),
        *_corpus_window_columns(runs),
        *(CURVE_PREFIX + k for k in curve_keys),
    ]
    mixed = mixed_precision(runs)
    cells = [_csv_cells(r, run_label(r, keys[r.study], r.study in mixed)) for r in runs]
    frame = pd.DataFrame(cells, columns=columns)
    frame.to_csv(path, index=False, lineterminator=LINE_END, encoding="utf-8")
    return path


def corpus_column(corpus: str, column: str) -> str:
    """The runs.csv column of a corpus's window starts or documents (`wikitext2:window_starts`)."""
    return f"{corpus}{CORPUS_SEPARATOR}{column}"


def _corpus_window_columns(runs: Sequence[RunRecord]) -> list[str]:
    """The window starts and (where recorded) documents columns of every evaluation corpus, by corpus."""
    columns = []
    for corpus in sorted({c for r in runs for c in r.corpus_windows}, key=natural_key):
        places = [r.corpus_windows[corpus] for r in runs if corpus in r.corpus_windows]
        columns.append(corpus_column(corpus, WINDOW_STARTS_COLUMN))
        if any(p.documents for p in places):
            columns.append(corpus_column(corpus, WINDOW_DOCUMENTS_COLUMN))
    return columns


def _corpus_windows(filled: dict[str, str]) -> dict[str, CorpusWindows]:
    """Each evaluation corpus's window starts and documents from a runs.csv row's filled cells."""
    suffix = f"{CORPUS_SEPARATOR}{WINDOW_STARTS_COLUMN}"
    corpora = [k.removesuffix(suffix) for k in filled if k.endswith(suffix)]
    return {
        corpus: CorpusWindows(
            [int(s) for s in json.loads(filled[corpus_column(corpus, WINDOW_STARTS_COLUMN)])],
            [int(d) for d in json.loads(filled.get(corpus_column(corpus, WINDOW_DOCUMENTS_COLUMN), "[]"))],
        )
        for corpus in corpora
    }


def _csv_cells(run: RunRecord, label: str) -> dict[str, Any]:
    """One run's cells by column name; a column the run has no value for stays empty."""
    cells: dict[str, Any] = {"run": run.name, "study": run.study, "label": label, "status": run.status}
    cells |= {"error": run.error, "encoding": run.encoding, "seed": "" if run.seed is None else str(run.seed)}
    cells |= run.info
    cells |= {CONFIG_PREFIX + k: v for k, v in run.config.items()}
    cells |= run.metrics
    cells |= {k: json.dumps(v) for k, v in run.series.items()}
    if run.val_curve:
        cells[VAL_CURVE_COLUMN] = json.dumps(run.val_curve)
    cells |= {WINDOWS_PREFIX + k: json.dumps(v) for k, v in run.windows.items()}
    if run.window_starts:
        cells[WINDOW_STARTS_COLUMN] = json.dumps(run.window_starts)
    if run.window_documents:
        cells[WINDOW_DOCUMENTS_COLUMN] = json.dumps(run.window_documents)
    for corpus, places in run.corpus_windows.items():
        cells[corpus_column(corpus, WINDOW_STARTS_COLUMN)] = json.dumps(places.starts)
        if places.documents:
            cells[corpus_column(corpus, WINDOW_DOCUMENTS_COLUMN)] = json.dumps(places.documents)
    cells |= {CURVE_PREFIX + k: json.dumps(v) for k, v in run.stage_curves.items()}
    return cells


def load_csv(path: Path) -> list[RunRecord]:
    """Read the runs back from a report's runs.csv. A run's config is its whole resolved config from the
    configs/ folder, when there, updated by its `config.*` columns: runs.csv keeps only the keys swept among
    its own runs, and a key constant there (data.anchors in a grid with anchors on) may vary once newer runs
    join them."""
    frame = pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8")
    return [_record(row, path.parent / "configs") for row in frame.to_dict("records")]


def _record(row: dict[str, str], configs: Path) -> RunRecord:
    filled = {k: v for k, v in row.items() if v != ""}
    config = {k[len(CONFIG_PREFIX) :]: v for k, v in filled.items() if k.startswith(CONFIG_PREFIX)}
    series = {k: json.loads(v) for k, v in filled.items() if k.startswith(SERIES_PREFIX)}
    windows = {k: json.loads(v) for k, v in filled.items() if k.startswith(WINDOWS_PREFIX)}
    curves = {k: json.loads(v) for k, v in filled.items() if k.startswith(CURVE_PREFIX)}
    corpus_windows = _corpus_windows(filled)
    per_window = (WINDOW_STARTS_COLUMN, WINDOW_DOCUMENTS_COLUMN)
    corpus_lists = [corpus_column(corpus, column) for corpus in corpus_windows for column in per_window]
    lists = (VAL_CURVE_COLUMN, WINDOW_STARTS_COLUMN, WINDOW_DOCUMENTS_COLUMN, *corpus_lists)
    not_metrics = {*INFO_COLUMNS, *series, *windows, *curves, *lists}
    metrics = {
        k: float(v) for k, v in filled.items() if k not in not_metrics and not k.startswith(CONFIG_PREFIX)
    }
    config_file = configs / f"{row['run']}.yaml"
    config_path = config_file if config_file.is_file() else None
    if config_path:  # every key, not only the columns: a key constant here may vary in a fold
        config = read_config(config_path) | config
    return RunRecord(
        name=row["run"],
        status=row["status"],
        error=row["error"],
        encoding=row["encoding"],
        seed=int(row["seed"]) if row["seed"] else None,
        study=row["study"],
        info={k: row.get(k, "") for k in RUN_INFO_KEYS},  # a column older files lack: ""
        config=config,
        metrics=metrics,
        series=series,
        config_path=config_path,
        val_curve=[(int(step), float(loss)) for step, loss in json.loads(filled.get(VAL_CURVE_COLUMN, "[]"))],
        windows={k.removeprefix(WINDOWS_PREFIX): [float(v) for v in values] for k, values in windows.items()},
        window_starts=[int(s) for s in json.loads(filled.get(WINDOW_STARTS_COLUMN, "[]"))],
        window_documents=[int(d) for d in json.loads(filled.get(WINDOW_DOCUMENTS_COLUMN, "[]"))],
        corpus_windows=corpus_windows,
        stage_curves={
            k.removeprefix(CURVE_PREFIX): [(int(step), float(v)) for step, v in points]
            for k, points in curves.items()
        },
    )
