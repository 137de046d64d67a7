"""Each window's document for report folders written before runs recorded it (`window_documents`).

    posab window-documents results/study/main [FOLDER ...] [--root DIR]

A run's windows (`window_starts`, windows of its longest evaluation length) lie in its evaluation split
(`eval.split`) of the token stream its data config gives. Each run's own config (the folder's
`configs/<run>.yaml`) rebuilds that stream (`prepare_data`, from its token cache when there): runs with
other data settings (anchors on or off, bytes or BPE) get their own stream. The windows are checked against
the stream (they must be the windows the evaluator picks from it), and each window's document is the
perplexity evaluator's (`TokenStream.window_documents`: the one holding most of its targets). runs.csv is
written again by the report's writer, so that only the new column differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from posab.data import DataConfig, TokenStream, prepare_data
from posab.report.records import ReportError, RunRecord
from posab.report.runs_csv import load_csv, write_csv

RUNS_CSV = "runs.csv"


def data_config(node: DictConfig, root: Path) -> DataConfig:
    """The run's data section, typed; a relative `data.path` or `data.cache_dir` taken from `root` (the
    folder the run was started in)."""
    merged = OmegaConf.merge(OmegaConf.structured(DataConfig), node.data)
    typed: DataConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    typed.progress = False
    for key in ("path", "cache_dir"):
        value = getattr(typed, key)
        if value is not None and not Path(value).expanduser().is_absolute():
            setattr(typed, key, str(root / value))
    return typed


class Streams:
    """The evaluation stream of each distinct (data config, split), prepared once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.prepared: dict[str, TokenStream] = {}  # by data config and split, as JSON

    def of(self, run: RunRecord) -> tuple[TokenStream, int]:
        """The run's evaluation split and the length of its windows (its longest evaluation length)."""
        if run.config_path is None:
            raise ReportError(f"run {run.name}: no configs/{run.name}.yaml, so no data config to rebuild")
        node = OmegaConf.load(run.config_path)
        try:
            data = data_config(node, self.root) if isinstance(node, DictConfig) else None
        except OmegaConfBaseException as err:
            raise ReportError(f"{run.config_path}: no usable data config ({err})") from None
        if data is None:
            raise ReportError(f"{run.config_path}: not a config mapping")
        split = str(OmegaConf.select(node, "eval.split", default="valid"))
        key = json.dumps([asdict(data), split], sort_keys=True)
        if key not in self.prepared:
            streams = prepare_data(data).streams
            if split not in streams:
                raise ReportError(f"run {run.name}: its corpus has no split {split!r}")
            self.prepared[key] = streams[split]
        return self.prepared[key], int(max(node.eval.lengths))


def documents_of(run: RunRecord, stream: TokenStream, length: int) -> list[int]:
    """The document of each of the run's windows, after checking that they are the windows the perplexity
    evaluator picks from this stream (else it is not the stream the run scored)."""
    starts = np.asarray(run.window_starts, dtype=np.int64)
    expected = stream.fixed_windows(length, len(starts))
    if not np.array_equal(starts, expected):
        raise ReportError(
            f"run {run.name}: its window_starts are not the {len(starts)} windows of {length} tokens that "
            f"its data config's {stream.split} split gives (a different corpus, tokenizer or length?)"
        )
    documents = stream.window_documents(starts, length)
    return [] if documents is None else [int(d) for d in documents]


def backfill(folder: Path, root: Path) -> tuple[int, int]:
    """Write `window_documents` into the folder's runs.csv for every run with window starts; returns the
    runs given documents and the streams prepared. Nothing is written when a run's stream cannot be built."""
    path = folder / RUNS_CSV
    if not path.is_file():
        raise ReportError(f"{path} does not exist")
    runs = load_csv(path)
    streams = Streams(root)
    filled = [
        replace(run, window_documents=documents_of(run, *streams.of(run))) if run.window_starts else run
        for run in runs
    ]
    write_csv(filled, path)
    return sum(bool(r.window_documents) for r in filled), len(streams.prepared)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: `posab window-documents FOLDER [FOLDER ...] [--root DIR]`; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="posab window-documents",
        description="Add each window's document (`window_documents`) to report folders' runs.csv.",
    )
    parser.add_argument("folders", nargs="+", type=Path, help="report folders (runs.csv and configs/)")
    parser.add_argument(
        "--root",
        type=Path,
        default=Path("."),
        help="the folder the runs started in: relative data.path and "
        "data.cache_dir are taken from it (default: the current folder)",
    )
    args = parser.parse_args(argv)
    try:
        for folder in args.folders:
            runs, prepared = backfill(folder, args.root)
            print(f"{folder / RUNS_CSV}: window documents for {runs} runs, from {prepared} token stream(s)")
    except ReportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
