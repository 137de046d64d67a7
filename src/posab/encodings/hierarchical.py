"""Hierarchical relative bias (the design note, section 5.4).

One multi-scale MLP per level, on that level's relative coordinate: token (i - j), sentence
(s_i - s_j) and paragraph (p_i - p_j), where s and p are the sentence and paragraph indices of each token.
The per-level biases are combined by a learned linear mix over (level, head) -> head, as the note
describes, or by a plain sum (`combine=sum`).

Each level's MLP runs on that level's distinct distances only. The mix is linear, so it is applied to the
small per-distance tables before they are gathered: exactly the note's mix of the per-pair biases, at a
cost independent of L^2.
"""

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
            self.mix_bias = nn.Parameter(torch.zeros(h))  # (H,)

    def _mixed(self, index: int, table: Tensor) -> Tensor:
        """Apply level `index`'s share of the linear mix to its (H, N) table."""
        return self.mix[index] @ table if self.combine == "mix" else table  # (H, H) @ (H, N) -> (H, N)

    def bias(self, pos: Positions) -> Tensor:
        total: Tensor | None = None
        for index, level in enumerate(self.levels):
            mlp = self.level_mlps[level]
            if level == "token":
                table = self._mixed(index, mlp(distances(pos.length, mlp.taus.device)))  # (H, 2L-1)
                level_bias = toeplitz(table, pos.length)[None]  # (1, H, L, L)
            else:
                level_bias = self._structural_bias(index, mlp, self._indices(pos, level))  # (B, H, L, L)
            total = level_bias if total is None else total + level_bias
        assert total is not None
        if self.combine == "mix":
            total = total + self.mix_bias[None, :, None, None]
        return total

    @staticmethod
    def _indices(pos: Positions, level: str) -> Tensor:
        indices = pos.sentence if level == "sentence" else pos.paragraph
        if indices is None:
            raise ConfigError(
                f"the hierarchical bias needs {level} indices; pass them to the model with the tokens"
            )
        return indices

    def _structural_bias(self, index: int, mlp: DistanceMLP, indices: Tensor) -> Tensor:
        """indices: (B, L) per-token unit index -> (B, H, L, L) bias of the unit distance s_i - s_j."""
        relative = indices[:, :, None] - indices[:, None, :]  # (B, L, L)
        span = int(relative.abs().max())
        values = torch.arange(-span, span + 1, device=indices.device, dtype=torch.float32)  # (2S+1,)
        table = self._mixed(index, mlp(values))  # (H, 2S+1)
        gathered = table[:, relative + span]  # (H, B, L, L)
        return gathered.permute(1, 0, 2, 3)  # (B, H, L, L)
