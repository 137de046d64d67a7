"""Attention entropy and mean attended distance, per layer and head, at each evaluation length.

Protocol: at each length L (`eval.analysis.lengths`, or `eval.lengths`), `eval.analysis.windows` fixed
validation windows (spread over the split like the perplexity windows), one at a time. One forward pass
per window, with a forward pre-hook on every layer's attention module that records its inputs
(x, encoding, pos, mask, and the encoding's score scale where the model passes one); the model itself is
untouched. Then, one layer at a time and in float32, q and k are recomputed with the module's own `qkv`
weights and `encoding.rotate`, and the probabilities p = softmax(q k^T / sqrt(D) * scale + mask) (scale 1
when there is none, the causal mask when mask is None), over chunks of queries. Per head:

    entropy   H_i = -sum_j p_ij ln p_ij   (nats; 0 <= H_i <= ln(i + 1))
    distance  d_i = sum_j p_ij (i - j)    (tokens; 0 <= d_i <= i)

each averaged over the queries i and the windows. Uniform causal attention gives H = ln(L!) / L and
d = (L - 1) / 4 (the dashed lines of `attention_plot`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor, nn
from tqdm import tqdm

from posab.encodings import Encoding, Positions
from posab.evaluate.context import EvalContext
from posab.model import CausalSelfAttention, DecoderLM

QUERY_CHUNK = 512  # queries per softmax (default model, L=4096, 2 CPU cores: 3.7 s a window; 256: 6.6 s)


@dataclass
class AttentionInputs:
    """The arguments one attention module was called with."""

    x: Tensor  # (B, T, C)
    encoding: Encoding
    pos: Positions
    mask: Tensor | None  # (1|B, H, T, T) additive, causal part included, or None (causal only)
    scale: Tensor | None = None  # (1|B, H, T, T) multiplies q.k / sqrt(D) before the mask, or None


@contextmanager
def captured_inputs(model: DecoderLM) -> Iterator[list[AttentionInputs]]:
    """Record the inputs of every layer's attention module, in layer order, while the context is open."""
    captured: list[AttentionInputs] = []

    def record(module: nn.Module, args: tuple[Any, ...]) -> None:
        captured.append(AttentionInputs(*args))

    handles = [block.attn.register_forward_pre_hook(record, with_kwargs=False) for block in model.blocks]
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def queries_keys_values(attn: CausalSelfAttention, inputs: AttentionInputs) -> tuple[Tensor, Tensor, Tensor]:
    """q, k (rotated by the encoding) and v in float32, from the module's own weights: 3 x (B, H, T, D)."""
    x = inputs.x.float()
    b, t, c = x.shape
    qkv = F.linear(x, attn.qkv.weight.float())  # (B, T, 3C)
    qkv = qkv.view(b, t, 3, attn.n_heads, c // attn.n_heads)  # (B, T, 3C) -> (B, T, 3, H, D)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, T, D)
    q, k = inputs.encoding.rotate(q, k, inputs.pos)
    return q, k, v


def probabilities(
    q: Tensor, k: Tensor, mask: Tensor | None, scale: Tensor | None, start: int, end: int
) -> Tensor:
    """Probabilities of queries start:end over keys 0:end (later keys are masked anyway): (B, H, c, end)."""
    scores = q[:, :, start:end] @ k[:, :, :end].transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, c, end)
    if scale is not None:
        scores = scores * scale[..., start:end, :end].float()  # (1|B, H, c, end)
    if mask is None:  # -inf where key j > query i = start + row
        bias = torch.full((end - start, end), float("-inf"), device=q.device).triu(start + 1)  # (c, end)
    else:
        bias = mask[..., start:end, :end].float()  # (1|B, H, c, end)
    return torch.softmax(scores + bias, dim=-1)


def head_statistics(
    q: Tensor, k: Tensor, mask: Tensor | None, scale: Tensor | None = None, chunk: int = QUERY_CHUNK
) -> Tensor:
    """Mean entropy and mean attended distance over batch rows and queries, per head: (2, H) float64."""
    b, h, t, _ = q.shape
    totals = torch.zeros(2, h, dtype=torch.float64, device=q.device)
    for start in range(0, t, chunk):
        end = min(t, start + chunk)
        p = probabilities(q, k, mask, scale, start, end)  # (B, H, c, end)
        queries = torch.arange(start, end, device=q.device)
        gaps = (queries[:, None] - torch.arange(end, device=q.device)[None, :]).float()  # (c, end): i - j
        totals[0] += torch.special.entr(p).sum((0, 2, 3)).double()
        totals[1] += (p * gaps).sum((0, 2, 3)).double()
    return totals / (b * t)


@torch.inference_mode()
def window_statistics(ctx: EvalContext, start: int, length: int) -> Tensor:
    """Entropy and distance of one validation window: (2, layers, heads) float64 on the CPU."""
    batch = ctx.valid.batch([start], length)
    with captured_inputs(ctx.model) as captured:
        ctx.logits(batch.inputs, batch.sentence, batch.paragraph)
    layers = []
    for block, inputs in zip(ctx.model.blocks, captured, strict=True):
        q, k, _ = queries_keys_values(block.attn, inputs)
        layers.append(head_statistics(q, k, inputs.mask, inputs.scale).cpu())  # (2, H)
    return torch.stack(layers, dim=1)  # (2, layers, H)


def analysis_eval(ctx: EvalContext) -> dict[str, Any]:
    """`attn/entropy@L/layerN/headM`, `attn/distance@L/layerN/headM`, `attn/grid` and `time/attn@L_s`."""
    a = ctx.cfg.analysis
    lengths = a.lengths or ctx.cfg.lengths
    layers, heads = len(ctx.model.blocks), ctx.model.cfg.n_heads
    grid: dict[str, Any] = {"lengths": lengths, "layers": list(range(layers)), "heads": list(range(heads))}
    grid.update(entropy=[], distance=[])
    out: dict[str, Any] = {}
    for length in tqdm(lengths, desc="attention", disable=not ctx.cfg.progress):
        started = time.perf_counter()
        starts = ctx.valid.fixed_windows(length, a.windows)
        windows = [window_statistics(ctx, int(s), length) for s in starts]  # (2, layers, H) each
        stats = torch.stack(windows).mean(0)  # (2, layers, H)
        for name, values in zip(("entropy", "distance"), stats.tolist(), strict=True):
            grid[name].append(values)
            for layer, row in enumerate(values):
                out.update({f"attn/{name}@{length}/layer{layer}/head{h}": v for h, v in enumerate(row)})
        out[f"time/attn@{length}_s"] = round(time.perf_counter() - started, 3)
    out["attn/grid"] = grid
    return out


def attention_plot(grid: dict[str, Any], path: Path, title: str) -> Path:
    """Mean attended distance and entropy against evaluation length, one line per (layer, head), as a PNG."""
    lengths = np.asarray(grid["lengths"], dtype=np.float64)
    fig = Figure(figsize=(12.0, 4.5))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    uniform = {"distance": (lengths - 1) / 4, "entropy": [math.lgamma(n + 1) / n for n in lengths]}
    labels = {"distance": "mean attended distance (tokens)", "entropy": "attention entropy (nats)"}
    colours = [f"C{layer % 10}" for layer in grid["layers"]]
    markers = "osd^v<>px*"
    for ax, name in zip(axes, ("distance", "entropy"), strict=True):
        values = np.asarray(grid[name], dtype=np.float64)  # (lengths, layers, heads)
        for layer, head in np.ndindex(values.shape[1:]):
            style = {"color": colours[layer], "marker": markers[head % len(markers)]}
            ax.plot(lengths, values[:, layer, head], label=f"layer {layer} head {head}", **style)
        ax.plot(lengths, uniform[name], "k--", label="uniform causal attention")
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(int(n)) for n in lengths])
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_ylabel(labels[name])
    axes[0].set_yscale("symlog", linthresh=1.0)  # 0 .. L-1 spans orders of magnitude
    axes[1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize="small")
    fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path
