"""The report folder: report.md (provenance, one table per study, the plots, failed runs, the files),
runs.csv, the PNGs and configs/ (a copy of each run's config)."""

from __future__ import annotations

import re
import shutil
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from posab.report.curves import plot_training_curves, trained_rows
from posab.report.figures import plot_needle, plot_position_loss, plot_ppl_vs_length, plot_shift
from posab.report.grouping import Row, group_rows
from posab.report.markdown import markdown_table, study_table
from posab.report.records import VAL_CURVE_COLUMN, RunRecord
from posab.report.rundirs import join_nonempty
from posab.report.runs_csv import write_csv

Plot = tuple[str, Callable[[Path], Path | None], str]  # (file name, draw into a path, why it may be skipped)


def named_rows(table: Mapping[str, Sequence[Row]]) -> dict[str, Row]:
    """Every row by the name plots show: its label, prefixed by the study when there are several."""
    multi = len(table) > 1
    return {f"{s}: {row.label}" if multi else row.label: row for s, study in table.items() for row in study}


def report_plots(rows: Mapping[str, Row]) -> list[Plot]:
    """The plots of these rows; the training curves only where a run has one (not from an older runs.csv)."""
    plots: list[Plot] = []
    if trained_rows(rows):
        plots.append(("training_curves.png", lambda p: plot_training_curves(rows, p), ""))
    plots += [
        ("ppl_vs_length.png", lambda p: plot_ppl_vs_length(rows, p), "no `ppl/L` results"),
        ("position_loss.png", lambda p: plot_position_loss(rows, p), "no `position_loss/L` results"),
        ("shift.png", lambda p: plot_shift(rows, p), "no `shift/...` results"),
    ]
    plots += [
        (f"needle_{_file_part(name)}.png", lambda p, n=name: plot_needle(n, rows[n], p), "no needle cells")
        for name in rows
    ]
    return plots


def write_plots(table: Mapping[str, Sequence[Row]], out_dir: Path) -> list[str]:
    """Draw every plot into `out_dir`; returns one Markdown line per plot (an image, or why it is skipped)."""
    lines = []
    for file, draw, missing in report_plots(named_rows(table)):
        written = draw(out_dir / file)
        lines += [
            f"![{file}]({file})" if written else f"`{file}` skipped: {missing} in the finished runs",
            "",
        ]
    return lines


def _file_part(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("_")


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


def _counted(values: Iterable[str]) -> str:
    counts = Counter(v for v in values if v)
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


def _provenance(runs: Sequence[RunRecord], failed: int) -> list[str]:
    devices = (join_nonempty(r.info["device"], r.info["precision"]) for r in runs)
    return [
        "# Results report",
        "",
        f"{len(runs)} runs: {len(runs) - failed} finished, {failed} failed or unfinished.",
        "",
        f"- Git commit(s): {_counted(r.info['git_commit'] for r in runs)}",
        f"- Machine(s): {_counted(r.info['machine'] for r in runs)}",
        f"- Device, precision: {_counted(devices)}",
        f"- Wall time: {wall_time_line(runs)}",
        "",
    ]


def _failed_section(failed: Sequence[RunRecord]) -> list[str]:
    lines = ["## Failed runs", "", "Every run whose status is not `finished`.", ""]
    if not failed:
        return [*lines, "None."]
    unknown = "(no error recorded: still running or killed)"
    cells = [[r.name, r.status, r.encoding, r.error or unknown] for r in failed]
    return [*lines, *markdown_table(["run", "status", "encoding", "error"], cells)]


def _files_section(missing_configs: Sequence[str], has_curves: bool) -> list[str]:
    curves = f" `{VAL_CURVE_COLUMN}` holds [step, val/loss] pairs as JSON." if has_curves else ""
    return [
        "",
        "## Files",
        "",
        "- `runs.csv`: one row per run (finished or not) with every scalar result and the swept config "
        f"values (`config.KEY`); `position_loss/L` columns hold JSON lists.{curves}",
        "- `configs/<run>.yaml`: the resolved config of each run"
        + (f" (none for: {', '.join(missing_configs)})" if missing_configs else "")
        + ".",
    ]


def write_report(runs: Sequence[RunRecord], out_dir: Path) -> Path:
    """Write report.md, runs.csv, the plots and configs/ into `out_dir`; returns the report.md path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    table = group_rows(runs)
    failed = [r for r in runs if not r.finished]
    lines = _provenance(runs, len(failed))
    for study, rows in table.items():
        lines += [f"## Study `{study}`", "", *study_table(rows), ""]
    if table:
        lines += ["## Plots", "", *write_plots(table, out_dir)]
    else:
        lines += ["No finished runs: no tables and no plots.", ""]
    lines += _failed_section(failed)
    lines += _files_section(copy_configs(runs, out_dir / "configs"), any(r.val_curve for r in runs))
    write_csv(runs, out_dir / "runs.csv")
    report = out_dir / "report.md"
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return report
