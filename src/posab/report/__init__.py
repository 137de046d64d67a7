"""Results report over run directories: Markdown tables, a CSV of every run, plots and the configs.

    posab report outputs/multirun/SWEEP [DIR ...] --out results/NAME

Each DIR is a run directory, a multirun sweep directory or any folder holding run directories (found
recursively: a folder with both `results.json` and `config.yaml`), or a report folder written before (it
holds `runs.csv`; the report is then rendered again from that CSV). Only local files are read.

Rows: runs are grouped by study (`logger.group` when set, else `experiment`), then by encoding and by
every other swept value (`grouping`). Every metric is the mean ± sample std (ddof=1) over the seeds of a
row (`stats`). Plots draw one line (or heatmap) per row, named by its label, prefixed by the study when
the report covers several studies; panels of whole encodings, a colour per row of a panel (`styles`).

Modules, in the order data flows through them:

- `records`: RunRecord, ReportError, the CSV column names
- `rundirs`: finding and reading run directories (results.json, config.yaml, metrics.jsonl)
- `runs_csv`: runs.csv written and read back
- `scaling`, `grouping`: RoPE scaling views; rows by study, encoding, swept values and precision
- `stats`, `resampling`: mean, std and bands over the seeds of a row; the paired differences with their
  hierarchical bootstrap, permutation test on the seeds, Holm's correction and verdicts, on `eval.split`
  and on each evaluation corpus
- `claimed`: a study's claim verdicts (`--claims`; `posab claims` writes them, `posab.studies`)
- `flat`: extrapolation as a count, flat in k of n runs (judged on the tail past the training length) with
  a Wilson interval and the counts at nearby cutoffs
- `columns`, `markdown`: the metric catalog (each evaluator's columns) and the Markdown tables
- `styles`, `figures`, `curves`: line styles; evaluation figures; training curves
- `document`, `cli`: report.md and the report folder; the command line

Imports no torch (its metric columns come from `posab.catalog`); the studies' commands that build on it
live in `posab.studies`, which this package never imports.
"""

from posab.report.cli import main
from posab.report.records import ReportError
from posab.report.rundirs import find_runs, run_names

__all__ = ["ReportError", "find_runs", "main", "run_names"]  # posab report, needle_report
