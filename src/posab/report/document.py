"""The report folder: report.md (provenance, one table per study, its flat counts and its paired
differences, the plots, failed runs, the files), runs.csv, paired_differences.csv, the PNGs and configs/ (a
copy of each run's config)."""

from __future__ import annotations

import re
import shutil
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import pandas as pd

from posab.report.audit import audit_section
from posab.report.content_audit import content_audit_section
from posab.report.curves import plot_training_curves, trained_rows
from posab.report.figures import plot_needle, plot_position_loss, plot_ppl_vs_length, plot_shift
from posab.report.flat import flat_section
from posab.report.grouping import Row, group_rows
from posab.report.markdown import MISSING, markdown_table, study_table
from posab.report.records import (
    VAL_CURVE_COLUMN,
    WINDOW_DOCUMENTS_COLUMN,
    WINDOW_STARTS_COLUMN,
    WINDOWS_FILE,
    WINDOWS_PREFIX,
    ReportError,
    RunRecord,
)
from posab.report.resampling import BATCH, EXACT_SPLITS, MAX_DRAWS, MC_BOUND, PERMUTATIONS
from posab.report.rundirs import join_nonempty
from posab.report.runs_csv import write_csv
from posab.report.same_weights import same_weights_section
from posab.report.stats import (
    ALPHA,
    EXPLORATORY,
    INDISTINGUISHABLE,
    OPPOSITE,
    ORDERED,
    PAIRED_REFERENCES,
    SAME_WEIGHTS,
    SEED_MATCHED,
    SUGGESTIVE,
    UNPAIRED,
    ClaimedLines,
    PairedDifferences,
    paired_differences,
    reference_rows,
)

PAIRED_CSV = "paired_differences.csv"
PER_METRIC = ("95% interval", "excludes 0", "p seeds", "verdict")  # after each metric's Δ
PAIRED_HEADER = (
    "encoding, swept values",
    "vs",
    "length",
    "design",
    "seeds",
    "unmatched",
    "Δ loss",
    *PER_METRIC,
    "Δ tail loss",
    *PER_METRIC,
)
PAIRED_LEGEND = (
    f"Δ loss: the row's mean per-window loss (`loss/L` of `{WINDOWS_FILE}`, over its seeds and the "
    "evaluation windows) minus the reference's, nats per token; negative = lower loss than the reference",
    "Δ tail loss: the same for the loss on the positions past the training length (`loss_tail/L`); "
    f"{MISSING} at the training length and below",
    f"design: `{SAME_WEIGHTS}` (the two rows are the same trained models read two ways: every pair of runs "
    f"of one seed has the same training and validation loss to the last bit), `{SEED_MATCHED}` (runs of one "
    "seed under one training protocol: a seed fixes the training windows and their order for every "
    "encoding, and the shared weights' initialisation for the encodings without parameters of their own), "
    f"`{UNPAIRED}` (fewer than two seeds in common, or different protocols)",
    "seeds: the runs compared, row vs reference (a paired design compares the seeds both rows have)",
    "unmatched: what differs between the compared runs besides the arm: precision, cpu (model), kernels "
    "(torch's CPU capability), commit (the training's); `?` where some run did not record it; `matched` "
    "when none differs (`posab.report.matching`)",
    "95% interval: 2.5th and 97.5th percentiles of a hierarchical bootstrap (Efron & Tibshirani "
    "1993; Davison & Hinkley 1997, §3.8). Each draw resamples with replacement (1) the documents of the "
    f"evaluation text (`{WINDOW_DOCUMENTS_COLUMN}`: the document holding most of each window's targets), as "
    "many as there are; (2) within each drawn document, as many of its windows as it holds, the same "
    "documents and windows for the row and its reference (every run scored the same windows); (3) the "
    "seeds: for a paired design the pairs, one draw for both rows; unpaired, each row's seeds on their own. "
    "Its value is the mean over the drawn windows of the row's drawn-seed mean minus the reference's. Draws "
    f"are added {BATCH:,} at a time until the Monte Carlo error of both ends is below {MC_BOUND} nats, or "
    f"{MAX_DRAWS:,} draws are made; an end's Monte Carlo error is half the width of the order-statistic "
    "95% confidence interval of its percentile",
    "excludes 0: yes when the interval lies wholly above 0 or wholly below 0, no when it contains 0; "
    "`(unstable)` when 0 lies within an end ± its Monte Carlo error, so that more draws could change it",
    "p seeds: the design's exact two-sided test on the seeds. Paired: the sign-flip test on the per-seed "
    "differences (each run's mean loss over the windows, row minus reference; every one of the 2^n sign "
    "assignments; five pairs that all point one way give 1/16). Unpaired: the permutation test on the "
    "per-seed means (every split of the a + b runs into groups of a and b; fully separated seeds give "
    f"2 / C(a + b, a)). Above {EXACT_SPLITS} runs, {PERMUTATIONS:,} random draws. A claimed comparison "
    "adds, in parentheses, its claim, and its one-sided p Holm-adjusted within the claim's declared family "
    "(`results/study/claims/`, `posab claims`): the same number in every report that holds it",
    f"verdict: for a claimed comparison, its claim's (`{ORDERED}`, `{SUGGESTIVE}`, `{OPPOSITE}` or "
    f"`{INDISTINGUISHABLE}`: the claims' legend); for every other one, exploratory: `{SUGGESTIVE}` when the "
    f"interval excludes 0 or p seeds < {ALPHA} (unadjusted), else `{INDISTINGUISHABLE}`, and never "
    f"`{ORDERED}`: it depends on its runs alone, not on the rows beside it in the folder",
    f"`{PAIRED_CSV}`: every comparison, with its design, test, unmatched factors and id (`comparison`: the "
    "runs compared, metric, length and corpus), the runs of each row, the numbers of windows and documents, "
    "the draws, the Monte Carlo error of each end, the p-values, the family and claim, and the verdict",
)

Plot = tuple[str, Callable[[Path], Path | None], str]  # (file name, draw into a path, why it may be skipped)


def named_rows(table: Mapping[str, Sequence[Row]]) -> dict[str, Row]:
    """Every row by the name plots show: its label, prefixed by the study when there are several."""
    multi = len(table) > 1
    return {f"{s}: {row.label}" if multi else row.label: row for s, study in table.items() for row in study}


def report_plots(rows: Mapping[str, Row], references: Sequence[str] = PAIRED_REFERENCES) -> list[Plot]:
    """The plots of these rows (the perplexity figure draws the `references` rows in every panel); the
    training curves only where a run has one (not from an older runs.csv)."""
    plots: list[Plot] = []
    if trained_rows(rows):
        plots.append(("training_curves.png", lambda p: plot_training_curves(rows, p), ""))
    plots += [
        ("ppl_vs_length.png", lambda p: plot_ppl_vs_length(rows, p, references), "no `ppl/L` results"),
        ("position_loss.png", lambda p: plot_position_loss(rows, p), "no `position_loss/L` results"),
        ("shift.png", lambda p: plot_shift(rows, p), "no `shift/...` results"),
    ]
    plots += [
        (f"needle_{_file_part(name)}.png", lambda p, n=name: plot_needle(n, rows[n], p), "no needle cells")
        for name in rows
    ]
    return plots


def write_plots(
    table: Mapping[str, Sequence[Row]], out_dir: Path, references: Sequence[str] = PAIRED_REFERENCES
) -> list[str]:
    """Draw every plot into `out_dir` (`report_plots`); returns one Markdown line per plot (an image, or why
    it is skipped)."""
    lines = []
    for file, draw, missing in report_plots(named_rows(table), references):
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
    """Each value and its number of runs, then the runs without one; "unknown" when none has one."""
    given = list(values)
    counts = Counter(v for v in given if v)
    unknown = len(given) - sum(counts.values())
    parts = [f"`{v}` ({n} runs)" for v, n in counts.items()]
    return "; ".join([*parts, *([f"unknown ({unknown} runs)"] if parts and unknown else [])]) or "unknown"


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
        *_code_lines(runs),
        f"- Machine(s): {_counted(r.info['machine'] for r in runs)}",
        f"- Device, precision: {_counted(devices)}",
        f"- CPU capability (torch's kernels): {_counted(r.info.get('cpu_capability', '') for r in runs)}",
        f"- Math libraries (MKL, oneDNN: their ISA settings, versions, the CPU's flags): "
        f"{_counted(r.info.get('math_isa', '') for r in runs)}",
        f"- Package versions: {_counted(r.info.get('versions', '') for r in runs)}",
        f"- Wall time: {wall_time_line(runs)}",
        "",
    ]


def _code_lines(runs: Sequence[RunRecord]) -> list[str]:
    """Uncommitted changes (at the end and at the start), the commit each run started with and its resume
    step; unknown for runs that predate these records (or ran without git)."""
    dirty = {"true": "yes", "false": "no"}
    resumed = {"null": "not resumed"}

    def values(key: str, names: dict[str, str]) -> list[str]:
        """The runs' cells of `key` as `names` names them; "" (unknown) for an empty or null cell."""
        cells = [r.info.get(key, "") for r in runs]
        return [names.get(c, "" if c in ("", "null") else c) for c in cells]

    return [
        f"- Uncommitted changes: {_counted(values('git_dirty', dirty))}",
        f"- Git commit(s) at the start: {_counted(r.info.get('git_commit_start', '') for r in runs)}",
        f"- Uncommitted changes at the start: {_counted(values('git_dirty_start', dirty))}",
        f"- Resumed from step: {_counted(values('resumed_from_step', resumed))}",
    ]


def _paired_cells(line: pd.Series | None) -> list[str]:
    """Difference, interval, `excludes 0`, p-value and verdict of one comparison; MISSING for none."""
    if line is None:
        return [MISSING] * 5
    interval = f"[{line['low']:+.3f}, {line['high']:+.3f}]"
    excludes = ("yes" if line["excludes_zero"] else "no") + (" (unstable)" if line["unstable"] else "")
    claimed = f" ({line['claim']}: Holm {line['p_holm']:.3f})" if line["family"] != EXPLORATORY else ""
    return [
        f"{line['difference']:+.3f}",
        interval,
        excludes,
        f"{line['p_seeds']:.3f}{claimed}",
        str(line["verdict"]),
    ]


def paired_table(frame: pd.DataFrame) -> list[str]:
    """One study's paired differences (`paired_differences` lines) as a Markdown table: one line per row,
    reference and length, the loss then the tail loss."""
    body = []
    for (row, reference, length), group in frame.groupby(["row", "reference", "length"], sort=False):
        by_metric = {line["metric"]: line for _, line in group.iterrows()}
        loss, tail = (_paired_cells(by_metric.get(metric)) for metric in ("loss", "loss_tail"))
        first = group.iloc[0]
        seeds = f"{first['seeds_row']} vs {first['seeds_reference']}"
        design = f"{first['design']}"
        marks = first["unmatched"] or "matched"
        body.append([row, reference, str(length), design, seeds, marks, *loss, *tail])
    return markdown_table(PAIRED_HEADER, body)


def _reference_legend(references: Sequence[str]) -> str:
    return (
        f"vs: the reference row ({' or '.join(f'`{r}`' for r in references)}: the row of that label, or "
        "else that encoding's only row); every row of the study but RoPE scaling views is compared with each "
        "reference but itself"
    )


def _paired_section(study: str, paired: PairedDifferences, references: Sequence[str]) -> list[str]:
    """The paired differences of one study, what they resample, their legend and the comparisons not made;
    none without either."""
    frame = paired.frame[paired.frame["study"] == study]
    notes = paired.notes.get(study, [])
    if frame.empty and not notes:
        return []
    lines = [f"### Paired differences (study {study})", ""]
    if not frame.empty:
        legend = [_reference_legend(references), *PAIRED_LEGEND]
        lines += [*_resampled(frame, paired.windows_only.get(study, [])), ""]
        for corpus, on_corpus in frame.groupby("corpus", sort=False):
            if corpus:
                lines += [
                    f"On the evaluation corpus `{corpus}` (`eval.corpora`; the runs that scored it):",
                    "",
                ]
            lines += [*paired_table(on_corpus), ""]
        lines += ["Legend:", "", *(f"- {item}" for item in legend), ""]
    if notes:
        lines += ["Not compared:", "", *(f"- {note}" for note in notes), ""]
    return lines


def _resampled(frame: pd.DataFrame, windows_only: Sequence[str]) -> list[str]:
    """What the intervals of one study resample: its documents and windows, or the windows alone where the
    runs do not record each window's document."""
    with_documents = frame.dropna(subset=["documents"]).drop_duplicates(["documents", "windows"])
    units = [
        f"{int(d)} documents holding {w} windows" for d, w in with_documents[["documents", "windows"]].values
    ]
    lines = [f"Resampled: {'; '.join(units)}, and the seeds of each row."] if units else []
    if not windows_only:
        return lines
    missing = (
        f"The runs of {'; '.join(windows_only)} do not all record each window's document"
        if units
        else "No run of this study records each window's document"
    )
    return [
        *lines,
        f"{missing} (`{WINDOW_DOCUMENTS_COLUMN}`; `scripts/window_documents.py` adds it to a report folder): "
        f"{'their' if units else 'every'} interval resamples the windows alone (each as its own document) "
        "and the seeds. It takes the windows as independent, so where documents differ in effect it is too "
        "narrow.",
    ]


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
        f"`loss/L`, `loss_tail/L`, ...), `{WINDOW_STARTS_COLUMN}` the windows' start offsets and "
        f"`{WINDOW_DOCUMENTS_COLUMN}` their documents (where recorded), as JSON lists."
    )
    paired = (
        f"- `{PAIRED_CSV}`: one line per paired difference (study, row, reference, length, metric) with its "
        "interval and its draws, the seed-level p-values, the verdict, the seeds of each row and the numbers "
        "of windows and documents."
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
    runs: Sequence[RunRecord],
    out_dir: Path,
    references: Sequence[str] = PAIRED_REFERENCES,
    claimed: ClaimedLines | None = None,
) -> Path:
    """Write report.md, runs.csv, paired_differences.csv (where there are paired differences against the
    `references` rows; a comparison `claimed` names, by id, takes its claim's verdict), the plots and
    configs/ into `out_dir`; returns the report.md path."""
    table = group_rows(runs)
    _check_references(table, references)
    paired = paired_differences(table, references, claimed)
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = [r for r in runs if not r.finished]
    lines = _provenance(runs, len(failed))
    for study, rows in table.items():
        section = [
            *flat_section(study, rows),
            *same_weights_section(study, rows),
            *audit_section(study, rows),
            *content_audit_section(study, rows),
        ]
        section += _paired_section(study, paired, references)
        lines += [f"## Study `{study}`", "", *study_table(rows), "", *section]
    if table:
        lines += ["## Plots", "", *write_plots(table, out_dir, references)]
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
