"""Hierarchical relative bias (the design note, section 5.4).

One multi-scale MLP per level, on that level's relative coordinate: token (i - j), sentence
(s_i - s_j) and paragraph (p_i - p_j), where s and p are the sentence and paragraph indices of each token.
The per-level biases are combined by a learned linear mix over (level, head) -> head, as the note
describes, or by a plain sum (`combine=sum`). The mix starts as the plain sum (identity blocks); with no
weight decay on the encoding's parameters (`encoding.weight_decay`, default 0) nothing pulls it toward 0.
It has no per-head constant: softmax over the keys ignores a constant added to every score of a query row,
so such a term never changes the model.

Each level's MLP runs on that level's distinct distances only, and the mix is applied to these small
per-distance tables (the mix is linear: exactly the note's mix of the per-pair biases).

- The token level depends on the length only: a shared (1, H, L, L) Toeplitz bias (`bias`), as multiscale,
  with multiscale's `clamp` (b(d) = b(min(d, N)); issue 28's arm on the token level).
- A sentence (paragraph) level is per sample, but of low rank: with u_j = s_j - min(s) in 0..R-1 over the
  window, b(s_i - s_j) = sum_v b(u_i - v) [u_j = v], so the bias is U E^T with U[i, v] = b(u_i - v) and E
  the one-hot of u_j: R = (the window's sentence span + 1) channels (`bias_factors`), about L / 60 for
  text. The model appends them to q and k; no (B, H, L, L) tensor is built, nor its gradient.
"""

import torch
from torch import Tensor, nn

from posab.encodings.base import BiasFactors, Dims, Encoding, Positions, distances, toeplitz
from posab.encodings.multiscale import DistanceMLP, clamp_distance
from posab.errors import ConfigError

LEVELS = ("token", "sentence", "paragraph")
COMBINES = ("mix", "sum")


class Hierarchical(Encoding):
    relative_only = True
    static_bias = True  # `bias` (the token level); the structural levels come through `bias_factors`

    def __init__(
        self,
        dims: Dims,
        levels: list[str] | tuple[str, ...] = LEVELS,
        combine: str = "mix",
        num_freqs: int = 16,
        max_dist: float = 4096.0,
        hidden: int = 64,
        clamp: int | str | None = None,
    ) -> None:
        super().__init__(dims)
        self.levels = tuple(levels)
        self.clamp = clamp_distance(clamp, dims.train_len, "hierarchical")  # the token level's reach
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

    def bias(self, pos: Positions) -> Tensor | None:
        """The token level: (1, H, L, L), or None without it."""
        device = self.level_mlps[self.levels[0]].taus.device
        table = self.distance_bias(distances(pos.length, device))  # (H, 2L-1), or None
        return None if table is None else toeplitz(table, pos.length)[None]  # (1, H, L, L)

    def distance_bias(self, distance: Tensor) -> Tensor | None:
        """(D,) token distances i - j -> (H, D) the token level's bias after the mix, or None without that
        level (read by the extrapolation audit). The sentence and paragraph levels are left out: their
        coordinates come from where a document's sentences and paragraphs end, not from i - j alone."""
        if "token" not in self.levels:
            return None
        return self._mixed("token", self.level_mlps["token"](self._clamped(distance)))

    def bias_features(self, distance: Tensor) -> Tensor | None:
        """(D,) token distances -> (D, 2K) the token level MLP's input features, or None without it."""
        if "token" not in self.levels:
            return None
        return self.level_mlps["token"].features(self._clamped(distance))

    def bias_factors(self, pos: Positions) -> BiasFactors | None:
        """The sentence and paragraph levels, their factors side by side: (B, H, L, R_s + R_p) and
        (B, 1, L, R_s + R_p); None with the token level alone."""
        factors = [self._level_factors(level, pos) for level in self.levels if level != "token"]
        if not factors:
            return None
        if len(factors) == 1:
            return factors[0]
        query = torch.cat([f.query for f in factors], dim=-1)  # (B, H, L, R_s + R_p)
        key = torch.cat([f.key for f in factors], dim=-1)  # (B, 1, L, R_s + R_p)
        return BiasFactors(query, key)

    def _level_factors(self, level: str, pos: Positions) -> BiasFactors:
        """U (B, H, L, R) and E (B, 1, L, R) of one structural level; R = its largest span + 1."""
        units = self._indices(pos, level)  # (B, L)
        unit = units - units.amin(dim=1, keepdim=True)  # (B, L): u = 0 .. span per sample
        rank = int(unit.max()) + 1
        values = torch.arange(-(rank - 1), rank, device=units.device, dtype=torch.float32)  # (2R-1,)
        table = self._mixed(level, self.level_mlps[level](values))  # (H, 2R-1): b(d) at d + R - 1
        slots = torch.arange(rank, device=units.device)  # (R,)
        index = unit[:, :, None] - slots + (rank - 1)  # (B, L, R): u_i - v + R - 1
        query = table[:, index].permute(1, 0, 2, 3)  # (H, B, L, R) -> (B, H, L, R)
        key = (unit[:, None, :, None] == slots).to(query.dtype)  # (B, 1, L, R) one-hot of u_j
        return BiasFactors(query, key)

    def _clamped(self, distance: Tensor) -> Tensor:
        """Token distances past `clamp` set to it (future ones untouched); unchanged without a clamp."""
        return distance if self.clamp is None else distance.clamp(max=self.clamp)

    def _mixed(self, level: str, table: Tensor) -> Tensor:
        """Apply `level`'s share of the linear mix to its (H, N) table."""
        if self.combine == "sum":
            return table
        return self.mix[self.levels.index(level)] @ table  # (H, H) @ (H, N) -> (H, N)

    @staticmethod
    def _indices(pos: Positions, level: str) -> Tensor:
        indices = pos.sentence if level == "sentence" else pos.paragraph
        if indices is None:
            raise ConfigError(
                f"the hierarchical bias needs {level} indices; pass them to the model with the tokens"
            )
        return indices
