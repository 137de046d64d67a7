"""Section 1: the learned biases alone, the modules' distinct-distance method against the all-pairs
reference of `posab.encodings.reference`, in three phases, at every evaluation length.

The distinct-distance method is the whole bias as the model builds it (`Encoding.dense_bias`): for the
hierarchical bias, the token level's Toeplitz plus the product of the sentence and paragraph factors (the
model's `full_mask`); its backward is the factors' gradient dU = G E that attention's backward computes."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import Tensor

from posab.bench.inputs import document_structure, posab_model
from posab.bench.measure import MIB, available_memory, median_times, peak_memory
from posab.bench.output import Result
from posab.bench.progress import Progress
from posab.bench.settings import CPU, Settings, precision
from posab.device import autocast
from posab.encodings import Encoding, Positions
from posab.encodings.reference import all_pairs_reference

BIASED = ("multiscale", "hierarchical")  # the encodings measured here (each has an all-pairs reference)
PHASES = ("build", "forward", "forward+backward")
MEMORY_SHARE = 0.5  # an all-pairs run predicted to need more than this share of free memory is skipped


def section(settings: Settings, progress: Progress) -> Result:
    result = Result("section1_bias", "1. Learned biases: distinct-distance vs all-pairs method")
    configs = {name: settings.config(name) for name in BIASED}
    encodings = {name: posab_model(cfg).encoding for name, cfg in configs.items()}
    previous: dict[tuple[str, str], tuple[int, float]] = {}  # (encoding, phase) -> last all-pairs peak
    cases = [(name, length) for name, cfg in configs.items() for length in cfg.eval.lengths]
    for name, length in progress.over(cases, "section 1"):
        dtype = precision(configs[name])
        result.rows += bias_rows(name, encodings[name], length, dtype, previous, settings, progress)
    return result


def structured_positions(length: int) -> Positions:
    """One sequence (batch 1) with the synthetic corpus's sentences and paragraphs (seeded)."""
    sentence, paragraph = document_structure(1, length, torch.Generator().manual_seed(0))
    return Positions.build(length, CPU, 0, sentence, paragraph)


def bias_rows(
    name: str,
    encoding: Encoding,
    length: int,
    dtype: torch.dtype | None,
    previous: dict[tuple[str, str], tuple[int, float]],
    settings: Settings,
    progress: Progress,
) -> list[dict[str, Any]]:
    """One row per phase for one encoding at one length. `previous` maps (encoding, phase) to the last
    (length, all-pairs peak bytes) measured, and is updated."""
    reference = all_pairs_reference(encoding)
    if reference is None:
        raise ValueError(f"{name} has no all-pairs reference bias (posab.encodings.reference)")
    pos = structured_positions(length)
    distinct, all_pairs = partial(encoding.dense_bias, pos), partial(reference, pos)
    with torch.inference_mode(), autocast(CPU, dtype):
        expected = distinct()
    grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1)).to(expected.dtype)
    ours, theirs = bias_phases(encoding, distinct, grad, dtype), bias_phases(encoding, all_pairs, grad, dtype)
    rows, notes = [], []
    for phase in PHASES:
        progress.note(phase)
        note = skip_note(previous.get((name, phase)), length)
        measured = compare_bias_methods(ours[phase], None if note else theirs[phase], settings)
        if not note:
            previous[name, phase] = (length, measured["all_pairs_peak_mib"] * MIB)
        rows.append({"encoding": name, "length": length, "phase": phase, **measured})
        notes.append(note)
    difference = math.nan if notes[0] else bias_difference(all_pairs, expected, dtype)
    return [row | {"max_abs_diff": difference, "note": note} for row, note in zip(rows, notes, strict=True)]


def bias_phases(
    encoding: Encoding, bias: Callable[[], Tensor], grad: Tensor, dtype: torch.dtype | None
) -> dict[str, Callable[[], None]]:
    """The three measured runs of one bias method, under the training autocast."""

    def build() -> None:
        with torch.inference_mode(), autocast(CPU, dtype):
            bias()

    def forward() -> None:
        with autocast(CPU, dtype):
            bias()

    def forward_backward() -> None:
        encoding.zero_grad(set_to_none=True)
        with autocast(CPU, dtype):
            out = bias()
        out.backward(grad)

    return dict(zip(PHASES, (build, forward, forward_backward), strict=True))


def skip_note(previous: tuple[int, float] | None, length: int) -> str:
    """Why the all-pairs run is skipped at `length` ("" when it is not): its peak, extrapolated as L^2
    from the previous (length, peak bytes), would exceed MEMORY_SHARE of the available memory."""
    budget = MEMORY_SHARE * available_memory()
    predicted = previous[1] * (length / previous[0]) ** 2 if previous else 0.0
    if budget and predicted > budget:
        return f"all-pairs skipped: predicted peak {predicted / 2**30:.1f} GiB > {budget / 2**30:.1f} GiB"
    return ""


def compare_bias_methods(
    distinct: Callable[[], None], all_pairs: Callable[[], None] | None, settings: Settings
) -> dict[str, float]:
    """Peak memory (one profiled run each) and interleaved median times of the two methods; NaN for the
    all-pairs method when it is None (skipped)."""
    fns = [distinct] if all_pairs is None else [distinct, all_pairs]
    missing = [math.nan] * (2 - len(fns))
    peaks = [peak_memory(fn) / MIB for fn in fns] + missing
    times = median_times(fns, settings.warmup, settings.repeats) + missing
    return {
        "distinct_s": times[0],
        "all_pairs_s": times[1],
        "time_ratio": times[1] / times[0],
        "distinct_peak_mib": peaks[0],
        "all_pairs_peak_mib": peaks[1],
        "memory_ratio": peaks[1] / peaks[0] if peaks[0] else math.nan,
    }


def bias_difference(all_pairs: Callable[[], Tensor], expected: Tensor, dtype: torch.dtype | None) -> float:
    """Largest |all-pairs - distinct| over the bias: the reference computes the same function."""
    with torch.inference_mode(), autocast(CPU, dtype):
        return float((all_pairs().float() - expected.float()).abs().max())
