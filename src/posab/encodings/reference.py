"""All-pairs reference biases: each learned bias computed the obvious way, its MLP on every (query, key)
pair, as the design note writes it.

These are the slow references that the modules' fast paths (the MLP on the distinct distances gathered
into a Toeplitz matrix, the hierarchical mix applied to per-distance tables, FIRE's piecewise-linear form)
must equal; the tests and the benchmark read them from here and nowhere else. Each costs O(L^2) MLP
evaluations and memory: for checking, never for training.

`all_pairs_reference(encoding)` picks the reference by the encoding's class: None where there is none (an
encoding without a learned bias, or a multi-scale input other than the raw distance).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor

from posab.encodings.base import Encoding, Positions
from posab.encodings.dape import DAPE, ScoreMixer
from posab.encodings.fire import FIRE
from posab.encodings.hierarchical import Hierarchical
from posab.encodings.multiscale import DistanceMLP, MultiScale


def pair_differences(units: Tensor) -> Tensor:
    """(B, L) coordinates -> (B, L, L) differences units[b, i] - units[b, j]."""
    return units[:, :, None] - units[:, None, :]


def distance_mlp_on_pairs(mlp: DistanceMLP, relative: Tensor) -> Tensor:
    """A multi-scale MLP on every pair's relative coordinate: (B, L, L) -> (B, H, L, L)."""
    return mlp(relative.flatten()).view(-1, *relative.shape).transpose(0, 1)  # (H, B*L*L) -> (B, H, L, L)


def clamped(relative: Tensor, clamp: int | None) -> Tensor:
    """Pair distances past `clamp` set to it (the encodings' `clamp` option); unchanged when None."""
    return relative if clamp is None else relative.clamp(max=clamp)


def level_units(pos: Positions, level: str) -> Tensor:
    """Each token's unit at `level` (token position, sentence or paragraph index): (1 or B, L)."""
    units = pos.token[None] if level == "token" else getattr(pos, level)
    if units is None:
        raise ValueError(f"the all-pairs hierarchical bias needs the {level} indices")
    return units


def multiscale_all_pairs(encoding: MultiScale, pos: Positions) -> Tensor:
    """b(i - j) for every (i, j), for the raw distance input: (1, H, L, L)."""
    if encoding.input != "raw":
        raise ValueError(f"no all-pairs reference for the multi-scale input {encoding.input!r}")
    relative = clamped(pair_differences(pos.token[None]), encoding.clamp)  # (1, L, L)
    return distance_mlp_on_pairs(encoding.distance_mlp, relative)


def hierarchical_all_pairs(encoding: Hierarchical, pos: Positions) -> Tensor:
    """Every level's MLP on every pair's relative coordinate, then the linear mix over (level, head) per
    pair (or the plain sum): (B, H, L, L)."""
    total: Tensor | None = None
    for index, level in enumerate(encoding.levels):
        relative = pair_differences(level_units(pos, level))  # (1 or B, L, L)
        relative = clamped(relative, encoding.clamp) if level == "token" else relative
        bias = distance_mlp_on_pairs(encoding.level_mlps[level], relative)  # (1 or B, H, L, L)
        if encoding.combine == "mix":
            bias = torch.einsum("oh,bhij->boij", encoding.mix[index], bias)
        total = bias if total is None else total + bias
    assert total is not None
    return total


def fire_all_pairs(encoding: FIRE, pos: Positions) -> Tensor:
    """The MLP f on every pair's input psi(i - j) / psi(max(i, L_thr)) (`FIRE.inputs`, which rounds to
    float32 in any dtype: the reference differs from the fast path only in how f is evaluated):
    (1, H, L, L)."""
    x = encoding.inputs(pos).to(encoding.log_c.dtype)  # (L, L)
    return encoding.mlp(x[..., None]).permute(2, 0, 1)[None]  # (L, L, H) -> (1, H, L, L)


def dape_attention_all_pairs(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, mixer: ScoreMixer
) -> Tensor:
    """DAPE's attention the reference code's way: the (B, H, L, L) logits and bias concatenated over heads,
    f applied channels-last at every pair, then the causal mask and the softmax. q, k, v: (B, H, L, D);
    mask: (1|B, H, L, L) bias plus causal mask, or None -> (B, H, L, D)."""
    length = q.shape[-2]
    future = torch.ones(length, length, dtype=torch.bool, device=q.device).triu(1)  # (L, L) key after query
    logits = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5  # (B, H, L, L)
    bias = torch.zeros_like(logits[:1]) if mask is None else mask.masked_fill(future, 0.0)  # the tril'd bias
    scores = mixer(logits, bias).masked_fill(future, float("-inf"))  # (B, H, L, L)
    return torch.softmax(scores, dim=-1) @ v


def all_pairs_reference(encoding: Encoding) -> Callable[[Positions], Tensor] | None:
    """The encoding's all-pairs bias as a function of the positions, or None when it has none (DAPE: its
    base's; its mixer's reference is `dape_attention_all_pairs`)."""
    if isinstance(encoding, DAPE):
        return all_pairs_reference(encoding.base)
    if isinstance(encoding, MultiScale):
        return partial(multiscale_all_pairs, encoding) if encoding.input == "raw" else None
    if isinstance(encoding, Hierarchical):
        return partial(hierarchical_all_pairs, encoding)
    if isinstance(encoding, FIRE):
        return partial(fire_all_pairs, encoding)
    return None
