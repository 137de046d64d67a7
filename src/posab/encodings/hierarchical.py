"""Hierarchical relative bias (the design note, section 5.4).

One multi-scale MLP per level, on that level's relative coordinate: token (i - j), sentence
(s_i - s_j) and paragraph (p_i - p_j), where s and p are the sentence and paragraph indices of each token.
The per-level biases are combined by a learned linear mix over (level, head) -> head, as the note
describes, or by a plain sum (`combine=sum`). The mix starts as the plain sum (identity blocks); with no
weight decay on the encoding's parameters (`encoding.weight_decay`, default 0) nothing pulls it toward 0.
It has no per-head constant: softmax over the keys ignores a constant added to every score of a query row,
so such a term never changes the model (runs before issue 13 had one, `mix_bias`; loading their
checkpoints drops it).

Each level's MLP runs on that level's distinct distances only. The mix is linear, so it is applied to the
small per-distance tables before they are gathered: exactly the note's mix of the per-pair biases, at a
cost independent of L^2.
"""

from typing import Any

import torch
from torch import Tensor, nn

from posab.encodings.base import Dims, Encoding, Positions, distances, toeplitz
from posab.encodings.multiscale import DistanceMLP
from posab.errors import ConfigError

LEVELS = ("token", "sentence", "paragraph")
COMBINES = ("mix", "sum")


class Hierarchical(Encoding):
    relative_only = True

    def __init__(
        self,
        dims: Dims,
        levels: list[str] | tuple[str, ...] = LEVELS,
        combine: str = "mix",
        num_freqs: int = 16,
        max_dist: float = 4096.0,
        hidden: int = 64,
    ) -> None:
        super().__init__(dims)
        self.levels = tuple(levels)
        unknown = [level for level in self.levels if level not in LEVELS]
        if unknown or not self.levels or len(set(self.levels)) != len(self.levels):
            raise ConfigError(f"hierarchical levels={list(levels)}: pick distinct levels from {list(LEVELS)}")
        if combine not in COMBINES:
            raise ConfigError(f"hierarchical combine={combine!r}: use one of {list(COMBINES)}")
        self.combine = combine
        h = dims.n_heads
        mlps = {level: DistanceMLP(h, num_freqs, max_dist, hidden) for level in self.levels}
        self.level_mlps = nn.ModuleDict(mlps)
        if combine == "mix":
            # mix[l] maps level l's H heads to the output H heads; starts as the plain sum
            self.mix = nn.Parameter(torch.eye(h).repeat(len(self.levels), 1, 1))  # (levels, H, H)

    def bias(self, pos: Positions) -> Tensor:
        total: Tensor | None = None
        if "token" in self.levels:
            mlp = self.level_mlps["token"]
            table = self._mixed("token", mlp(distances(pos.length, mlp.taus.device)))  # (H, 2L-1)
            total = toeplitz(table, pos.length)[None]  # (1, H, L, L)
        structural = [level for level in self.levels if level != "token"]
        if structural:
            level_bias = self._structural_bias(structural, pos)  # (B, H, L, L)
            total = level_bias if total is None else total + level_bias
        assert total is not None
        return total

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        """Drop `mix_bias` from a checkpoint made before it was removed: a per-head constant, which the
        softmax ignores."""
        state_dict.pop(prefix + "mix_bias", None)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def _mixed(self, level: str, table: Tensor) -> Tensor:
        """Apply `level`'s share of the linear mix to its (H, N) table."""
        if self.combine == "sum":
            return table
        return self.mix[self.levels.index(level)] @ table  # (H, H) @ (H, N) -> (H, N)

    def _structural_bias(self, levels: list[str], pos: Positions) -> Tensor:
        """The sentence and/or paragraph biases, summed, with one gather: (B, H, L, L).

        Each level's table covers its distinct unit distances -S..S. The tables are summed into one joint
        table over (sentence distance, paragraph distance), indexed by the flattened pair of distances.
        """
        joint: Tensor | None = None
        index: Tensor | None = None
        for level in levels:
            units = self._indices(pos, level)  # (B, L)
            relative = units[:, :, None] - units[:, None, :]  # (B, L, L)
            span = int((units.amax(dim=1) - units.amin(dim=1)).max())
            values = torch.arange(-span, span + 1, device=units.device, dtype=torch.float32)  # (2S+1,)
            table = self._mixed(level, self.level_mlps[level](values))  # (H, 2S+1)
            if joint is None or index is None:
                joint, index = table, relative + span
            else:
                joint = (joint[:, :, None] + table[:, None, :]).flatten(1)  # (H, N, 2S+1) -> (H, N * (2S+1))
                index = index * (2 * span + 1) + relative + span
        assert joint is not None and index is not None
        return TableGather.apply(joint, index)

    @staticmethod
    def _indices(pos: Positions, level: str) -> Tensor:
        indices = pos.sentence if level == "sentence" else pos.paragraph
        if indices is None:
            raise ConfigError(
                f"the hierarchical bias needs {level} indices; pass them to the model with the tokens"
            )
        return indices


class TableGather(torch.autograd.Function):
    """out[b, h, i, j] = table[h, index[b, i, j]], with the table gradient as a weighted bincount.

    Autograd's own backward of indexing sorts the (B, L, L) index to accumulate; a bincount per head over
    the flattened index is 3-4x faster here and needs no (B, H, L, N) buffer.
    """

    @staticmethod
    def forward(ctx: Any, table: Tensor, index: Tensor) -> Tensor:
        ctx.save_for_backward(index)
        ctx.size = table.shape[1]
        return table[:, index].permute(1, 0, 2, 3)  # (H, B, L, L) -> (B, H, L, L)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (index,) = ctx.saved_tensors
        flat = index.flatten()
        rows = [
            torch.bincount(flat, weights=grad[:, h].flatten().float(), minlength=ctx.size)
            for h in range(grad.shape[1])
        ]
        return torch.stack(rows).to(grad.dtype), None
