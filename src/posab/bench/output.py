"""What a benchmark run writes, and where: one CSV per section, targets.csv and bench.md (every table,
the machine and the method); results/bench/ for a full run, outputs/bench_quick/ for a quick one."""

from __future__ import annotations

import csv
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from posab.bench.kernels import kernel_facts
from posab.bench.settings import Settings, dtype_name, precision
from posab.bench.targets import Target

FULL_OUT = Path("results/bench")  # the committed tables of the last full run
QUICK_OUT = Path("outputs/bench_quick")  # a quick run's scratch folder: never the committed tables

METHOD = """\
- Time: wall time (`time.perf_counter`), the median of the timed runs after the warm-up runs; runs that
  are compared (section 1: the two methods; section 2: all encodings; section 4: both libraries;
  section 7: every kernel at every chunk) are interleaved round-robin, so that a change in machine load
  hits all of them alike.
- Training step (sections 2, 4, 5): `posab.training.Trainer.step` itself, as training takes it (a batch
  drawn by the run's sampler, forward under autocast, backward, gradient clipping, AdamW, the schedule),
  on a synthetic split of random tokens with sentences and paragraphs; x-transformers' model goes through
  the same Trainer.
- Peak memory: the high-water mark of bytes held by PyTorch CPU tensors allocated during one run of
  the measured code (one extra run before the timed ones), from the allocation and free events that
  `torch.profiler` records with `profile_memory=True`. Tensors alive before the run (weights, inputs)
  are not counted, nor is memory outside PyTorch's CPU allocator (Python objects, thread stacks).
- Section 1: one sequence (batch 1) with a sentence every ~60 and a paragraph every ~600 tokens; the
  all-pairs reference is skipped at a length where its peak, extrapolated as L^2 from the previous
  length, would exceed half the available memory (the row says so). `max_abs_diff` checks that the
  reference computes the same bias.
- Section 5: model FLOPs per step = 6 N T + 12 n_layers L d T (N: non-embedding parameters, the tied
  LM head not counted; T: tokens per step; the attention term counts QK^T and AV forward and backward
  without halving for the causal mask, the PaLM convention); share = achieved FLOP/s / the peak of
  square matmuls in the training dtype.
"""


@dataclass
class Result:
    """One section's table (`key`: its CSV's name), or why it was skipped; `files`: more text files the
    section writes next to its CSV (name -> text)."""

    key: str
    title: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: str | None = None
    files: dict[str, str] = field(default_factory=dict)


def output_folder(out: Path | None, quick: bool) -> Path:
    """`--out` when given; else results/bench for a full run and outputs/bench_quick for a quick one, so
    that a quick run never overwrites the committed tables."""
    if out is not None:
        return out
    return QUICK_OUT if quick else FULL_OUT


def cell(value: Any) -> str:
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def section_markdown(result: Result) -> str:
    body = result.skipped or markdown_table(result.rows)
    return f"## {result.title}\n\n{body}\n"


def targets_markdown(targets: list[Target]) -> str:
    return "## Targets\n\n" + markdown_table([target.row() for target in targets]) + "\n"


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_section(folder: Path, result: Result) -> None:
    """The section's CSV; a skipped section removes an earlier run's, which must not pass for this run's."""
    for name, text in result.files.items():
        (folder / name).write_text(text, encoding="utf-8")
    table = folder / f"{result.key}.csv"
    if result.rows:
        write_csv(table, result.rows)
    else:
        table.unlink(missing_ok=True)


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine(settings: Settings) -> list[dict[str, Any]]:
    dtype = dtype_name(precision(settings.config()))
    facts = {
        "CPU": cpu_model(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        **kernel_facts(),
        "dtype": f"{dtype} autocast" if dtype == "bf16" else "fp32",
        "mode": "quick" if settings.quick else "full",
        "warm-up / timed runs": f"{settings.warmup} / {settings.repeats}",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    return [{"item": key, "value": value} for key, value in facts.items()]


def report(results: list[Result], targets: list[Target], settings: Settings) -> str:
    """bench.md: the machine, the method, every section's table and the targets."""
    parts = ["# posab benchmark\n", markdown_table(machine(settings)) + "\n", "## Method\n", METHOD]
    parts += [section_markdown(result) for result in results]
    if targets:
        parts.append(targets_markdown(targets))
    return "\n".join(parts)
