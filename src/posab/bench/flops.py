"""Section 5: the achieved model FLOP/s of the default model's training step (`Trainer.step`) as a share
of the measured matmul peak in the training dtype."""

from __future__ import annotations

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
    cfg = settings.config()
    peaks = {}
    for name in progress.over(list(DTYPES), f"section 5: matmul peak ({settings.matmul_size}^2)"):
        peaks[name] = matmul_peak(settings.matmul_size, DTYPES[name], settings)
    progress.note(f"a {encoding_name(cfg)} training step")
    model = posab_model(cfg)
    seconds = median_times([training_step(model, cfg)], settings.warmup, settings.repeats)[0]
    params = model.parameter_counts()["non_embedding"]
    flops = model_flops(cfg, params)
    dtype = dtype_name(precision(cfg))
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
            "share_pct": 100 * flops / seconds / peaks[dtype],
        }
    )
    return result
