"""`posab bench decoding`: cached decoding against the full forward pass, for every encoding.

    posab bench decoding [--quick] [--out DIR] [--lengths 512,2048] [--steps 32] [--encodings A,B]
                         [--threads N] [--no-progress]

For every encoding (conf/encoding) on the benchmark's model (the default, `model=small`; `--quick`: the tiny
model at prompt lengths 32 and 96, 4 steps) and every prompt length L: one row (batch 1, fp32) with

- prefill_ms: the prompt in one cached call (after an untimed one);
- cached_ms / full_ms: the median per-token time of `--steps` greedy decoding steps after a warm-up step,
  a cached step (the new token alone against the cache) and, interleaved with it on the same tokens, the
  full forward pass over the whole sequence so far (what decoding without a cache costs per token);
  speedup = full_ms / cached_ms;
- cache_mib: `KVCache.nbytes()` after the last timed step (keys and values of every layer, the positions);
- cached_peak_mib / full_peak_mib: the peak PyTorch CPU memory of one more cached step and of one more full
  forward pass (`measure.peak_memory`: allocations during the call, weights and the cache held before it
  not counted; a cached step's includes a new buffer for each layer's keys and values when the cache
  doubles, `LayerCache.extend`);
- max_rel_diff: the largest error of the cached logits against the full forward's, over every step, as a
  share of the full logits' scale: max |cached - full| / max |full| (fp32 rounding only, ~1e-7).

The decoded tokens are the greedy choices of the cached logits; their sentence and paragraph indices
continue the synthetic structure of the prompt (`inputs.synthetic_batch`). Writes decoding.md and
decoding.csv into `--out` (default results/bench/decoding; outputs/bench_quick/decoding with --quick).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from posab.bench.inputs import posab_model, synthetic_batch
from posab.bench.measure import MIB, peak_memory
from posab.bench.output import FULL_OUT, QUICK_OUT, markdown_table, write_csv
from posab.bench.progress import Progress
from posab.bench.settings import Settings, positive
from posab.cache import KVCache
from posab.data import Batch
from posab.decoding import prefill
from posab.model import DecoderLM
from posab.paths import encoding_names

QUICK_LENGTHS, QUICK_STEPS = (32, 96), 4  # around the quick training length, 64
FULL_LENGTHS, FULL_STEPS = (512, 2048), 32
WARMUP_STEPS = 1


@dataclass
class Decoding:
    """One decoding run's measurements, step by step."""

    prefill_s: float
    cached_s: list[float]
    full_s: list[float]
    errors: list[float]  # max |cached - full| / max |full| of each step's logits
    cache_bytes: int = 0
    cached_peak: int = 0
    full_peak: int = 0


def timed(fn: Callable[[], Tensor]) -> tuple[Tensor, float]:
    """fn's result and its wall time (s)."""
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def relative_error(cached: Tensor, full: Tensor) -> float:
    """max |cached - full| / max |full|, in float64."""
    cached, full = cached.double(), full.double()
    return float((cached - full).abs().max() / full.abs().max().clamp_min(1e-30))


def step_pair(
    model: DecoderLM, batch: Batch, cache: KVCache, tokens: Tensor
) -> tuple[Callable[[], Tensor], Callable[[], Tensor]]:
    """The cached step that adds `tokens`' last token to `cache`, and the full forward over all `tokens`
    (1, n): each returns the last position's logits (1, V)."""
    n = tokens.shape[1]
    sentence, paragraph = batch.sentence[:, :n], batch.paragraph[:, :n]  # (1, n) each

    def cached() -> Tensor:
        return model(tokens[:, -1:], sentence[:, -1:], paragraph[:, -1:], cache=cache)[:, -1]

    def full() -> Tensor:
        return model(tokens, sentence, paragraph)[:, -1]

    return cached, full


@torch.inference_mode()
def decode(model: DecoderLM, length: int, steps: int) -> Decoding:
    """Prefill a synthetic prompt of `length` tokens (twice: a warm-up), then `WARMUP_STEPS` warm-up and
    `steps` timed greedy steps, cached and full in turn, then one more of each under `peak_memory`."""
    batch = synthetic_batch(1, length + WARMUP_STEPS + steps + 1)
    cache, tokens = KVCache(), batch.inputs[:, :length]  # (1, L)
    indices = (batch.sentence[:, :length], batch.paragraph[:, :length])
    prefill(model, KVCache(), tokens, indices)  # warm-up: first-call costs are not the prefill's
    logits, prefill_s = timed(lambda: prefill(model, cache, tokens, indices))
    run = Decoding(prefill_s, [], [], [])
    for step in range(WARMUP_STEPS + steps + 1):
        tokens = torch.cat([tokens, logits.argmax(dim=-1, keepdim=True)], dim=1)  # (1, n + 1)
        cached, full = step_pair(model, batch, cache, tokens)
        if step == WARMUP_STEPS + steps:  # one more step, for the memory
            run.cache_bytes = cache.nbytes()
            run.full_peak, run.cached_peak = peak_memory(full), peak_memory(cached)
            break
        reference, full_s = timed(full)
        logits, cached_s = timed(cached)
        run.errors.append(relative_error(logits, reference))
        if step >= WARMUP_STEPS:
            run.full_s.append(full_s)
            run.cached_s.append(cached_s)
    return run


def row(name: str, length: int, run: Decoding) -> dict[str, Any]:
    cached_ms = statistics.median(run.cached_s) * 1e3
    full_ms = statistics.median(run.full_s) * 1e3
    return {
        "encoding": name,
        "prompt": length,
        "decoded": len(run.cached_s),
        "prefill_ms": run.prefill_s * 1e3,
        "cached_ms": cached_ms,
        "full_ms": full_ms,
        "speedup": full_ms / cached_ms,
        "cache_mib": run.cache_bytes / MIB,
        "cached_peak_mib": run.cached_peak / MIB,
        "full_peak_mib": run.full_peak / MIB,
        "max_rel_diff": max(run.errors),
    }


def measure(
    settings: Settings, lengths: Sequence[int], steps: int, progress: Progress
) -> list[dict[str, Any]]:
    """One row per encoding and prompt length."""
    rows = []
    for name in progress.over(settings.encoding_names(), "decoding"):
        model = posab_model(settings.config(name)).eval()
        for length in lengths:
            progress.note(f"L={length}")
            rows.append(row(name, length, decode(model, length, steps)))
    return rows


def report(rows: list[dict[str, Any]], settings: Settings, steps: int) -> str:
    """decoding.md: what was measured, and the table."""
    model = "tiny" if settings.quick else "the default (small)"
    return (
        "# Cached decoding vs the full forward pass\n\n"
        f"Model: {model}, fp32, batch 1, threads {torch.get_num_threads()}; per-token medians of {steps} "
        "greedy steps after a warm-up step (`posab.bench.decoding`).\n\n" + markdown_table(rows) + "\n"
    )


def lengths_list(text: str) -> tuple[int, ...]:
    values = tuple(int(part) for part in text.split(",") if part.strip())
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive prompt lengths, e.g. 512,2048")
    return values


def encodings_list(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [name for name in names if name not in encoding_names()]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown encoding(s) {unknown}; pick from {encoding_names()}")
    return names


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="posab bench decoding", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="the tiny model, short prompts (for the tests)")
    parser.add_argument("--out", type=Path, help="output folder (default results/bench/decoding)")
    parser.add_argument("--lengths", type=lengths_list, help="prompt lengths (default 512,2048)")
    parser.add_argument("--steps", type=positive, help="timed decoding steps (default 32; 4 with --quick)")
    parser.add_argument("--encodings", type=encodings_list, default=(), help="default: every encoding")
    parser.add_argument("--threads", type=positive, help="torch threads (default all cores; 1 with --quick)")
    parser.add_argument(
        "--no-progress", dest="progress", action="store_false", default=Progress.default(), help="no bars"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, print the table, write decoding.md and decoding.csv; returns the exit code."""
    args = parser().parse_args(argv)
    threads = args.threads or (1 if args.quick else None)
    if threads:
        torch.set_num_threads(threads)
    settings = Settings.build(args.quick, None, args.encodings)
    lengths = args.lengths or (QUICK_LENGTHS if args.quick else FULL_LENGTHS)
    steps = args.steps or (QUICK_STEPS if args.quick else FULL_STEPS)
    out = args.out or (QUICK_OUT if args.quick else FULL_OUT) / "decoding"
    rows = measure(settings, lengths, steps, Progress(args.progress))
    text = report(rows, settings, steps)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decoding.md").write_text(text, encoding="utf-8")
    write_csv(out / "decoding.csv", rows)
    print(text + f"\nwrote {out / 'decoding.md'} and decoding.csv")
    return 0
