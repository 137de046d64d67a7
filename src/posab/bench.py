"""Performance benchmark: bias construction, training steps, evaluation, a peer library, FLOP/s.

    python scripts/bench.py [--quick] [--out results/bench] [--sections 1,2,3,4,5] [--repeats N] [--threads N]

Sections (sizes from the composed config: the default model, train.seq_len x train.batch_size, and
eval.lengths; `--quick` swaps in the tiny model, L=64, batch 2 and lengths 64, 128):

1. The learned biases (multiscale, hierarchical) alone, at every eval length: the distinct-distance method
   of the modules against the design note's all-pairs method (the same MLP on every (i, j) pair, kept
   here only as the reference), in three phases: build (inference mode), forward (graph recorded) and
   forward+backward (a fixed upstream gradient into the MLP weights). Ratios: all-pairs / distinct.
2. One training step (forward, backward, clipping, AdamW) for every encoding; ratio to nope.
3. One evaluation forward pass (inference mode) for every encoding at every eval length, with the
   evaluation batch rule max(1, eval.batch_tokens // L).
4. The same training step in x-transformers (the `bench` extra) with the same sizes: rope vs its
   rotary_pos_emb, alibi vs alibi_pos_bias, multiscale vs dynamic_pos_bias; ratio posab / x-transformers.
5. Model FLOP/s of the default model's training step as a share of the measured matmul peak.

Every section runs under the training precision (bf16 autocast where the CPU has native bf16). Times are
medians of `--repeats` runs after warm-up runs; runs that are compared are interleaved round-robin, so
that a change in machine load hits all of them alike. Peak memory: see `peak_memory`.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib.util
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from torch import Tensor, nn
from torch.profiler import ProfilerActivity, profile

from posab.build import build_model, encoding_name
from posab.config import Config, load_config
from posab.data import Batch
from posab.data.tokenizer import VOCAB_SIZE
from posab.device import autocast, autocast_dtype
from posab.encodings import Encoding, Positions, encoding_optimizer
from posab.model import DecoderLM
from posab.paths import conf_dir, encoding_names
from posab.train import build_optimizer, lm_loss

CPU = torch.device("cpu")
MIB = 2**20
SENTENCE_TOKENS, PARAGRAPH_TOKENS = 60, 600  # mean sentence and paragraph lengths of the synthetic text
MEMORY_SHARE = 0.5  # an all-pairs run predicted to need more than this share of free memory is skipped
PHASES = ("build", "forward", "forward+backward")
BIAS_TARGETS = {"time_ratio": 100.0, "memory_ratio": 30.0}  # multiscale, all-pairs / distinct, at L=4096
STEP_TARGETS = {"sinusoidal": 1.10, "alibi": 1.10, "rope": 1.10, "multiscale": 1.25, "hierarchical": 1.40}
PEERS = {"rope": "rotary_pos_emb", "alibi": "alibi_pos_bias", "multiscale": "dynamic_pos_bias"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # the matmul peaks measured in section 5
PEER_TARGET = 0.6  # posab / x-transformers step time
SHARE_TARGET = 40.0  # % of the matmul peak


@dataclass(frozen=True)
class Settings:
    """What one benchmark run measures: config overrides and repetition counts."""

    quick: bool
    repeats: int
    warmup: int
    overrides: tuple[str, ...]
    matmul_size: int

    @staticmethod
    def build(quick: bool, repeats: int | None) -> Settings:
        if quick:
            overrides = (
                "model=tiny",
                "train.seq_len=64",
                "train.batch_size=2",
                "eval.lengths=[64,128]",
                "eval.batch_tokens=256",
                "eval.shift.prefix_lengths=[16,32]",  # below the quick training length
            )
            return Settings(True, repeats or 1, 1, overrides, 256)
        return Settings(False, repeats or 5, 2, (), 2048)


@dataclass(frozen=True)
class Target:
    """A goal from the issue; `value` None when it was not measured."""

    label: str
    value: float | None
    bound: float
    higher_is_better: bool
    unit: str = "x"

    @property
    def measured(self) -> bool:
        return self.value is not None and not math.isnan(self.value)

    def verdict(self) -> str:
        if self.value is None or not self.measured:
            return "not measured"
        gap = self.bound - self.value if self.higher_is_better else self.value - self.bound
        if gap <= 0:
            return "met"
        return f"missed by {gap:.1f} percentage points" if self.unit == "%" else f"missed by {gap:.3g}x"

    def row(self) -> dict[str, Any]:
        sign = ">=" if self.higher_is_better else "<="
        value = f"{self.value:.4g}{self.unit}" if self.value is not None and self.measured else "n/a"
        return {"target": f"{self.label} {sign} {self.bound:g}{self.unit}", "value": value}


@dataclass
class Result:
    """One section's table, its targets, or why it was skipped."""

    key: str
    title: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    skipped: str | None = None


# ----------------------------------------------------------------------------- measuring


def median_times(fns: Sequence[Callable[[], object]], warmup: int, repeats: int) -> list[float]:
    """Median wall time (s) of each function: `warmup` untimed runs each, then `repeats` rounds that run
    every function once, in turn (time.perf_counter)."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, samples in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
    return [statistics.median(samples) for samples in times]


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null: the profiler's C++ side prints a line at each start and stop."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_memory(fn: Callable[[], object]) -> int:
    """Peak bytes of PyTorch CPU tensors allocated during one call of `fn`, above what was held before.

    `torch.profiler` with `profile_memory=True` records every allocation and free of PyTorch's CPU
    allocator; the peak is the highest running sum of those events in time order. Tensors that exist
    before the call (weights, inputs) are not counted, nor is memory outside PyTorch's allocator.
    """
    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]"
    )
    running = peak = 0
    for _, nbytes in events:
        running += nbytes
        peak = max(peak, running)
    return peak


def available_memory() -> int:
    """Bytes the kernel reports as available (MemAvailable), or 0 where /proc/meminfo is missing."""
    meminfo = Path("/proc/meminfo")
    if not meminfo.is_file():
        return 0
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- inputs and models


def config(settings: Settings, encoding: str | None = None) -> Config:
    """The composed run config with the benchmark's overrides (and `encoding=NAME` when given)."""
    overrides = [*settings.overrides, *([f"encoding={encoding}"] if encoding else [])]
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return load_config(compose(config_name="config", overrides=overrides))


def precision(cfg: Config) -> torch.dtype | None:
    """The autocast dtype training uses on this CPU (None: fp32)."""
    return autocast_dtype(cfg.train.precision, CPU)


def document_structure(batch: int, length: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Sentence and paragraph indices (B, L): a sentence every ~60 tokens, a paragraph every ~600."""
    new_sentence = torch.rand(batch, length, generator=generator) < 1 / SENTENCE_TOKENS
    opens_paragraph = torch.rand(batch, length, generator=generator) < SENTENCE_TOKENS / PARAGRAPH_TOKENS
    return new_sentence.cumsum(1), (new_sentence & opens_paragraph).cumsum(1)


def synthetic_batch(batch: int, length: int) -> Batch:
    """Random tokens with realistic sentence and paragraph indices (seeded)."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB_SIZE, (batch, length + 1), generator=generator)
    sentence, paragraph = document_structure(batch, length, generator)
    return Batch(tokens[:, :-1], tokens[:, 1:], sentence, paragraph)


def posab_model(cfg: Config) -> DecoderLM:
    torch.manual_seed(0)
    return build_model(cfg, VOCAB_SIZE)


def peer_model(option: str, cfg: Config) -> nn.Module:
    """x-transformers' decoder with posab's sizes: d, depth, heads, head dim, FF ratio, no FF bias, tied
    embedding, no absolute positions; `option` its positional encoding. Flash attention except for
    dynamic_pos_bias, which x-transformers does not allow with it. Rotary over the full head dimension,
    as posab's RoPE."""
    from x_transformers import Decoder, TransformerWrapper

    m = cfg.model
    head_dim = m.d_model // m.n_heads
    extra: dict[str, Any] = {"rotary_emb_dim": head_dim} if option == "rotary_pos_emb" else {}
    layers = Decoder(
        dim=m.d_model,
        depth=m.n_layers,
        heads=m.n_heads,
        attn_dim_head=head_dim,
        ff_mult=m.mlp_ratio,
        ff_no_bias=True,
        attn_flash=option != "dynamic_pos_bias",
        **{option: True},
        **extra,
    )
    torch.manual_seed(0)
    return TransformerWrapper(
        num_tokens=VOCAB_SIZE,
        max_seq_len=cfg.train.seq_len,
        attn_layers=layers,
        use_abs_pos_emb=False,
        tie_embedding=True,
    )


def peer_loss(model: nn.Module, batch: Batch) -> Tensor:
    """The loss of `lm_loss` for a model that takes only tokens."""
    logits = model(batch.inputs)  # (B, T, V)
    return F.cross_entropy(logits.float().flatten(0, 1), batch.targets.flatten())


def train_step(model: nn.Module, loss_fn: Callable[[Batch], Tensor], cfg: Config) -> Callable[[], None]:
    """One optimizer step as the Trainer takes it: forward under autocast, backward, clipping, AdamW."""
    model.train()
    optimizer = build_optimizer(model, cfg.train, encoding_optimizer(cfg.encoding))
    batch = synthetic_batch(cfg.train.batch_size, cfg.train.seq_len)
    dtype = precision(cfg)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast(CPU, dtype):
            loss = loss_fn(batch)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        optimizer.step()

    return step


def posab_step(cfg: Config) -> Callable[[], None]:
    model = posab_model(cfg)
    return train_step(model, partial(lm_loss, model), cfg)


# ----------------------------------------------------------------------------- section 1: biases


BIASED = ("multiscale", "hierarchical")  # the encodings with an all-pairs reference (`reference_bias`)


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


def section_bias(settings: Settings) -> Result:
    result = Result("section1_bias", "1. Learned biases: distinct-distance vs all-pairs method")
    for name in BIASED:
        cfg = config(settings, name)
        encoding = posab_model(cfg).encoding
        previous: dict[str, tuple[int, float]] = {}
        for length in cfg.eval.lengths:
            result.rows += bias_rows(name, encoding, length, precision(cfg), previous, settings)
    result.targets = bias_targets(result.rows)
    return result


def bias_rows(
    name: str,
    encoding: Encoding,
    length: int,
    dtype: torch.dtype | None,
    previous: dict[str, tuple[int, float]],
    settings: Settings,
) -> list[dict[str, Any]]:
    """One row per phase for one encoding at one length (batch 1). `previous` maps each phase to the
    last (length, all-pairs peak bytes) measured, and is updated."""
    sentence, paragraph = document_structure(1, length, torch.Generator().manual_seed(0))
    pos = Positions.build(length, CPU, 0, sentence, paragraph)
    if encoding.reference_bias(pos) is None:
        raise ValueError(f"{name} has no all-pairs reference bias (Encoding.reference_bias)")
    distinct, all_pairs = partial(encoding.bias, pos), partial(encoding.reference_bias, pos)
    with torch.inference_mode(), autocast(CPU, dtype):
        expected = distinct()
    grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1)).to(expected.dtype)
    ours, theirs = bias_phases(encoding, distinct, grad, dtype), bias_phases(encoding, all_pairs, grad, dtype)
    rows = []
    for phase in PHASES:
        log(f"section 1: {name} L={length} {phase}")
        note = skip_note(previous.get(phase), length)
        measured = compare_bias_methods(ours[phase], None if note else theirs[phase], settings)
        if not note:
            previous[phase] = (length, measured["all_pairs_peak_mib"] * MIB)
        row = {"encoding": name, "length": length, "phase": phase, **measured}
        rows.append(row | {"max_abs_diff": math.nan, "note": note})
    if not rows[0]["note"]:
        difference = bias_difference(all_pairs, expected, dtype)
        for row in rows:
            row["max_abs_diff"] = difference
    return rows


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


def bias_targets(rows: list[dict[str, Any]]) -> list[Target]:
    """The multiscale targets at the longest length measured, in every phase."""
    multiscale = [row for row in rows if row["encoding"] == "multiscale"]
    length = max(row["length"] for row in multiscale)
    targets = []
    for row in (r for r in multiscale if r["length"] == length):
        for key, bound in BIAS_TARGETS.items():
            what = "time" if key == "time_ratio" else "peak memory"
            label = f"multiscale {row['phase']} L={length}: all-pairs / distinct {what}"
            targets.append(Target(label, row[key], bound, higher_is_better=True))
    return targets


# ----------------------------------------------------------------------------- section 2: training step


def section_train(settings: Settings) -> Result:
    result = Result("section2_train_step", "2. Training step time for every encoding")
    configs = {name: config(settings, name) for name in encoding_names()}
    log(f"section 2: {len(configs)} encodings, interleaved")
    steps = [posab_step(cfg) for cfg in configs.values()]
    times = dict(zip(configs, median_times(steps, settings.warmup, settings.repeats), strict=True))
    for name, cfg in configs.items():
        tokens = cfg.train.batch_size * cfg.train.seq_len
        result.rows.append(
            {
                "encoding": name,
                "length": cfg.train.seq_len,
                "batch": cfg.train.batch_size,
                "step_s": times[name],
                "tokens_per_s": tokens / times[name],
                "ratio_to_nope": times[name] / times["nope"],
            }
        )
    result.targets = [
        Target(f"{name} step time / nope", times[name] / times["nope"], bound, higher_is_better=False)
        for name, bound in STEP_TARGETS.items()
        if name in times
    ]
    return result


# ----------------------------------------------------------------------------- section 3: evaluation


def section_eval(settings: Settings) -> Result:
    result = Result("section3_eval_forward", "3. Evaluation forward pass for every encoding")
    for name in encoding_names():
        cfg = config(settings, name)
        model = posab_model(cfg).eval()
        for length in cfg.eval.lengths:
            log(f"section 3: {name} L={length}")
            batch_size = max(1, cfg.eval.batch_tokens // length)
            batch = synthetic_batch(batch_size, length)

            def forward(model: DecoderLM = model, batch: Batch = batch, cfg: Config = cfg) -> None:
                with torch.inference_mode(), autocast(CPU, precision(cfg)):
                    model(batch.inputs, batch.sentence, batch.paragraph)

            peak = peak_memory(forward) / MIB
            seconds = median_times([forward], settings.warmup, settings.repeats)[0]
            result.rows.append(
                {
                    "encoding": name,
                    "length": length,
                    "batch": batch_size,
                    "forward_s": seconds,
                    "tokens_per_s": batch_size * length / seconds,
                    "peak_mib": peak,
                }
            )
    return result


# ----------------------------------------------------------------------------- section 4: x-transformers


def section_peer(settings: Settings) -> Result:
    result = Result("section4_x_transformers", "4. Training step: posab vs x-transformers")
    if importlib.util.find_spec("x_transformers") is None:
        result.skipped = "x-transformers is not installed (pip install -e '.[bench]'); section 4 skipped"
        return result
    for name, option in PEERS.items():
        log(f"section 4: {name} vs {option}, interleaved")
        cfg = config(settings, name)
        ours, theirs = posab_model(cfg), peer_model(option, cfg)
        steps = [
            train_step(ours, partial(lm_loss, ours), cfg),
            train_step(theirs, partial(peer_loss, theirs), cfg),
        ]
        times = median_times(steps, settings.warmup, settings.repeats)
        result.rows.append(
            {
                "posab": name,
                "x_transformers": option,
                "posab_step_s": times[0],
                "x_transformers_step_s": times[1],
                "ratio": times[0] / times[1],
                "posab_params": sum(p.numel() for p in ours.parameters()),
                "x_transformers_params": sum(p.numel() for p in theirs.parameters()),
            }
        )
        label = f"{name} / x-transformers {option} step time"
        result.targets.append(Target(label, times[0] / times[1], PEER_TARGET, higher_is_better=False))
    return result


# ----------------------------------------------------------------------------- section 5: FLOP/s


def matmul_peak(size: int, dtype: torch.dtype, settings: Settings) -> float:
    """FLOP/s of a (size x size) @ (size x size) matmul in `dtype`: 2 size^3 / median time."""
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=generator).to(dtype) for _ in range(2))
    seconds = median_times([lambda: a @ b], settings.warmup, max(3, settings.repeats))[0]
    return 2 * size**3 / seconds


def model_flops(cfg: Config, non_embedding_params: int) -> float:
    """FLOPs of one training step: 6 N T for the weights plus 12 n_layers L d T for QK^T and AV, forward
    and backward (the PaLM convention: no halving for the causal mask); T = tokens per step."""
    m, tokens = cfg.model, cfg.train.batch_size * cfg.train.seq_len
    return 6 * non_embedding_params * tokens + 12 * m.n_layers * cfg.train.seq_len * m.d_model * tokens


def section_flops(settings: Settings) -> Result:
    result = Result("section5_flops", "5. Achieved model FLOP/s as a share of the matmul peak")
    cfg = config(settings)
    log(f"section 5: matmul peak ({settings.matmul_size}^2), then a {encoding_name(cfg)} training step")
    peaks = {name: matmul_peak(settings.matmul_size, dtype, settings) for name, dtype in DTYPES.items()}
    model = posab_model(cfg)
    step = train_step(model, partial(lm_loss, model), cfg)
    seconds = median_times([step], settings.warmup, settings.repeats)[0]
    params = model.parameter_counts()["non_embedding"]
    flops = model_flops(cfg, params)
    dtype = dtype_name(precision(cfg))
    share = 100 * flops / seconds / peaks[dtype]
    result.rows.append(
        {
            "encoding": encoding_name(cfg),
            "dtype": dtype,
            "length": cfg.train.seq_len,
            "batch": cfg.train.batch_size,
            "non_embedding_params": params,
            "flops_per_step": flops,
            "step_s": seconds,
            "achieved_gflops": flops / seconds / 1e9,
            "peak_gflops_fp32": peaks["fp32"] / 1e9,
            "peak_gflops_bf16": peaks["bf16"] / 1e9,
            "share_pct": share,
        }
    )
    result.targets.append(Target(f"model FLOP/s / {dtype} matmul peak", share, SHARE_TARGET, True, "%"))
    return result


def dtype_name(dtype: torch.dtype | None) -> str:
    return "bf16" if dtype == torch.bfloat16 else "fp32"


# ----------------------------------------------------------------------------- output

SECTIONS: dict[int, Callable[[Settings], Result]] = {
    1: section_bias,
    2: section_train,
    3: section_eval,
    4: section_peer,
    5: section_flops,
}

METHOD = """\
- Time: wall time (`time.perf_counter`), the median of the timed runs after the warm-up runs; runs that
  are compared (section 1: the two methods; section 2: all encodings; section 4: both libraries) are
  interleaved round-robin, so that a change in machine load hits all of them alike.
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


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine(settings: Settings) -> list[dict[str, Any]]:
    dtype = dtype_name(precision(config(settings)))
    facts = {
        "CPU": cpu_model(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "dtype": f"{dtype} autocast" if dtype == "bf16" else "fp32",
        "mode": "quick" if settings.quick else "full",
        "warm-up / timed runs": f"{settings.warmup} / {settings.repeats}",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    return [{"item": key, "value": value} for key, value in facts.items()]


def target_rows(results: list[Result]) -> list[dict[str, Any]]:
    return [target.row() | {"verdict": target.verdict()} for r in results for target in r.targets]


def report(results: list[Result], settings: Settings) -> str:
    parts = ["# posab benchmark\n", markdown_table(machine(settings)) + "\n", "## Method\n", METHOD]
    parts += [section_markdown(result) for result in results]
    targets = target_rows(results)
    if targets:
        parts += ["## Targets\n", markdown_table(targets) + "\n"]
    return "\n".join(parts)


def parse_sections(text: str) -> list[int]:
    sections = sorted({int(part) for part in text.split(",") if part.strip()})
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown section(s) {unknown}; pick from {sorted(SECTIONS)}")
    return sections


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit code."""
    parser = argparse.ArgumentParser(prog="scripts/bench.py", description="posab performance benchmark")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repeat (for the tests)")
    parser.add_argument("--out", type=Path, default=Path("results/bench"), help="output folder")
    parser.add_argument("--sections", type=parse_sections, default=sorted(SECTIONS), help="e.g. 1,2,5")
    parser.add_argument("--repeats", type=positive, help="timed runs (default 5; 1 with --quick)")
    parser.add_argument("--threads", type=positive, help="torch threads (default all cores; 1 with --quick)")
    args = parser.parse_args(argv)
    threads = args.threads or (1 if args.quick else None)
    if threads:
        torch.set_num_threads(threads)
    settings = Settings.build(args.quick, args.repeats)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for number in args.sections:
        result = SECTIONS[number](settings)
        print(section_markdown(result), flush=True)
        table = args.out / f"{result.key}.csv"
        if result.rows:
            write_csv(table, result.rows)
        else:  # skipped: no table from an earlier run may pass for this run's
            table.unlink(missing_ok=True)
        results.append(result)
    targets = target_rows(results)
    if targets:
        print("## Targets\n\n" + markdown_table(targets) + "\n")
        write_csv(args.out / "targets.csv", targets)
    (args.out / "bench.md").write_text(report(results, settings), encoding="utf-8")
    print(f"wrote {args.out / 'bench.md'}")
    return 0
