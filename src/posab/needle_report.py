"""Retrieval summary of runs with a passkey stage: the needle by length beside the same run's perplexity,
and the stage's key-loss and probe curves.

    python scripts/needle_report.py outputs/multirun/SWEEP [RUN_DIR ...] --out results/needle_pilot

Writes needle.md (one row per run: needle accuracy, retrieval gain and attention mass at each length, the
per-digit accuracy, the stage's end and timing, and perplexity at each length measured before the stage),
needle_by_length.png (accuracy, gain and perplexity against length) and stage_curves.png (key loss and
probe accuracy against stage step, from each run's metrics.jsonl). The general report (`scripts/report.py`)
gives the heatmaps, runs.csv and configs of the same runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.ticker import ScalarFormatter

from posab.io import write_text
from posab.plots import new_figure, save_figure
from posab.report import ReportError, find_runs, run_names
from posab.report.markdown import markdown_table
from posab.summary import cell


@dataclass
class StageRun:
    """One run with a passkey stage: its results, and its stage's curves from metrics.jsonl."""

    name: str
    label: str
    results: dict[str, Any]
    key_loss: list[tuple[int, float]]  # (stage step, mean key loss per digit over the last log_every steps)
    probes: list[tuple[int, float]]  # (stage step, greedy key accuracy on the fixed probe examples)

    @property
    def eval(self) -> dict[str, Any]:
        return self.results.get("eval") or {}

    @property
    def stage(self) -> dict[str, Any]:
        return self.results.get("passkey_stage") or {}

    def lengths(self) -> list[int]:
        return (self.eval.get("needle/grid") or {}).get("lengths", [])


def stage_curve(metrics_path: Path, lm_steps: int) -> list[tuple[int, float]]:
    """(stage step, train/needle_loss) from the stage's lines of a run's metrics.jsonl (the last value
    logged for each step: a resumed stage logs some steps twice)."""
    curve: dict[int, float] = {}
    for line in metrics_path.read_text().splitlines():
        record = json.loads(line)
        if "passkey/length" in record and "train/needle_loss" in record:
            curve[int(record["step"]) - lm_steps] = float(record["train/needle_loss"])
    return sorted(curve.items())


def load_stage_run(run_dir: Path, name: str) -> StageRun | None:
    """The run, or None (named on stderr) while it is not finished."""
    results = json.loads((run_dir / "results.json").read_text())
    if results.get("status") != "finished":
        print(f"skipped {run_dir}: status {results.get('status')!r}, not finished", file=sys.stderr)
        return None
    if not results.get("passkey_stage"):
        raise ReportError(f"{run_dir} has no passkey stage (results.json has no `passkey_stage`)")
    lm_steps = int((results.get("train") or {}).get("steps", 0))  # 0 from train.init_from
    return StageRun(
        name=name,
        label=str(results.get("encoding", name)),
        results=results,
        key_loss=stage_curve(run_dir / "metrics.jsonl", lm_steps),
        probes=[(int(s), float(a)) for s, a in results["passkey_stage"].get("probes", [])],
    )


def run_row(run: StageRun) -> list[str]:
    """One table row: per-length needle accuracy | gain | attention mass, then perplexity per length."""
    e, lengths = run.eval, run.lengths()
    steps = run.stage.get("curriculum", {}).get("steps", [0])
    last_start = sum(steps[:-1])  # probes taken while the stage trained at its last length
    probes = [acc for step, acc in run.probes if step > last_start]
    cells = [run.label]
    cells += [cell(e.get(f"needle/acc@{n}"), ".2f") for n in lengths]
    cells += [cell(e.get(f"needle/gain@{n}"), ".1f") for n in lengths]
    cells += [cell(e.get(f"needle/attn_mass@{n}"), ".2f") for n in lengths]
    cells += [
        cell(run.stage.get("needle_loss"), ".3f"),
        f"{min(probes):.2f}–{max(probes):.2f}" if probes else "–",
        cell(run.stage.get("time_s"), ".0f"),
        cell(run.results.get("wall_time_s"), ".0f"),
    ]
    cells += [cell(e.get(f"ppl/{n}"), ".2f") for n in lengths]
    return cells


def digit_row(run: StageRun) -> list[str]:
    """Accuracy of each key digit (teacher-forced argmax) at each length: which digit fails first."""
    e, digits = run.eval, sorted(k for k in run.eval if k.startswith("needle/digit_acc/d"))
    return [run.label] + [
        " ".join(cell(e.get(f"needle/digit_acc@{n}/d{d}"), ".2f") for d in range(len(digits)))
        for n in run.lengths()
    ]


def needle_markdown(runs: Sequence[StageRun]) -> str:
    lengths = runs[0].lengths()
    header = ["run", *(f"acc@{n}" for n in lengths), *(f"gain@{n}" for n in lengths)]
    header += [
        *(f"attn@{n}" for n in lengths),
        "stage key loss",
        "probe acc at last length",
        "stage s",
        "wall s",
    ]
    header += [f"ppl@{n}" for n in lengths]
    curricula = {
        f"lengths {c.get('lengths')}, steps {c.get('steps')}": None
        for c in (r.stage.get("curriculum", {}) for r in runs)
    }
    lines = [
        "# Needle in a haystack after the passkey stage",
        "",
        f"Stage curriculum: {'; '.join(curricula)} (runs in table order where they differ). "
        "acc@L: greedy passkey accuracy at input length L, mean over depths and trials (`needle/acc@L`); "
        "gain@L: log p(key | the needle holds it) − log p(key | the needle holds another key), nats "
        "(`needle/gain@L`, 0 = the needle is not read); attn@L: attention mass of the key positions on "
        "the needle's key, for the head that puts the most there (`needle/attn_mass@L`); stage key loss: "
        "nats per key digit over the stage's last logged steps (ln 10 = 2.30 is chance); probe acc: min–max "
        "of the greedy accuracy on the fixed probe examples at the stage's last length, over the probes "
        "taken while the stage trained at that length (stability from checkpoint to checkpoint); stage s / "
        "wall s: stage and whole-run seconds; ppl@L: perplexity of the language "
        "model before the stage (`ppl/L`).",
        "",
        *markdown_table(header, [run_row(r) for r in runs]),
        "",
        "## Accuracy of each key digit (d0 … d4) at each length",
        "",
        *markdown_table(["run", *(f"{n}" for n in lengths)], [digit_row(r) for r in runs]),
        "",
    ]
    return "\n".join(lines)


def plot_by_length(runs: Sequence[StageRun], path: Path) -> Path:
    fig = new_figure(15.0, 4.2)
    axes = fig.subplots(1, 3, gridspec_kw={"wspace": 0.3})
    panels = (("needle/acc@{}", "passkey accuracy"), ("needle/gain@{}", "retrieval gain (nats)"))
    for ax, (key, label) in zip(axes, (*panels, ("ppl/{}", "perplexity (before the stage)")), strict=True):
        for i, run in enumerate(runs):
            lengths = run.lengths()
            values = [run.eval.get(key.format(n), np.nan) for n in lengths]
            ax.plot(lengths, values, marker="o", color=f"C{i % 10}", label=run.label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(runs[0].lengths(), [str(n) for n in runs[0].lengths()])
        ax.set_xlabel("input length (tokens)")
        ax.set_ylabel(label)
    axes[2].set_yscale("log")
    for axis in (axes[2].yaxis.set_major_formatter, axes[2].yaxis.set_minor_formatter):
        axis(ScalarFormatter())
    axes[2].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize="small")
    return save_figure(fig, path)


def plot_stage_curves(runs: Sequence[StageRun], path: Path) -> Path:
    fig = new_figure(13.0, 4.2)
    loss_ax, probe_ax = fig.subplots(1, 2)
    for i, run in enumerate(runs):
        colour = f"C{i % 10}"
        if run.key_loss:
            steps, losses = zip(*run.key_loss, strict=True)
            loss_ax.plot(steps, losses, color=colour, label=run.label)
        if run.probes:
            steps, accuracy = zip(*run.probes, strict=True)
            probe_ax.plot(steps, accuracy, marker=".", color=colour, label=run.label)
    loss_ax.axhline(np.log(10), color="k", linestyle="--", label="chance (ln 10)")
    loss_ax.set_yscale("log")
    loss_ax.set_xlabel("stage step")
    loss_ax.set_ylabel("key loss (nats per digit)")
    probe_ax.set_xlabel("stage step")
    probe_ax.set_ylabel("probe accuracy at the last curriculum length")
    probe_ax.set_ylim(-0.03, 1.03)
    handles, labels = loss_ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    return save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("paths", nargs="+", type=Path, help="run directories or sweeps with a passkey stage")
    parser.add_argument("--out", type=Path, required=True, help="folder for needle.md and the plots")
    args = parser.parse_args(argv)
    try:
        run_dirs = find_runs(args.paths)
        loaded = [load_stage_run(d, n) for d, n in zip(run_dirs, run_names(run_dirs), strict=True)]
    except ReportError as err:
        parser.exit(2, f"error: {err}\n")
    runs = [run for run in loaded if run is not None]
    if not runs:
        parser.exit(2, "error: no finished run with a passkey stage\n")
    labels = [r.label for r in runs]
    for run in runs:
        if labels.count(run.label) > 1:  # e.g. recipes tried on one encoding: the run's name tells them apart
            run.label = f"{run.label} [{run.name}]"
    args.out.mkdir(parents=True, exist_ok=True)
    write_text(args.out / "needle.md", needle_markdown(runs))
    plot_by_length(runs, args.out / "needle_by_length.png")
    plot_stage_curves(runs, args.out / "stage_curves.png")
    print(f"wrote {args.out / 'needle.md'}, needle_by_length.png, stage_curves.png")
    return 0
