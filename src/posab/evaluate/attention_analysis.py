"""Attention entropy and mean attended distance, per layer and head, at each evaluation length.

Protocol: at each length L (`eval.analysis.lengths`, or `eval.lengths`), `eval.analysis.windows` fixed
validation windows (spread over the split like the perplexity windows), one at a time. One forward pass
per window through the model's own attention path: every layer hands its q and k (rotated by the
encoding) and its attention form to an observer (`DecoderLM.forward(observe=...)`), which computes the
layer's probabilities with the form's own scores (`AttentionInputs.probabilities`, in float32, over
chunks of queries). Per head:

    entropy   H_i = -sum_j p_ij ln p_ij   (nats; 0 <= H_i <= ln(i + 1))
    distance  d_i = sum_j p_ij (i - j)    (tokens; 0 <= d_i <= i)

each averaged over the queries i and the windows. Uniform causal attention gives H = ln(L!) / L and
d = (L - 1) / 4 (the dashed lines of the `attention` figure).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from posab.catalog import analysis as analysis_columns
from posab.errors import require
from posab.evaluate.base import Evaluator, SectionConfig
from posab.evaluate.context import EvalContext, EvalSettings
from posab.forms import AttentionInputs
from posab.outputs import EvalOutput, Table
from posab.plots import attention_plot

QUERY_CHUNK = 512  # queries per softmax (default model, L=4096, 2 CPU cores: 3.7 s a window; 256: 6.6 s)


@dataclass
class AnalysisConfig(SectionConfig):
    enabled: bool = False  # attention entropy and distance per layer and head; slow at long lengths
    windows: int = 2  # validation windows per length, one at a time
    lengths: list[int] | None = None  # None: eval.lengths; each at most max(eval.lengths)

    def validate(self, settings: EvalSettings) -> None:
        require(self.windows > 0, f"eval.analysis.windows={self.windows} must be positive")
        lengths, longest = self.lengths or [], max(settings.lengths, default=0)
        bad = [n for n in lengths if n < 1]
        require(not bad, f"eval.analysis.lengths={lengths}: every length must be >= 1 (bad: {bad})")
        too_long = [n for n in lengths if n > longest]
        require(not too_long, f"eval.analysis.lengths={lengths}: at most max(eval.lengths)={longest}")


def head_statistics(inputs: AttentionInputs, chunk: int = QUERY_CHUNK) -> Tensor:
    """Mean entropy and mean attended distance over batch rows and queries, per head: (2, H) float64."""
    b, h, t, _ = inputs.q.shape
    totals = torch.zeros(2, h, dtype=torch.float64, device=inputs.q.device)
    for start in range(0, t, chunk):
        end = min(t, start + chunk)
        p = inputs.probabilities(start, end)  # (B, H, c, end)
        queries = torch.arange(start, end, device=p.device)
        gaps = (queries[:, None] - torch.arange(end, device=p.device)[None, :]).float()  # (c, end): i - j
        totals[0] += torch.special.entr(p).sum((0, 2, 3)).double()
        totals[1] += (p * gaps).sum((0, 2, 3)).double()
    return totals / (b * t)


def window_statistics(ctx: EvalContext, start: int, length: int) -> Tensor:
    """Entropy and distance of one validation window: (2, layers, heads) float64 on the CPU."""
    batch = ctx.valid.batch([start], length)
    layers: list[Tensor] = []
    ctx.logits(
        batch.inputs,
        batch.sentence,
        batch.paragraph,
        observe=lambda a: layers.append(head_statistics(a).cpu()),
    )
    return torch.stack(layers, dim=1)  # (2, layers, H)


def length_statistics(ctx: EvalContext, length: int, windows: int) -> Tensor:
    """Entropy and distance at one length, averaged over `windows` fixed validation windows, one forward
    pass each: (2, layers, H) float64 on the CPU."""
    starts = ctx.valid.fixed_windows(length, windows)
    stats = [  # (2, layers, H) each
        window_statistics(ctx, int(s), length)
        for s in ctx.bar(starts, f"attention L={length}", inner=True, unit="window")
    ]
    return torch.stack(stats).mean(0)  # (2, layers, H)


def statistics_grid(ctx: EvalContext, lengths: list[int], windows: int) -> tuple[dict[str, Any], list[float]]:
    """The grid {"lengths", "layers", "heads", "entropy", "distance"} (values as [length][layer][head]) at
    `lengths`, `windows` windows each, and the wall time of each length in seconds (rounded to ms)."""
    grid: dict[str, Any] = {
        "lengths": lengths,
        "layers": list(range(len(ctx.model.blocks))),
        "heads": list(range(ctx.model.cfg.n_heads)),
    }
    grid.update(entropy=[], distance=[])
    seconds: list[float] = []
    for length in ctx.bar(lengths, "attention", unit="length"):
        started = time.perf_counter()
        entropy, distance = length_statistics(ctx, length, windows).tolist()  # (layers, H) each
        grid["entropy"].append(entropy)
        grid["distance"].append(distance)
        seconds.append(round(time.perf_counter() - started, 3))
    return grid, seconds


def grid_scalars(grid: dict[str, Any], index: int, prefix: str) -> dict[str, float]:
    """`{prefix}/entropy@L/layerN/headM` and `{prefix}/distance@L/layerN/headM` of the grid's length
    `index`."""
    length = grid["lengths"][index]
    return {
        f"{prefix}/{name}@{length}/layer{layer}/head{h}": v
        for name in ("entropy", "distance")
        for layer, row in enumerate(grid[name][index])
        for h, v in enumerate(row)
    }


def stats_table(grid: dict[str, Any]) -> Table:
    """One row per (length, layer, head)."""
    rows = [
        [length, layer, head, grid["entropy"][i][j][k], grid["distance"][i][j][k]]
        for i, length in enumerate(grid["lengths"])
        for j, layer in enumerate(grid["layers"])
        for k, head in enumerate(grid["heads"])
    ]
    return Table(["length", "layer", "head", "entropy", "distance"], rows)


class AttentionAnalysis(Evaluator[AnalysisConfig]):
    """`attn/entropy@L/layerN/headM`, `attn/distance@L/layerN/headM`, `attn/grid`, `time/attn@L_s`, the
    `attention_stats` table and the `attention` figure."""

    name = "analysis"
    config = AnalysisConfig
    order = analysis_columns.ORDER

    def window_lengths(self, settings: EvalSettings) -> list[int]:
        return list(self.cfg.lengths or settings.lengths)

    def evaluate(self, ctx: EvalContext) -> EvalOutput:
        grid, seconds = statistics_grid(ctx, self.window_lengths(ctx.cfg), self.cfg.windows)
        scalars: dict[str, float] = {}
        for i, length in enumerate(grid["lengths"]):
            scalars.update(grid_scalars(grid, i, "attn"))
            scalars[f"time/attn@{length}_s"] = seconds[i]
        return EvalOutput(
            scalars=scalars,
            data={"attn/grid": grid},
            tables={"attention_stats": stats_table(grid)},
            figures={"attention": attention_plot(grid, ctx.title)},
        )
