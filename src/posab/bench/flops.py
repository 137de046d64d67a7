"""Section 5: the achieved model FLOP/s of a training step (`Trainer.step`) as a share of the measured
matmul peak in the training dtype, for the default model (`model=small`, d=128: too small to be
compute-bound on any CPU) and `model=medium` (d=256, 6 layers, 8 heads), which the 40% target is for.
The quick run measures its own tiny model only."""

from __future__ import annotations

from typing import Any

import torch

from posab.bench.inputs import posab_model
from posab.bench.measure import median_times
from posab.bench.output import Result
from posab.bench.progress import Progress
from posab.bench.settings import Settings, dtype_name, precision
from posab.bench.steps import training_step
from posab.build import encoding_name
from posab.config import Config

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # the matmul peaks measured


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


def section(settings: Settings, progress: Progress) -> Result:
    result = Result("section5_flops", "5. Achieved model FLOP/s as a share of the matmul peak")
    peaks = {}
    for name in progress.over(list(DTYPES), f"section 5: matmul peak ({settings.matmul_size}^2)"):
        peaks[name] = matmul_peak(settings.matmul_size, DTYPES[name], settings)
    for name in progress.over(list(settings.flops_models), "section 5: training steps"):
        result.rows.append(flops_row(name, settings.config(None, f"model={name}"), peaks, settings))
    return result


def flops_row(name: str, cfg: Config, peaks: dict[str, float], settings: Settings) -> dict[str, Any]:
    """Model config `name`'s training step: its FLOPs, time, and share of the peak in its training dtype."""
    model = posab_model(cfg)
    seconds = median_times([training_step(model, cfg)], settings.warmup, settings.repeats)[0]
    params = model.parameter_counts()["non_embedding"]
    flops = model_flops(cfg, params)
    dtype = dtype_name(precision(cfg))
    return {
        "model": name,
        "d_model": cfg.model.d_model,
        "layers": cfg.model.n_layers,
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
        "share_pct": 100 * flops / seconds / peaks[dtype],
    }
