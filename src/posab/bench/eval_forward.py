"""Section 3: one evaluation forward pass (inference mode) of every encoding at every evaluation length,
with the evaluation batch rule max(1, eval.batch_tokens // L): time and peak memory (also over ALiBi's)."""

from __future__ import annotations

from typing import Any

import torch

from posab.bench.inputs import posab_model, synthetic_batch
from posab.bench.measure import MIB, median_times, peak_memory
from posab.bench.output import Result
from posab.bench.progress import Progress
from posab.bench.settings import CPU, Settings, precision
from posab.config import Config
from posab.device import autocast
from posab.model import DecoderLM


def section(settings: Settings, progress: Progress) -> Result:
    result = Result("section3_eval_forward", "3. Evaluation forward pass for every encoding")
    for name in progress.over(settings.encoding_names(), "section 3"):
        cfg = settings.config(name)
        model = posab_model(cfg).eval()
        for length in cfg.eval.lengths:
            progress.note(f"L={length}")
            result.rows.append(forward_row(name, model, cfg, length, settings))
    add_memory_ratios(result.rows)
    return result


def add_memory_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's peak memory over ALiBi's at its length (`peak_ratio_to_alibi`, NaN without ALiBi): the
    memory an evaluation with an additive bias needs, its (1, H, L, L) mask, as the reference."""
    alibi = {row["length"]: row["peak_mib"] for row in rows if row["encoding"] == "alibi"}
    for row in rows:
        reference = alibi.get(row["length"])
        row["peak_ratio_to_alibi"] = row["peak_mib"] / reference if reference else float("nan")


def forward_row(name: str, model: DecoderLM, cfg: Config, length: int, settings: Settings) -> dict[str, Any]:
    """The evaluation forward pass of encoding `name`'s model on one batch of `length` tokens."""
    batch_size = max(1, cfg.eval.batch_tokens // length)
    batch = synthetic_batch(batch_size, length)

    def forward() -> None:
        with torch.inference_mode(), autocast(CPU, precision(cfg)):
            model(batch.inputs, batch.sentence, batch.paragraph)

    peak = peak_memory(forward) / MIB
    seconds = median_times([forward], settings.warmup, settings.repeats)[0]
    return {
        "encoding": name,
        "length": length,
        "batch": batch_size,
        "forward_s": seconds,
        "tokens_per_s": batch_size * length / seconds,
        "peak_mib": peak,
    }
