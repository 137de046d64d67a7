"""What `posab check-device` prints and writes: a header naming the machine and the method, one markdown
table row per encoding x precision, the notes behind every verdict that is not a plain pass, and the
same rows as check_device.csv."""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path

import torch

from posab.bench.device_checks import FAIL, PASS, PRECISIONS, TOLERANCES, Plan, Row, bf16_skip
from posab.bench.device_step import WARMUP
from posab.bench.output import cpu_model
from posab.config import Config
from posab.device import bf16_supported
from posab.io import write_text

COLUMNS = (
    "encoding",
    "precision",
    "err@L",
    "err@4L",
    "grad err",
    "tolerance",
    "verdict",
    "ms/step",
    "tokens/s",
    "peak MiB",
)


def device_name(device: torch.device) -> str:
    """The device and what it is: the GPU's name, capability and memory, or the CPU's model and threads."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        memory = props.total_memory / 2**30
        return f"{device} ({props.name}, compute capability {props.major}.{props.minor}, {memory:.0f} GiB)"
    if device.type == "cpu":
        threads, kernels = torch.get_num_threads(), torch.backends.cpu.get_cpu_capability()
        return f"cpu ({cpu_model()}, {os.cpu_count()} cores, {threads} torch threads, {kernels} kernels)"
    return str(device)


def bf16_support(device: torch.device) -> str:
    """How this device runs bf16 autocast: native, emulated (a CPU without native bf16 kernels), or not."""
    skip = bf16_skip(device)
    if skip is not None:
        return f"no ({skip}): skipped"
    if device.type == "cpu" and not bf16_supported(device):
        return "emulated (no native AVX-512 bf16 kernels on this CPU)"
    return "native"


def header(plan: Plan, cfg: Config, model_name: str) -> str:
    """The lines above the table: machine, software, precisions, model, sizes and method."""
    short, long = plan.lengths
    m = cfg.model
    cuda = f", CUDA {torch.version.cuda}" if torch.version.cuda else ""
    matmul = torch.get_float32_matmul_precision()
    tolerances = ", ".join(f"{name} {TOLERANCES[name]:.0e}" for name in PRECISIONS)
    lines = [
        f"# posab check-device: {plan.device} against the CPU in float64",
        "",
        f"- device: {device_name(plan.device)}",
        f"- torch {torch.__version__}{cuda}; float32 matmul precision: {matmul}",
        f"- precisions: fp32 yes; bf16 autocast {bf16_support(plan.device)}",
        f"- model: {model_name} ({m.n_layers} layers, d={m.d_model}, {m.n_heads} heads), weights from seed "
        f"{plan.seed}; batch {plan.batch}; L = {short} (training length), 4L = {long}",
        "- err: max |device - reference| / max |reference|, the reference being the same weights and batch "
        "on the CPU in float64",
        "- err@L, err@4L: the logits (evaluation mode); grad err: the gradient of the next-token loss at L, "
        "every parameter (training mode)",
        f"- verdict: pass when all is finite and each err is within the tolerance: {tolerances}",
        f"- step: forward + backward + AdamW at L, median of {plan.repeats} after {WARMUP} warm-up steps; "
        f"peak MiB: {peak_method(plan.device)}",
    ]
    return "\n".join(lines)


def peak_method(device: torch.device) -> str:
    if device.type == "cuda":
        return "torch.cuda.max_memory_allocated during one step, above what was allocated before it"
    return "PyTorch CPU allocator bytes during one step (torch.profiler), above what was held before it"


def number(value: float, style: str) -> str:
    """A table cell: n/a for a value not measured, inf as is, else `value` in `style` (a format spec)."""
    if math.isnan(value):
        return "n/a"
    return "inf" if math.isinf(value) else format(value, style)


def table_cells(row: Row) -> list[str]:
    return [
        row.encoding,
        row.precision,
        number(row.err_l, ".1e"),
        number(row.err_4l, ".1e"),
        number(row.grad_err, ".1e"),
        f"{row.tolerance:.0e}",
        row.verdict,
        number(row.ms_per_step, ".1f"),
        number(row.tokens_per_s, ",.0f"),
        number(row.peak_mib, ".2f"),
    ]


def markdown(rows: list[Row]) -> str:
    """The table, the notes (every row's reasons and remarks) and a one-line summary."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(table_cells(row)) + " |" for row in rows]
    notes = [f"- {row.encoding} {row.precision}: {note}" for row in rows for note in row.notes]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join([*lines, "", summary(rows)])


def summary(rows: list[Row]) -> str:
    failed = [f"{row.encoding} {row.precision}" for row in rows if row.verdict == FAIL]
    passed = sum(row.verdict == PASS for row in rows)
    skipped = len(rows) - passed - len(failed)
    tail = f" ({skipped} skipped)" if skipped else ""
    if failed:
        return f"FAIL: {len(failed)} of {len(rows)} checks failed ({', '.join(failed)}){tail}"
    return f"pass: all {passed} checks passed{tail}"


def csv_text(rows: list[Row], plan: Plan) -> str:
    buffer = io.StringIO()
    records = [row.csv_row(plan) for row in rows]
    writer = csv.DictWriter(buffer, fieldnames=list(records[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return buffer.getvalue()


def write(folder: Path, report: str, rows: list[Row], plan: Plan) -> list[Path]:
    """check_device.md (the printed report) and check_device.csv in `folder`, each written atomically."""
    return [
        write_text(folder / "check_device.md", report + "\n"),
        write_text(folder / "check_device.csv", csv_text(rows, plan)),
    ]
