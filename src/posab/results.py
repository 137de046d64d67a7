"""Helpers over result dictionaries and configs shared by the run, the loggers and the report (no torch)."""

from __future__ import annotations

from typing import Any

import numpy as np


def is_number(value: object) -> bool:
    """An int or float result (bools are settings, not results)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def scalars(results: dict[str, Any]) -> dict[str, int | float]:
    """The scalar results (curves, grids and other structures left out)."""
    return {key: value for key, value in results.items() if is_number(value)}


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> {"dotted.key": leaf}; an empty dict is a leaf of its own."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def bin_edges(length: int, bins: int) -> list[int]:
    """Edges of `bins` equal-width position bins over a window of `length` (fewer bins when length < bins):
    bin b holds positions edges[b] .. edges[b + 1] - 1."""
    return np.linspace(0, length, min(bins, length) + 1).round().astype(int).tolist()


def bin_centres(length: int, bins: int) -> list[float]:
    """The mean position of each bin of `bin_edges(length, bins)`."""
    edges = bin_edges(length, bins)
    return [(a + b - 1) / 2 for a, b in zip(edges[:-1], edges[1:], strict=True)]
