"""The report folder: report.md (provenance, one table per study and its paired differences, the plots,
failed runs, the files), runs.csv, paired_differences.csv, the PNGs and configs/ (a copy of each run's
config)."""

from __future__ import annotations

import re
import shutil
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import pandas as pd

from posab.report.curves import plot_training_curves, trained_rows
from posab.report.figures import plot_needle, plot_position_loss, plot_ppl_vs_length, plot_shift
from posab.report.grouping import Row, group_rows
from posab.report.markdown import MISSING, markdown_table, study_table
from posab.report.records import (
    VAL_CURVE_COLUMN,
    WINDOW_STARTS_COLUMN,
    WINDOWS_FILE,
    WINDOWS_PREFIX,
    ReportError,
    RunRecord,
)
from posab.report.rundirs import join_nonempty
from posab.report.runs_csv import write_csv
from posab.report.stats import (
    DRAWS,
    PAIRED_REFERENCES,
    PairedDifferences,
    paired_differences,
    reference_rows,
)

PAIRED_CSV = "paired_differences.csv"
PAIRED_HEADER = (
    "encoding, swept values",
    "vs",
    "length",
    "Δ loss",
    "95% interval",
    "excludes 0",
    "Δ tail loss",
    "95% interval",
    "excludes 0",
)
PAIRED_LEGEND = (
    f"Δ loss: the row's mean per-window loss (`loss/L` of `{WINDOWS_FILE}`, over its seeds and the "
    "evaluation windows) minus the reference's, nats per token; negative = lower loss than the reference",
    "Δ tail loss: the same for the loss on the positions past the training length (`loss_tail/L`); "
    f"{MISSING} at the training length and below",
    f"95% interval: 2.5th and 97.5th percentiles of a paired bootstrap with {DRAWS:,} draws; each draw "
    "resamples the windows with replacement, the same windows for the row and its reference (every run "
    "scored the same windows: the pairing), and each row's seeds with replacement, independently per row (a "
    "row of one seed adds no seed-to-seed variation)",
    "excludes 0: yes when the interval lies wholly above 0 or wholly below 0, no when it contains 0",
    f"`{PAIRED_CSV}`: every comparison, with the seeds of each row and the number of windows",
)

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


def _paired_cells(line: pd.Series | None) -> list[str]:
    """Difference, interval and `excludes 0` of one comparison, signed with 3 decimals; MISSING for none."""
    if line is None:
        return [MISSING] * 3
    interval = f"[{line['low']:+.3f}, {line['high']:+.3f}]"
    return [f"{line['difference']:+.3f}", interval, "yes" if line["excludes_zero"] else "no"]


def paired_table(frame: pd.DataFrame) -> list[str]:
    """One study's paired differences (`paired_differences` lines) as a Markdown table: one line per row,
    reference and length, the loss then the tail loss."""
    body = []
    for (row, reference, length), group in frame.groupby(["row", "reference", "length"], sort=False):
        by_metric = {line["metric"]: line for _, line in group.iterrows()}
        loss, tail = (_paired_cells(by_metric.get(metric)) for metric in ("loss", "loss_tail"))
        body.append([row, reference, str(length), *loss, *tail])
    return markdown_table(PAIRED_HEADER, body)


def _reference_legend(references: Sequence[str]) -> str:
    return (
        f"vs: the reference row ({' or '.join(f'`{r}`' for r in references)}: the row of that label, or "
        "else that encoding's only row); every row of the study but RoPE scaling views is compared with each "
        "reference but itself"
    )


def _paired_section(study: str, paired: PairedDifferences, references: Sequence[str]) -> list[str]:
    """The paired differences of one study, its legend and the comparisons not made; none without either."""
    frame = paired.frame[paired.frame["study"] == study]
    notes = paired.notes.get(study, [])
    if frame.empty and not notes:
        return []
    lines = [f"### Paired differences (study {study})", ""]
    if not frame.empty:
        legend = [_reference_legend(references), *PAIRED_LEGEND]
        lines += [*paired_table(frame), "", "Legend:", "", *(f"- {item}" for item in legend), ""]
    if notes:
        lines += ["Not compared:", "", *(f"- {note}" for note in notes), ""]
    return lines


def _check_references(table: Mapping[str, Sequence[Row]], references: Sequence[str]) -> None:
    """A ReportError naming a reference other than the defaults that no study has, and the rows there are."""
    for name in references:
        if name in PAIRED_REFERENCES or any(reference_rows(rows, [name]) for rows in table.values()):
            continue
        labels = sorted({row.label for rows in table.values() for row in rows if not row.scaling})
        raise ReportError(
            f"reference {name!r} is no row label (nor the encoding of a study's only row of it); "
            f"the rows are: {'; '.join(labels)}"
        )


def _failed_section(failed: Sequence[RunRecord]) -> list[str]:
    lines = ["## Failed runs", "", "Every run whose status is not `finished`.", ""]
    if not failed:
        return [*lines, "None."]
    unknown = "(no error recorded: still running or killed)"
    cells = [[r.name, r.status, r.encoding, r.error or unknown] for r in failed]
    return [*lines, *markdown_table(["run", "status", "encoding", "error"], cells)]


def _files_section(runs: Sequence[RunRecord], missing_configs: Sequence[str], has_paired: bool) -> list[str]:
    """What each file of the folder holds; the optional columns and files only where they are written."""
    curves = (
        f" `{VAL_CURVE_COLUMN}` holds [step, val/loss] pairs as JSON."
        if any(r.val_curve for r in runs)
        else ""
    )
    windows = (
        f" `{WINDOWS_PREFIX}KEY` columns hold each run's per-window losses (KEY as in `{WINDOWS_FILE}`: "
        f"`loss/L`, `loss_tail/L`, ...) and `{WINDOW_STARTS_COLUMN}` the windows' start offsets, as JSON "
        "lists."
    )
    paired = (
        f"- `{PAIRED_CSV}`: one line per paired difference (study, row, reference, length, metric) with its "
        "interval, the seeds of each row and the number of windows."
    )
    return [
        "",
        "## Files",
        "",
        "- `runs.csv`: one row per run (finished or not) with every scalar result and the swept config "
        f"values (`config.KEY`); `position_loss/L` columns hold JSON lists.{curves}"
        + (windows if any(r.windows for r in runs) else ""),
        *([paired] if has_paired else []),
        "- `configs/<run>.yaml`: the resolved config of each run"
        + (f" (none for: {', '.join(missing_configs)})" if missing_configs else "")
        + ".",
    ]


def write_report(
    runs: Sequence[RunRecord], out_dir: Path, references: Sequence[str] = PAIRED_REFERENCES
) -> Path:
    """Write report.md, runs.csv, paired_differences.csv (where there are paired differences against the
    `references` rows), the plots and configs/ into `out_dir`; returns the report.md path."""
    table = group_rows(runs)
    _check_references(table, references)
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = [r for r in runs if not r.finished]
    lines = _provenance(runs, len(failed))
    paired = paired_differences(table, references)
    for study, rows in table.items():
        section = _paired_section(study, paired, references)
        lines += [f"## Study `{study}`", "", *study_table(rows), "", *section]
    if table:
        lines += ["## Plots", "", *write_plots(table, out_dir)]
    else:
        lines += ["No finished runs: no tables and no plots.", ""]
    lines += _failed_section(failed)
    has_paired = not paired.frame.empty
    lines += _files_section(runs, copy_configs(runs, out_dir / "configs"), has_paired)
    write_csv(runs, out_dir / "runs.csv")
    if has_paired:
        paired.frame.to_csv(out_dir / PAIRED_CSV, index=False, encoding="utf-8")
    report = out_dir / "report.md"
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return report
