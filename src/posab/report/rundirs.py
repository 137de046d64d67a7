"""Run directories: finding them, naming them, and reading each into a `RunRecord`.

A run directory holds `results.json` and `config.yaml` (and, for the training curve, `metrics.jsonl`; for
the paired differences, `perplexity_windows.npz`).
Configs of runs made before an encoding option existed are completed with the option's default.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from posab.keys import CORPUS_SEPARATOR
from posab.paths import encoding_options
from posab.report.records import (
    PROVENANCE_KEYS,
    RUN_METRICS,
    SERIES_PREFIX,
    STAGE_KEY_LOSS,
    STAGE_LAST_START,
    STAGE_PREFIX,
    STAGE_PROBES,
    VAL_CURVE_KEY,
    WINDOW_DOCUMENTS_KEY,
    WINDOW_STARTS_KEY,
    WINDOWS_FILE,
    CorpusWindows,
    ReportError,
    RunRecord,
    natural_key,
)
from posab.results import flatten, is_number


def find_runs(paths: Iterable[Path]) -> list[Path]:
    """Every run directory (`results.json` + `config.yaml`) at or below each path, each path once."""
    found: dict[Path, None] = {}
    for path in paths:
        if not path.exists():
            raise ReportError(f"{path} does not exist")
        candidates = sorted(path.rglob("results.json"), key=natural_key)
        runs = [c.parent for c in candidates if (c.parent / "config.yaml").is_file()]
        if not runs:
            raise ReportError(f"no run directories (results.json + config.yaml) found under {path}")
        found.update(dict.fromkeys(r.resolve() for r in runs))
    return list(found)


def run_names(run_dirs: Sequence[Path]) -> list[str]:
    """Unique names for distinct directories: the directory name (its path below the multirun sweep
    folder, joined by `__`), with as many parent folders added as it takes to tell them apart."""
    depths = [_depth_below_sweep(d) for d in run_dirs]
    extra = 0
    while True:
        names = ["__".join(d.parts[-(depth + extra) :]) for d, depth in zip(run_dirs, depths, strict=True)]
        if len(set(names)) == len(names):
            return names
        extra += 1


def _depth_below_sweep(run_dir: Path) -> int:
    """1, or the number of folders below the sweep folder (Hydra's multirun.yaml) when it is nested."""
    for depth, parent in enumerate(run_dir.parents, start=1):
        if (parent / "multirun.yaml").is_file():
            return depth
    return 1


INIT_FROM = "train.init_from"  # a stage's parent run (`with_parent`)


def load_run(path: Path, name: str | None = None) -> RunRecord:
    """Read one run directory; a failed run may hold little more than its status and error."""
    results = _read_results(path / "results.json")
    config = with_parent(read_config(path / "config.yaml"), results)
    metrics, series = _metrics_and_series(results)
    info = _run_info(results, config)
    seed = results.get("seed", config.get("seed"))
    group = config.get("logger.group", "null")
    windows, starts, documents = read_windows(path / WINDOWS_FILE)
    corpus_windows = {}
    for corpus, file in corpus_window_files(path).items():
        losses, corpus_starts, corpus_documents = read_windows(file, corpus)
        windows |= losses
        corpus_windows[corpus] = CorpusWindows(corpus_starts, corpus_documents)
    stage_metrics, stage_curves = _stage(results, path / "metrics.jsonl")
    return RunRecord(
        name=name or path.name,
        status=str(results.get("status", "unknown")),
        error=str(results.get("error", "")),
        encoding=str(results.get("encoding") or _encoding_from(config, info["overrides"])),
        seed=None if seed in (None, "null") else int(seed),
        study=group if group != "null" else info["experiment"] or "default",
        info=info,
        config=config,
        metrics=metrics | stage_metrics,
        series=series,
        config_path=path / "config.yaml",
        val_curve=read_logged_curve(path / "metrics.jsonl", VAL_CURVE_KEY),
        windows=windows,
        window_starts=starts,
        window_documents=documents,
        corpus_windows=corpus_windows,
        stage_curves=stage_curves,
    )


def _read_results(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return {"status": "failed", "error": f"unreadable results.json: {err}"}


def with_parent(config: dict[str, str], results: dict[str, Any]) -> dict[str, str]:
    """A stage's `train.init_from` read as the encoding of the run it continues (results.json `parent`):
    the same row's stages, each continued from its own seed's run, share one value, and a stage is told
    from another by its parent's encoding (DroPE's NoPE from RoPE, NoPE continued from NoPE). A stage from
    before the parent was recorded keeps the folder."""
    parent = results.get("parent")
    if config.get(INIT_FROM, "null") == "null" or not isinstance(parent, dict) or not parent.get("encoding"):
        return config
    return {**config, INIT_FROM: str(parent["encoding"])}


def read_config(path: Path) -> dict[str, str]:
    """The flattened config, completed with the encoding's options as the run ran them."""
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    config = yaml_values(raw if isinstance(raw, dict) else {})
    return {**encoding_defaults(config.get("encoding.name", "")), **config}


def _metrics_and_series(results: dict[str, Any]) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Every scalar result (run-level, params/*, eval keys) and the position_loss/L curves."""
    metrics = {k: float(results[k]) for k in RUN_METRICS if is_number(results.get(k))}
    metrics.update(
        {f"params/{k}": float(v) for k, v in (results.get("params") or {}).items() if is_number(v)}
    )
    series: dict[str, list[float]] = {}
    for key, value in (results.get("eval") or {}).items():
        if is_number(value):
            metrics[key] = float(value)
        elif key.startswith(SERIES_PREFIX) and isinstance(value, list):
            series[key] = [float(v) for v in value]
    return metrics, series


def _run_info(results: dict[str, Any], config: dict[str, str]) -> dict[str, str]:
    machine = results.get("machine") or {}
    return {
        "experiment": str(results.get("experiment") or config.get("experiment", "")),
        "overrides": str(results.get("overrides", "")),
        "git_commit": str(results.get("git_commit", "")),
        "machine": join_nonempty(
            str(machine.get("platform", "")),
            str(machine.get("processor", "")),
            str(machine.get("cpu_model", "")),
            f"{machine['cpus']} CPUs" if "cpus" in machine else "",
            f"torch {machine['torch']}" if "torch" in machine else "",
        ),
        "device": str(results.get("device", "")),
        "precision": str(results.get("precision", "")),
        **_provenance(results, machine),
    }


def _provenance(results: dict[str, Any], machine: dict[str, Any]) -> dict[str, str]:
    """PROVENANCE_KEYS as cells: JSON scalars as JSON writes them (`true`, `null`, `400`), the versions as
    `name=version` pairs of the installed packages; "" where results.json predates the key."""
    recorded = {k: results[k] for k in PROVENANCE_KEYS if k in results}
    recorded |= {k: machine[k] for k in ("cpu_capability", "math_isa", "versions") if k in machine}
    cells = {k: v if isinstance(v, str) else json.dumps(v) for k, v in recorded.items() if k != "versions"}
    if isinstance(recorded.get("versions"), dict):
        cells["versions"] = " ".join(f"{name}={v}" for name, v in recorded["versions"].items() if v)
    return {k: cells.get(k, "") for k in PROVENANCE_KEYS}


def read_logged_curve(path: Path, key: str, step_offset: int = 0) -> list[tuple[int, float]]:
    """(step - step_offset, value of `key`) from a run's metrics.jsonl, the last value logged for each step
    (a resumed run logs some steps twice); empty without the file. A line cut short by a killed process is
    passed over."""
    if not path.is_file():
        return []
    curve: dict[int, float] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if key in record:
            curve[int(record["step"]) - step_offset] = float(record[key])
    return sorted(curve.items())


def _stage(
    results: dict[str, Any], metrics_path: Path
) -> tuple[dict[str, float], dict[str, list[tuple[int, float]]]]:
    """The passkey stage's scalars (`passkey_stage/time_s`, ..., the step its last length starts at) and
    curves (key loss from metrics.jsonl, at stage steps; the probes); both empty for a run without it."""
    stage = results.get("passkey_stage") or {}
    if not stage:
        return {}, {}
    metrics = {STAGE_PREFIX + k: float(v) for k, v in stage.items() if is_number(v)}
    metrics[STAGE_LAST_START] = float(sum(stage.get("curriculum", {}).get("steps", [0])[:-1]))
    lm_steps = int((results.get("train") or {}).get("steps", 0))  # 0 from train.init_from
    curves = {
        STAGE_KEY_LOSS: read_logged_curve(metrics_path, "train/needle_loss", lm_steps),
        STAGE_PROBES: [(int(step), float(acc)) for step, acc in stage.get("probes", [])],
    }
    return metrics, curves


def corpus_window_files(path: Path) -> dict[str, Path]:
    """The per-window files of a run directory's evaluation corpora by corpus name
    (`wikitext2.perplexity_windows.npz` -> "wikitext2")."""
    suffix = f".{WINDOWS_FILE}"
    return {file.name.removesuffix(suffix): file for file in sorted(path.glob(f"*{suffix}"))}


def read_windows(
    path: Path, corpus: str | None = None
) -> tuple[dict[str, list[float]], list[int], list[int]]:
    """The per-window mean losses of a run's perplexity_windows.npz by key (`loss/512`, `loss_tail/1024`;
    `NAME:loss/512` in the file of the evaluation corpus `corpus`), the windows' start offsets and each
    window's document (empty in files written before the evaluator recorded them); all empty without the
    file.

    Each loss is rounded to 7 significant digits (about what its float32 holds), so that the run read from
    its directory and the same run read back from runs.csv hold identical numbers."""
    if not path.is_file():
        return {}, [], []
    prefix = "" if corpus is None else f"{corpus}{CORPUS_SEPARATOR}"
    starts_key, documents_key = prefix + WINDOW_STARTS_KEY, prefix + WINDOW_DOCUMENTS_KEY
    with np.load(path) as arrays:
        windows = {
            key: [float(f"{v:.7g}") for v in arrays[key].tolist()]
            for key in arrays.files
            if key not in (starts_key, documents_key)
        }
        documents = arrays[documents_key].tolist() if documents_key in arrays.files else []
        return windows, [int(s) for s in arrays[starts_key].tolist()], [int(d) for d in documents]


# Options added after runs were made, whose default then changed: the value a run that lacks the key ran
# (the multi-scale bias had no clamp before issue 28; its default became `train` in issue 28, part 8).
BEFORE_THE_OPTION = {"multiscale": {"encoding.clamp": "null"}}


@cache
def encoding_defaults(encoding: str) -> dict[str, str]:
    """The options of `conf/encoding/<encoding>.yaml` as `encoding.*` keys, as a run that lacks one of
    them ran it: the option's default (a run made before the option existed ran what the default still
    does), or `BEFORE_THE_OPTION`'s value where the default changed since; empty where there is no such
    file. The committed studies' configs name every option whose default changed."""
    options = encoding_options(encoding) if encoding else {}
    defaults = yaml_values({"encoding": options}) if options else {}
    return defaults | BEFORE_THE_OPTION.get(encoding, {}) if defaults else {}


def _encoding_from(config: dict[str, str], overrides: str) -> str:
    if "encoding.name" in config:
        return config["encoding.name"]
    match = re.search(r"(?:^|,)encoding=([^,]+)", overrides)
    return match.group(1) if match else "unknown"


def yaml_values(node: dict[str, Any]) -> dict[str, str]:
    """Nested config -> {"dotted.key": value as YAML would write it} (true, null, [1, 2], 0.003)."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in flatten(node).items()}


def join_nonempty(*parts: str) -> str:
    """The non-empty parts joined by `, `."""
    return ", ".join(p for p in parts if p)
