"""Results report over run directories: Markdown tables, a CSV of every run, plots and the configs.

    python scripts/report.py outputs/multirun/SWEEP [DIR ...] --out results/NAME

Each DIR is a run directory, a multirun sweep directory or any folder holding run directories (found
recursively: a folder with both `results.json` and `config.yaml`), or a report folder written before (it
holds `runs.csv`; the report is then rendered again from that CSV). Only local files are read.

Rows: runs are grouped by study (`logger.group` when set, else `experiment`), then by encoding and by
every other swept value: a config key whose value differs between the finished runs of the study (for
`encoding.*` hyper-parameters: between finished runs of the same encoding), except the seed and keys
that do not change the experiment (`IGNORED_KEYS`). Every metric is the mean ± sample std (ddof=1) over
the seeds of a row. Plots draw one line (or heatmap) per row, named by its label, prefixed by the study
when the report covers several studies.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import shutil
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from cycler import cycler
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter, NullFormatter
from omegaconf import OmegaConf

from posab.evaluate import evaluator_classes
from posab.outputs import Column
from posab.paths import encoding_options
from posab.plots import needle_heatmap, new_figure, save_figure
from posab.results import bin_centres, flatten, is_number

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
    "encoding._before_",
    "data.path",
    "data.cache_dir",
    "data.hub_local_dir",
    "train.progress",
    "eval.progress",
)
INFO_COLUMNS = (
    "run",
    "study",
    "label",
    "status",
    "error",
    "encoding",
    "seed",
    "experiment",
    "overrides",
    "git_commit",
    "machine",
    "device",
    "precision",
)
RUN_METRICS = ("tokens_per_s", "train_loss", "val_loss", "wall_time_s")  # top-level keys of results.json
SUMMARY_METRICS = (
    "params/total",
    "params/encoding",
    "params/non_embedding",
    *RUN_METRICS,
)
CONFIG_PREFIX = "config."
SERIES_PREFIX = "position_loss/"
SEQ_LEN_KEY = "train.seq_len"
MISSING = "—"


class ReportError(Exception):
    """Nothing to report on, or inputs that cannot be combined; the message names the path."""


@dataclass
class RunRecord:
    """One run as the report sees it, read from its directory or from a runs.csv row."""

    name: str  # unique among the runs of a report; names the copied config
    status: str  # running | finished | failed
    error: str
    encoding: str
    seed: int | None
    study: str
    info: dict[str, str]  # experiment, overrides, git_commit, machine, device, precision
    config: dict[str, str]  # flattened config ("data.anchors" -> "false"); values as in YAML
    metrics: dict[str, float]  # every scalar result: params/*, val_loss, ..., every scalar eval key
    series: dict[str, list[float]]  # position_loss/L: mean loss per position bin
    config_path: Path | None = None

    @property
    def finished(self) -> bool:
        """Only finished runs enter the tables and plots; the others are listed as failed."""
        return self.status == "finished"


@dataclass
class Row:
    """The finished runs of one study that share an encoding and every swept value (one per seed)."""

    study: str
    label: str  # e.g. "multiscale, data.anchors=false"
    runs: list[RunRecord]

    def values(self, key: str) -> list[float]:
        """The value of one metric in each run of the row that has it."""
        return [r.metrics[key] for r in self.runs if key in r.metrics]


# ---------------------------------------------------------------------------------------------- reading


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


def load_run(path: Path, name: str | None = None) -> RunRecord:
    """Read one run directory; a failed run may hold little more than its status and error."""
    try:
        results: dict[str, Any] = json.loads((path / "results.json").read_text())
    except (OSError, ValueError) as err:
        results = {"status": "failed", "error": f"unreadable results.json: {err}"}
    raw = OmegaConf.to_container(OmegaConf.load(path / "config.yaml"), resolve=False)
    config = yaml_values(raw if isinstance(raw, dict) else {})
    config = {**encoding_defaults(config.get("encoding.name", "")), **with_current_keys(config)}
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
    machine = results.get("machine") or {}
    info = {
        "experiment": str(results.get("experiment") or config.get("experiment", "")),
        "overrides": str(results.get("overrides", "")),
        "git_commit": str(results.get("git_commit", "")),
        "machine": _join(
            str(machine.get("platform", "")),
            str(machine.get("processor", "")),
            f"{machine['cpus']} CPUs" if "cpus" in machine else "",
            f"torch {machine['torch']}" if "torch" in machine else "",
        ),
        "device": str(results.get("device", "")),
        "precision": str(results.get("precision", "")),
    }
    seed = results.get("seed", config.get("seed"))
    group = config.get("logger.group", "null")
    return RunRecord(
        name=name or path.name,
        status=str(results.get("status", "unknown")),
        error=str(results.get("error", "")),
        encoding=str(results.get("encoding") or _encoding_from(config, info["overrides"])),
        seed=None if seed in (None, "null") else int(seed),
        study=group if group != "null" else info["experiment"] or "default",
        info=info,
        config=config,
        metrics=metrics,
        series=series,
        config_path=path / "config.yaml",
    )


@cache
def encoding_defaults(encoding: str) -> dict[str, str]:
    """The options of `conf/encoding/<encoding>.yaml` as `encoding.*` keys, as a run that lacks one of
    them ran it; empty where there is no such file.

    A run made before an encoding option existed lacks the key. It ran with the option's default, unless
    the default changed: the yaml's `_before_` gives the value such runs had (e.g. sinusoidal
    `form: unscaled`), and that one is filled in. `_before_` itself is no option."""
    options = encoding_options(encoding) if encoding else {}
    if not options:
        return {}
    before = options.get("_before_") or {}
    current = {k: v for k, v in options.items() if k != "_before_"}
    return yaml_values({"encoding": {**current, **before}})


# Config keys an encoding option replaced: the option and the option's value for each old value. A run that
# has the old key (and not the option) is labelled with the option's value, in the row of the runs made
# with it, and the old key is dropped. Runs read back from a report's runs.csv keep their columns as
# written.
LEGACY_KEYS: dict[str, tuple[str, dict[str, str]]] = {
    # sinusoidal before `form` (issue 13): x * sqrt(d) + PE (the paper's) or x + PE
    "encoding.scale_embeddings": ("encoding.form", {"true": "paper", "false": "unscaled"}),
}


def with_current_keys(config: dict[str, str]) -> dict[str, str]:
    """A run's flattened config with every key in LEGACY_KEYS replaced by the option that replaced it."""
    current = dict(config)
    for old, (option, values) in LEGACY_KEYS.items():
        if old in current:
            value = current.pop(old)
            current.setdefault(option, values.get(value, value))
    return current


def _encoding_from(config: dict[str, str], overrides: str) -> str:
    if "encoding.name" in config:
        return config["encoding.name"]
    match = re.search(r"(?:^|,)encoding=([^,]+)", overrides)
    return match.group(1) if match else "unknown"


def yaml_values(node: dict[str, Any]) -> dict[str, str]:
    """Nested config -> {"dotted.key": value as YAML would write it} (true, null, [1, 2], 0.003)."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in flatten(node).items()}


def load_csv(path: Path) -> list[RunRecord]:
    """Read the runs back from a report's runs.csv (configs from its configs/ folder, when there)."""
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    records = []
    for row in rows:
        filled = {k: v for k, v in row.items() if v != ""}
        config = {k[len(CONFIG_PREFIX) :]: v for k, v in filled.items() if k.startswith(CONFIG_PREFIX)}
        series = {k: json.loads(v) for k, v in filled.items() if k.startswith(SERIES_PREFIX)}
        metrics = {
            k: float(v)
            for k, v in filled.items()
            if k not in INFO_COLUMNS and k not in series and not k.startswith(CONFIG_PREFIX)
        }
        config_path = path.parent / "configs" / f"{row['run']}.yaml"
        records.append(
            RunRecord(
                name=row["run"],
                status=row["status"],
                error=row["error"],
                encoding=row["encoding"],
                seed=int(row["seed"]) if row["seed"] else None,
                study=row["study"],
                info={k: row[k] for k in ("experiment", "overrides", "git_commit", "machine", "device")}
                | {"precision": row["precision"]},
                config=config,
                metrics=metrics,
                series=series,
                config_path=config_path if config_path.is_file() else None,
            )
        )
    return records


def collect_runs(paths: Sequence[Path]) -> list[RunRecord]:
    """All runs behind the given paths: report folders (runs.csv) and folders of run directories."""
    records: list[RunRecord] = []
    dirs = []
    for path in paths:
        if (path / "runs.csv").is_file() and not (path / "results.json").is_file():
            records.extend(load_csv(path / "runs.csv"))
        else:
            dirs.extend(find_runs([path]))
    dirs = list(dict.fromkeys(dirs))
    records.extend(load_run(d, name) for d, name in zip(dirs, run_names(dirs), strict=True))
    names = [r.name for r in records]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise ReportError(f"the same run name comes from two inputs: {', '.join(clashes)}")
    return records


# --------------------------------------------------------------------------------------------- grouping


def natural_key(value: object) -> tuple[Any, ...]:
    """Sort key that orders the numbers inside strings by value: ppl/512 < ppl/1024."""
    parts = re.split(r"(\d+(?:\.\d+)?)", str(value))
    return tuple(float(p) if i % 2 else p for i, p in enumerate(parts))


def _ignored(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in IGNORED_KEYS)


def swept_keys(runs: Sequence[RunRecord]) -> list[str]:
    """Config keys that differ between these runs (`encoding.*`: between runs of the same encoding).

    A key only some runs have (a setting added to the schema after the others ran) is compared among the
    runs that have it."""

    def scope(run: RunRecord, key: str) -> str:
        return run.encoding if key.startswith("encoding.") else ""

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
    return shown


def _label(run: RunRecord, keys: Sequence[str]) -> str:
    return ", ".join([run.encoding, *(f"{k}={run.config[k]}" for k in keys if k in run.config)])


def study_keys(runs: Sequence[RunRecord]) -> dict[str, list[str]]:
    """Swept keys per study, from its finished runs."""
    studies = sorted({r.study for r in runs}, key=natural_key)
    return {s: swept_keys([r for r in runs if r.study == s and r.finished]) for s in studies}


SCALED = re.compile(r"(?:loss|ppl|position_loss)@(\w+)/\d+")


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


def group_rows(runs: Sequence[RunRecord]) -> dict[str, list[Row]]:
    """Finished runs per study, grouped into rows by encoding and swept values, rows sorted by label.

    A RoPE run evaluated with scalings also gives one row per scaling (`rope + pi`, ...)."""
    table: dict[str, list[Row]] = {}
    for study, keys in study_keys(runs).items():
        rows: dict[str, Row] = {}
        finished = [r for r in runs if r.study == study and r.finished]
        shown = label_keys(finished, keys)
        for run in finished:
            label = _label(run, shown.get(run.encoding, []))
            rows.setdefault(label, Row(study, label, [])).runs.append(scaled_view(run, "none"))
            for kind in scaling_kinds(run):
                scaled = f"{label} + {kind}"
                rows.setdefault(scaled, Row(study, scaled, [])).runs.append(scaled_view(run, kind))
        if rows:
            table[study] = [rows[k] for k in sorted(rows, key=natural_key)]
    return table


def _keys_matching(runs: Iterable[RunRecord], pattern: str) -> list[int]:
    """The integer captured by `pattern` in any metric key of these runs, sorted."""
    regex = re.compile(pattern)
    return sorted({int(m.group(1)) for r in runs for k in r.metrics if (m := regex.fullmatch(k))})


# -------------------------------------------------------------------------------------------------- table


RUN_COLUMNS = (
    Column("tokens/s", "tokens_per_s", ".0f", "training throughput, tokens per second (`tokens_per_s`)"),
    Column(
        "wall s",
        "wall_time_s",
        ".0f",
        "wall time of the whole job in seconds: start-up, training and evaluations (`wall_time_s`; "
        "of the last attempt only for a resumed run)",
    ),
    Column(
        "val loss",
        "val_loss",
        ".3f",
        "final validation loss, nats/token, on `train.val_windows` windows of `train.seq_len` tokens "
        "after the last step (`val_loss`)",
    ),
)


def study_columns(rows: Sequence[Row]) -> list[Column]:
    """The columns of one study's table: the run's own, then those each evaluator declares for the keys
    the study's runs have (`Evaluator.report_columns`), in the evaluators' order."""
    keys = {k for row in rows for r in row.runs for k in r.metrics}
    return [*RUN_COLUMNS, *(c for cls in evaluator_classes() for c in cls.report_columns(keys))]


def mean_std(values: Sequence[float], fmt: str, n: int) -> str:
    """`mean ± std` (std with ddof=1; no ± for one value), `(n=k)` when only k of the row's n runs had it."""
    if not values:
        return MISSING
    text = f"{statistics.fmean(values):{fmt}}"
    if len(values) >= 2:
        text += f" ± {statistics.stdev(values):{fmt}}"
    return text + (f" (n={len(values)})" if len(values) < n else "")


def _md_row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def study_table(rows: Sequence[Row]) -> list[str]:
    """The Markdown table of one study and its legend."""
    columns = study_columns(rows)
    lines = [
        _md_row(["encoding, swept values", "seeds n", "params", *(c.header for c in columns)]),
        _md_row(["---"] * (len(columns) + 3)),
    ]
    for row in rows:
        params = row.values("params/total")
        cells = [row.label, str(len(row.runs)), f"{statistics.fmean(params):,.0f}" if params else MISSING]
        cells += [mean_std(row.values(c.key), c.fmt, len(row.runs)) for c in columns]
        lines.append(_md_row(cells))
    legend = [
        "encoding, swept values: the encoding and the config values (other than the seed) that differ "
        "between its finished runs in this study, or that are fixed per encoding but not the same for all",
        "seeds n: finished runs in the row (one per seed); every later cell is mean ± sample std "
        "(ddof=1) over them, ± left out when n = 1, `(n=k)` when only k runs have the value, "
        f"{MISSING} when none has",
        "params: total parameter count (mean over the runs; `params.total`)",
        *(f"{c.header}: {c.legend}" for c in columns),
    ]
    return [*lines, "", "Legend:", "", *(f"- {item}" for item in legend)]


# -------------------------------------------------------------------------------------------------- plots


TAB10 = list(colormaps["tab10"].colors)


def _figure(ncols: int = 1, width: float = 7.5) -> tuple[Figure, list[Axes]]:
    fig = new_figure(width, 4.5, layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    for ax in axes:  # 30 distinct line styles: ten colours, solid, then dashed, then dotted
        ax.set_prop_cycle(cycler(linestyle=["-", "--", ":"]) * cycler(color=TAB10))
    return fig, list(axes)


def _save(fig: Figure, path: Path, legend_ax: Axes) -> Path:
    """Legend to the right of `legend_ax`, then write the PNG."""
    legend_ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return save_figure(fig, path)


def _train_lengths(ax: Axes, rows: Sequence[Row]) -> None:
    """A vertical dashed line at each training length (`train.seq_len`) of the rows."""
    lengths = {int(r.config[SEQ_LEN_KEY]) for row in rows for r in row.runs if SEQ_LEN_KEY in r.config}
    for n in sorted(lengths):
        ax.axvline(n, color="grey", linestyle="--", linewidth=1, label=f"training length {n}")


def plot_ppl_vs_length(rows: dict[str, Row], path: Path) -> Path | None:
    """Perplexity against evaluation length: mean over seeds, band = min..max over seeds."""
    fig, (ax,) = _figure()
    drawn = False
    for name, row in rows.items():
        lengths = _keys_matching(row.runs, r"ppl/(\d+)")
        if not lengths:
            continue
        values = [row.values(f"ppl/{n}") for n in lengths]
        line = ax.plot(lengths, [statistics.fmean(v) for v in values], marker="o", label=name)[0]
        ax.fill_between(
            lengths, [min(v) for v in values], [max(v) for v in values], alpha=0.2, color=line.get_color()
        )
        drawn = True
    if not drawn:
        return None
    _train_lengths(ax, list(rows.values()))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = _keys_matching([r for row in rows.values() for r in row.runs], r"ppl/(\d+)")
    ax.set_xticks(ticks, [str(n) for n in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
    ax.set_xlabel("evaluation length L (tokens, log2 scale)")
    ax.set_ylabel("perplexity (log scale)")
    ax.set_title("Perplexity vs evaluation length (mean over seeds, band: min..max)")
    return _save(fig, path, ax)


def plot_position_loss(rows: dict[str, Row], path: Path) -> Path | None:
    """Per-position loss at each row's longest evaluated length, mean over seeds."""
    fig, (ax,) = _figure()
    drawn = False
    for name, row in rows.items():
        lengths = sorted({int(k.split("/")[1]) for r in row.runs for k in r.series})
        if not lengths:
            continue
        n = lengths[-1]
        curves = [r.series[f"{SERIES_PREFIX}{n}"] for r in row.runs if f"{SERIES_PREFIX}{n}" in r.series]
        mean = np.mean(np.asarray(curves, dtype=np.float64), axis=0)
        ax.plot(bin_centres(n, len(mean)), mean, label=f"{name} (L={n})")
        drawn = True
    if not drawn:
        return None
    _train_lengths(ax, list(rows.values()))
    ax.set_xlabel("position in the window (tokens, bin centres)")
    ax.set_ylabel("mean loss (nats/token)")
    ax.set_title("Loss by position at the longest evaluated length (mean over seeds)")
    return _save(fig, path, ax)


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def plot_needle(name: str, row: Row, path: Path) -> Path | None:
    """Passkey accuracy heatmap (depth × length), mean over seeds, from the per-cell scalars."""
    pattern = re.compile(r"needle/acc@(\d+)/depth(.+)")
    cells = {(int(m[1]), m[2]) for r in row.runs for k in r.metrics if (m := pattern.fullmatch(k))}
    if not cells:
        return None
    lengths = sorted({n for n, _ in cells})
    depths = sorted({d for _, d in cells}, key=float)
    acc = [[_mean(row.values(f"needle/acc@{n}/depth{d}")) for d in depths] for n in lengths]
    grid = {"lengths": lengths, "depths": [float(d) for d in depths], "acc": acc}
    title = f"Passkey accuracy: {name} (mean over {len(row.runs)} seeds)"
    return save_figure(needle_heatmap(grid, title), path)


def plot_shift(rows: dict[str, Row], path: Path) -> Path | None:
    """Offset KL against offset k and prefix Δloss against prefix length k, one line per row label."""
    panels = (
        ("offset", "kl", "KL(p_ref ‖ p_shift) (symlog)", "Position offset k: KL"),
        ("prefix", "dloss", "Δloss, nats/token", "Prefix of k tokens: Δloss"),
    )
    runs = [r for row in rows.values() for r in row.runs]
    ks = [_keys_matching(runs, rf"shift/{kind}(\d+)/{metric}") for kind, metric, *_ in panels]
    if not any(ks):
        return None
    fig, axes = _figure(ncols=2, width=12)
    for ax, (kind, metric, ylabel, title), k_values in zip(axes, panels, ks, strict=True):
        for name, row in rows.items():
            means = [_mean(row.values(f"shift/{kind}{k}/{metric}")) for k in k_values]
            ax.plot(range(len(k_values)), means, marker="o", label=name)
        ax.set_xticks(range(len(k_values)), [str(k) for k in k_values])
        ax.set_xlabel(f"{kind} k (tokens)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} (mean over seeds)")
        ax.axhline(0.0, color="grey", linewidth=0.8)
    axes[0].set_yscale("symlog", linthresh=1e-8)
    return _save(fig, path, axes[1])


def write_plots(table: dict[str, list[Row]], out_dir: Path) -> list[str]:
    """Draw every plot into `out_dir`; returns one Markdown line per plot (an image, or why it is skipped)."""
    multi = len(table) > 1
    rows = {f"{s}: {row.label}" if multi else row.label: row for s, study in table.items() for row in study}
    plots: list[tuple[str, Callable[[Path], Path | None], str]] = [
        ("ppl_vs_length.png", lambda p: plot_ppl_vs_length(rows, p), "no `ppl/L` results"),
        ("position_loss.png", lambda p: plot_position_loss(rows, p), "no `position_loss/L` results"),
        ("shift.png", lambda p: plot_shift(rows, p), "no `shift/...` results"),
    ]
    plots += [
        (f"needle_{_file_part(name)}.png", lambda p, n=name: plot_needle(n, rows[n], p), "no needle cells")
        for name in rows
    ]
    lines = []
    for file, draw, missing in plots:
        written = draw(out_dir / file)
        lines += [
            f"![{file}]({file})" if written else f"`{file}` skipped: {missing} in the finished runs",
            "",
        ]
    return lines


def _file_part(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("_")


# ------------------------------------------------------------------------------------------------ writing


def write_csv(runs: Sequence[RunRecord], path: Path) -> Path:
    """One row per run: INFO_COLUMNS, the training length and swept config values (`config.KEY`), every
    scalar result (summary first, then the rest sorted), then position_loss/L as JSON lists."""
    keys = study_keys(runs)
    swept = {k for study in keys.values() for k in study}
    config_keys = sorted(swept | {SEQ_LEN_KEY}, key=natural_key)
    metric_keys = sorted({k for r in runs for k in r.metrics} - set(SUMMARY_METRICS), key=natural_key)
    series_keys = sorted({k for r in runs for k in r.series}, key=natural_key)
    header = [
        *INFO_COLUMNS,
        *(CONFIG_PREFIX + k for k in config_keys),
        *SUMMARY_METRICS,
        *metric_keys,
        *series_keys,
    ]
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for r in runs:
            info = {"run": r.name, "study": r.study, "label": _label(r, keys[r.study]), "status": r.status}
            info |= {"error": r.error, "encoding": r.encoding, "seed": "" if r.seed is None else r.seed}
            info |= r.info
            writer.writerow(
                [info[c] for c in INFO_COLUMNS]
                + [r.config.get(k, "") for k in config_keys]
                + [r.metrics.get(k, "") for k in (*SUMMARY_METRICS, *metric_keys)]
                + [json.dumps(r.series[k]) if k in r.series else "" for k in series_keys]
            )
    return path


def copy_configs(runs: Sequence[RunRecord], out_dir: Path) -> list[str]:
    """Copy each run's config.yaml to `out_dir/<run name>.yaml`; returns the runs without one."""
    out_dir.mkdir(parents=True, exist_ok=True)
    missing = []
    for r in runs:
        target = out_dir / f"{r.name}.yaml"
        if r.config_path is None:
            missing.append(r.name)
        elif not (target.exists() and target.samefile(r.config_path)):
            shutil.copyfile(r.config_path, target)
    return missing


def _join(*parts: str) -> str:
    return ", ".join(p for p in parts if p)


def _counted(values: Iterable[str]) -> str:
    counts: dict[str, int] = {}
    for v in values:
        if v:
            counts[v] = counts.get(v, 0) + 1
    return "; ".join(f"`{v}` ({n} runs)" for v, n in counts.items()) or "unknown"


def wall_time_line(runs: Sequence[RunRecord]) -> str:
    """The jobs' wall times summed (a sequential sweep's duration, less process start-ups) and their range."""
    times = [r.metrics["wall_time_s"] for r in runs if "wall_time_s" in r.metrics]
    if not times:
        return "not recorded"
    return (
        f"{sum(times) / 3600:.2f} h summed over {len(times)} runs "
        f"({min(times):.0f}–{max(times):.0f} s per run)"
    )


def write_report(runs: Sequence[RunRecord], out_dir: Path) -> Path:
    """Write report.md, runs.csv, the plots and configs/ into `out_dir`; returns the report.md path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    table = group_rows(runs)
    failed = [r for r in runs if not r.finished]
    lines = [
        "# Results report",
        "",
        f"{len(runs)} runs: {len(runs) - len(failed)} finished, {len(failed)} failed or unfinished.",
        "",
        f"- Git commit(s): {_counted(r.info['git_commit'] for r in runs)}",
        f"- Machine(s): {_counted(r.info['machine'] for r in runs)}",
        f"- Device, precision: {_counted(_join(r.info['device'], r.info['precision']) for r in runs)}",
        f"- Wall time: {wall_time_line(runs)}",
        "",
    ]
    for study, rows in table.items():
        lines += [f"## Study `{study}`", "", *study_table(rows), ""]
    if table:
        lines += ["## Plots", "", *write_plots(table, out_dir)]
    else:
        lines += ["No finished runs: no tables and no plots.", ""]
    lines += ["## Failed runs", "", "Every run whose status is not `finished`.", ""]
    if failed:
        lines += [_md_row(["run", "status", "encoding", "error"]), _md_row(["---"] * 4)]
        lines += [
            _md_row([r.name, r.status, r.encoding, r.error or "(no error recorded: still running or killed)"])
            for r in failed
        ]
    else:
        lines.append("None.")
    missing = copy_configs(runs, out_dir / "configs")
    lines += [
        "",
        "## Files",
        "",
        "- `runs.csv`: one row per run (finished or not) with every scalar result and the swept config "
        "values (`config.KEY`); `position_loss/L` columns hold JSON lists.",
        "- `configs/<run>.yaml`: the resolved config of each run"
        + (f" (none for: {', '.join(missing)})" if missing else "")
        + ".",
    ]
    write_csv(runs, out_dir / "runs.csv")
    report = out_dir / "report.md"
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: `python scripts/report.py DIR [DIR ...] --out results/NAME`; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="scripts/report.py",
        description="Tables, CSV, plots and configs from run directories, sweeps or a report's runs.csv.",
    )
    parser.add_argument("paths", nargs="+", type=Path, help="run/sweep directories, or report folders")
    parser.add_argument("--out", type=Path, default=Path("results/report"), help="output folder")
    args = parser.parse_args(argv)
    try:
        runs = collect_runs(args.paths)
        report = write_report(runs, args.out)
    except ReportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{report}: {len(runs)} runs")
    return 0
