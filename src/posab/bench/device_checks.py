"""The rows of `posab check-device`: for one encoding, each precision's errors against the float64 CPU
reference, its verdict against the precision's tolerance (`TOLERANCES`, justified in
`posab.bench.check_device`), and its training step's speed and peak memory."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from posab.bench.device_numerics import (
    CPU,
    Inputs,
    Outputs,
    device_copy,
    finite,
    outputs,
    reference_copy,
    scale_error,
    seeded_model,
    structured_batch,
)
from posab.bench.device_step import step_cost
from posab.config import Config
from posab.device import bf16_supported, cpu_bf16_unavailable
from posab.model import DecoderLM

PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16}  # name -> autocast dtype
TOLERANCES = {"fp32": 1e-4, "bf16": 5e-2}  # max scale-relative error (posab.bench.check_device: why)
PASS, FAIL, SKIPPED = "pass", "FAIL", "skipped"
NAN = float("nan")


@dataclass(frozen=True)
class Plan:
    """What every encoding is checked with: the device, the training length L (logits also at 4L), the
    batch size, the seed of weights and batches, and the timed steps."""

    device: torch.device
    length: int
    batch: int = 2
    seed: int = 0
    repeats: int = 5

    @property
    def lengths(self) -> tuple[int, int]:
        return self.length, 4 * self.length

    def batches(self) -> dict[int, Inputs]:
        """One seeded batch per length (length -> inputs (B, length)); a different seed for each."""
        return {n: structured_batch(self.batch, n, self.seed + i) for i, n in enumerate(self.lengths)}


@dataclass(frozen=True)
class Row:
    """One encoding in one precision: errors (max |device - reference| / max |reference|), the verdict and
    why (`note`), and the training step's cost; NaN where not measured."""

    encoding: str
    precision: str
    err_l: float = NAN
    err_4l: float = NAN
    grad_err: float = NAN
    finite: bool = True
    verdict: str = PASS
    ms_per_step: float = NAN
    tokens_per_s: float = NAN
    peak_mib: float = NAN
    notes: list[str] = field(default_factory=list)

    @property
    def tolerance(self) -> float:
        return TOLERANCES[self.precision]

    def csv_row(self, plan: Plan) -> dict[str, Any]:
        """The row of check_device.csv: every number unrounded, the lengths and the tolerance named."""
        return {
            "encoding": self.encoding,
            "precision": self.precision,
            "length": plan.length,
            "err_L": self.err_l,
            "err_4L": self.err_4l,
            "grad_err": self.grad_err,
            "tolerance": self.tolerance,
            "finite": self.finite,
            "verdict": self.verdict,
            "ms_per_step": self.ms_per_step,
            "tokens_per_s": self.tokens_per_s,
            "peak_mib": self.peak_mib,
            "note": "; ".join(self.notes),
        }


def bf16_skip(device: torch.device) -> str | None:
    """Why bf16 autocast is not checked on `device`, or None: a GPU without bf16 is skipped, and so is a
    CPU whose torch cannot run bf16 attention in this process (`cpu_bf16_unavailable`); other CPUs
    run it, natively or emulated (slowly; the row's note says so)."""
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return f"{torch.cuda.get_device_name(device)} does not support bf16"
    return cpu_bf16_unavailable() if device.type == "cpu" else None


def precision_notes(device: torch.device, precision: str) -> list[str]:
    """What a reader should know about a row's numbers beyond its verdict."""
    if precision == "bf16" and device.type == "cpu" and not bf16_supported(device):
        return ["bf16 emulated on this CPU (no native AVX-512 bf16 kernels): slow; the rounding is bf16's"]
    return []


def judged(row: Row) -> Row:
    """`row` with its verdict: FAIL when an entry is not finite or an error exceeds the tolerance (the
    notes name which), else pass."""
    reasons = [] if row.finite else ["non-finite logits or gradient"]
    errors = {"err@L": row.err_l, "err@4L": row.err_4l, "grad err": row.grad_err}
    reasons += [
        f"{label} {value:.2e} > {row.tolerance:.0e}"
        for label, value in errors.items()
        if math.isnan(value) or value > row.tolerance
    ]
    return replace(row, verdict=FAIL if reasons else PASS, notes=[*reasons, *row.notes])


def measured_row(name: str, precision: str, measured: Outputs, reference: Outputs, plan: Plan) -> Row:
    """The errors of `measured` against `reference`, judged; the step's cost is added by the caller."""
    short, long = plan.lengths
    return judged(
        Row(
            name,
            precision,
            err_l=scale_error(measured.logits[short], reference.logits[short]),
            err_4l=scale_error(measured.logits[long], reference.logits[long]),
            grad_err=scale_error(measured.gradient, reference.gradient),
            finite=finite(measured),
            notes=precision_notes(plan.device, precision),
        )
    )


def check_precision(name: str, precision: str, model: DecoderLM, reference: Outputs, plan: Plan) -> Row:
    """One row: the device's copy of `model` in `precision` against the reference, then a fresh copy's
    training step timed. A device error (an operation the device cannot run) is a FAIL with its message."""
    skip = bf16_skip(plan.device) if precision == "bf16" else None
    if skip is not None:
        return Row(name, precision, verdict=SKIPPED, notes=[skip])
    dtype, batches = PRECISIONS[precision], plan.batches()
    try:
        measured = outputs(device_copy(model, plan.device), batches, plan.length, plan.device, dtype)
        row = measured_row(name, precision, measured, reference, plan)
        timed = device_copy(model, plan.device)
        cost = step_cost(timed, batches[plan.length], plan.device, dtype, plan.repeats)
    except RuntimeError as err:
        message = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return Row(name, precision, verdict=FAIL, notes=[f"raised {type(err).__name__}: {message}"])
    speed = {"ms_per_step": 1e3 * cost.seconds, "tokens_per_s": cost.tokens_per_s, "peak_mib": cost.peak_mib}
    return replace(row, **speed)


def check_encoding(name: str, cfg: Config, plan: Plan) -> list[Row]:
    """Every precision's row for encoding `name` (its run config `cfg`): weights drawn once from the plan's
    seed; the float64 CPU reference computed once and shared by the precisions."""
    model = seeded_model(cfg, plan.seed)
    reference = outputs(reference_copy(model), plan.batches(), plan.length, CPU, None)
    return [check_precision(name, precision, model, reference, plan) for precision in PRECISIONS]
