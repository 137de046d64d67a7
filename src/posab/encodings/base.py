"""The one interface the model calls, whatever encoding it holds.

An encoding may add to the token embeddings (`embed`), rotate queries and keys (`rotate`), return an
additive attention bias (`bias`) and/or a multiplicative factor on the attention scores (`score_scale`).
All are no-ops by default. Everything an encoding needs about
positions arrives in one `Positions` value.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class Dims:
    """Model sizes an encoding may need."""

    d_model: int
    n_heads: int
    train_len: int = 512  # the training length
    max_positions: int = (
        8192  # the largest position + 1 the run will use (evaluation and shift offsets included)
    )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclass
class Positions:
    """Where each token is.

    token: (T,) absolute token positions, `offset + arange(T)`; the same for every row of the batch.
    sentence, paragraph: (B, T) sentence and paragraph indices of each token, or None when unknown.
    """

    token: Tensor
    sentence: Tensor | None = None
    paragraph: Tensor | None = None

    @staticmethod
    def build(
        length: int,
        device: torch.device | str = "cpu",
        offset: int = 0,
        sentence: Tensor | None = None,
        paragraph: Tensor | None = None,
    ) -> Positions:
        token = torch.arange(offset, offset + length, device=device)
        return Positions(token=token, sentence=sentence, paragraph=paragraph)

    @property
    def length(self) -> int:
        return self.token.shape[0]


class Encoding(nn.Module):
    """Base class: no positional information at all (NoPE) unless a method is overridden.

    `relative_only` is True when the encoding's effect depends only on differences of positions, so the
    model's outputs must not change when every position is offset by the same amount. `static_bias` is
    True when `bias` depends only on the sequence length (not on offsets or sentence structure).
    """

    relative_only: bool = True
    static_bias: bool = False  # the bias depends only on the sequence length (it may be cached per length)

    def __init__(self, dims: Dims) -> None:
        super().__init__()
        self.dims = dims

    def embed(self, x: Tensor, pos: Positions) -> Tensor:
        """x: (B, T, C) token embeddings -> (B, T, C)."""
        return x

    def rotate(self, q: Tensor, k: Tensor, pos: Positions) -> tuple[Tensor, Tensor]:
        """q, k: (B, H, T, D) -> rotated (B, H, T, D)."""
        return q, k

    def bias(self, pos: Positions) -> Tensor | None:
        """Additive attention bias (1 or B, H, T, T) with [.., i, j] for query i and key j, or None."""
        return None

    def score_scale(self, pos: Positions) -> Tensor | None:
        """Multiplicative factor (1 or B, H, T, T) on q.k / sqrt(d) before the bias, or None (form (2))."""
        return None


def distances(length: int, device: torch.device | str) -> Tensor:
    """The 2L-1 distinct query-minus-key distances, -(L-1) .. L-1, as float: (2L-1,)."""
    return torch.arange(-(length - 1), length, device=device, dtype=torch.float32)


def toeplitz(table: Tensor, length: int) -> Tensor:
    """Gather a per-distance table into a Toeplitz matrix.

    table: (H, 2L-1) with table[:, (L-1) + d] the value at distance d = i - j.
    returns: (H, L, L) with out[h, i, j] = table[h, (L-1) + i - j].
    """
    # unfold: windows[h, i, m] = table[h, i + m]; reading m = L-1-j gives table[h, (L-1) + i - j]
    return table.unfold(-1, length, 1).flip(-1)  # (H, L, L)
