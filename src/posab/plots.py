"""Figures drawn by runs and by reports, as matplotlib `Figure` objects; needs no torch."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.image import AxesImage

from posab.io import atomic_write


def new_figure(width: float, height: float, **kwargs: Any) -> Figure:
    """A figure with its own Agg canvas (no pyplot state, safe in any process)."""
    fig = Figure(figsize=(width, height), **kwargs)
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig: Figure) -> bytes:
    """The figure rendered as a PNG, as every run and report draws it (120 dpi, tight bounding box)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    return buffer.getvalue()


def save_figure(fig: Figure, path: Path) -> Path:
    """The figure as a PNG at `path` (atomically)."""
    return atomic_write(path, lambda tmp: tmp.write_bytes(png_bytes(fig)))


def needle_heatmap(grid: dict[str, Any], title: str) -> Figure:
    """Passkey accuracy per cell: depth on the y axis, length on the x axis, colour scale 0..1.

    grid: {"lengths", "depths", "acc"}, acc as [per length][per depth]."""
    fig = new_figure(2.0 + 0.9 * len(grid["lengths"]), 1.5 + 0.5 * len(grid["depths"]))
    ax = fig.add_subplot()
    fig.colorbar(needle_panel(ax, grid, title), ax=ax, label="passkey accuracy")
    return fig


def needle_panel(ax: Axes, grid: dict[str, Any], title: str) -> AxesImage:
    """One needle heatmap (as `needle_heatmap`) drawn into `ax`, each cell's accuracy written in it (NaN:
    "–"); returns the image, for a colour bar."""
    lengths, depths = grid["lengths"], grid["depths"]
    acc = np.asarray(grid["acc"], dtype=np.float64).T  # (lengths, depths) -> (depths, lengths)
    image = ax.imshow(acc, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    for (row, col), value in np.ndenumerate(acc):
        text = "–" if np.isnan(value) else f"{value:.2f}"
        ax.text(col, row, text, ha="center", va="center", color="white" if value < 0.5 else "black")
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set_xlabel("length (tokens)")
    ax.set_ylabel("needle depth")
    ax.set_title(title)
    return image


def attention_plot(grid: dict[str, Any], title: str) -> Figure:
    """Mean attended distance and entropy against evaluation length, one line per (layer, head).

    grid: {"lengths", "layers", "heads", "entropy", "distance"}, values as [length][layer][head]. Dashed:
    uniform causal attention, H = ln(L!) / L and d = (L - 1) / 4."""
    lengths = np.asarray(grid["lengths"], dtype=np.float64)
    fig = new_figure(12.0, 4.5)
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
    return fig
