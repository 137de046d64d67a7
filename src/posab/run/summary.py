"""The short table a run (and `posab evaluate`) ends with: the numbers the run exists for.

Perplexity, tail and capped perplexity and needle accuracy and gain at each evaluation length; the shift
figures at each k; wall time, the run directory and the next commands. It reads results.json's scalars
only (no torch), so it prints the same table for a run and for its re-evaluation. A run without the
passkey stage shows no needle rows, only how to get them: a model trained on text alone sits at the
floor of the retrieval test (results.json keeps its numbers). A task run (`data=task`) shows its exact match
at seen and unseen lengths and at each instance length instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from posab.keys import key_lengths, metric_key, shift_sizes
from posab.results import is_number

LENGTH_ROWS = (  # (label, metric at one length: `ppl/L`, `needle/acc@L`, ..., format)
    ("ppl", "ppl", ".2f"),
    ("ppl tail", "ppl_tail", ".2f"),
    ("ppl capped", "ppl_capped", ".2f"),
    ("needle acc", "acc", ".2f"),
    ("needle gain", "gain", ".1f"),
)
NEEDLE_METRICS = ("acc", "gain")  # the needle rows of LENGTH_ROWS
NEEDLE_HINT = (
    "needle: no passkey stage in this run, so no retrieval to show (a model trained on text alone sits at "
    "the floor); +experiment=needle trains the stage and scores the needle grid"
)
SHIFT_ROWS = (  # (label, shift kind, metric, format)
    ("offset max|Δlogit|", "offset", "max_abs_logit", ".3g"),
    ("offset top-1 agree", "offset", "top1_agree", ".3f"),
    ("prefix Δloss", "prefix", "dloss", "+.3f"),
    ("context Δloss", "context", "dloss", "+.3f"),
)


def cell(value: Any, fmt: str) -> str:
    """A number in `fmt`, or – when the value is missing or not a number."""
    return format(float(value), fmt) if is_number(value) else "–"


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned first column, right-aligned numbers, two spaces between columns."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    return [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in (header, *rows)
    ]


def length_table(scalars: Mapping[str, Any], needle: bool = True) -> list[str]:
    """The run's metrics at each evaluation length (the perplexity's lengths, else the needle's), one row
    per metric it has; without the needle rows when `needle` is False."""
    lengths = key_lengths(scalars, "ppl") or key_lengths(scalars, "acc")
    rows = [
        [label, *(cell(scalars.get(metric_key(metric, n)), fmt) for n in lengths)]
        for label, metric, fmt in LENGTH_ROWS
        if any(metric_key(metric, n) in scalars for n in lengths) and (needle or metric not in NEEDLE_METRICS)
    ]
    return text_table(["length", *map(str, lengths)], rows) if rows else []


def shift_table(scalars: Mapping[str, Any]) -> list[str]:
    lines = []
    for label, kind, metric, fmt in SHIFT_ROWS:
        ks = shift_sizes(scalars, kind, metric)
        if ks:
            cells = [f"k={k}: {cell(scalars[metric_key(metric, shift=kind, k=k)], fmt)}" for k in ks]
            lines.append(f"{label:<20}" + "   ".join(cells))
    return lines


def task_lines(scalars: Mapping[str, Any]) -> list[str]:
    """A task run's exact match: seen and unseen lengths, then per instance length."""
    lengths = key_lengths(scalars, "exact")
    if not lengths:
        return []
    summary = [
        f"{label} {cell(scalars.get(metric_key(name)), '.3f')}"
        for label, name in (("seen lengths", "exact_seen"), ("unseen lengths", "exact_unseen"))
    ]
    rows = [lengths[i : i + 10] for i in range(0, len(lengths), 10)]  # ten instance lengths a line
    per_length = [
        f"  n={row[0]}..{row[-1]}: " + " ".join(cell(scalars[metric_key("exact", n)], ".2f") for n in row)
        for row in rows
    ]
    return ["task exact match: " + ", ".join(summary), *per_length]


def next_commands(run_dir: Path) -> list[str]:
    commands = [f"posab report {run_dir} --out results/NAME   # tables and plots"]
    commands += [f"wandb sync {path}" for path in sorted(run_dir.glob("wandb/offline-run-*"))]
    return commands


def summary_text(results: Mapping[str, Any], run_dir: Path) -> str:
    """The end-of-run table from a results.json dict (a run's, or a re-evaluation's with only `eval`). A
    run (it has a `status`) without a passkey stage gets NEEDLE_HINT instead of needle rows."""
    scalars = {k: v for k, v in (results.get("eval") or {}).items() if is_number(v)}
    head = [str(results[k]) for k in ("encoding", "status") if k in results]
    if "seed" in results:
        head.append(f"seed {results['seed']}")
    for key, label, fmt in (("val_loss", "val loss", ".3f"), ("wall_time_s", "wall", ".0f")):
        if is_number(results.get(key)):
            head.append(
                f"{label} {format(float(results[key]), fmt)}" + (" s" if key == "wall_time_s" else "")
            )
    staged = "status" not in results or bool(results.get("passkey_stage"))  # a re-evaluation: as it was
    task = task_lines(scalars)  # a task run: its accuracy, and no text rows or hint
    lines = ["", "posab: " + (", ".join(head) or "evaluation"), *task, *length_table(scalars, staged)]
    lines += [] if staged or task else [NEEDLE_HINT]
    shift = shift_table(scalars)
    if shift:
        lines += ["shift (inputs within the training length):", *shift]
    lines += [f"run directory: {run_dir}", "next:", *(f"  {c}" for c in next_commands(run_dir)), ""]
    return "\n".join(lines)
