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
  the one-hot of u_j: R = (the window's sentence span + 1) channels, about L / 60 for text (the form
  `LowRank`); no (B, H, L, L) gradient is built. R is read from the indices on the host, which on the CPU
  is no synchronisation; on any other device the levels are gathered by index from their tables instead
  (b[h, s_i - s_j], one (B, H, c, n) tensor), so the forward pass never waits on the device.
"""

from typing import Any

import torch
from torch import Tensor, nn

from posab.encodings.base import Dims, Encoding, Kind, Positions, distances
from posab.encodings.multiscale import DistanceMLP, clamp_distance, clamp_unseen_in_training
from posab.errors import ConfigError
from posab.forms import Additive, BiasFactors, Form, LowRank

LEVELS = ("token", "sentence", "paragraph")
COMBINES = ("mix", "sum")


class Hierarchical(Encoding):
    kind = Kind.STRUCTURE_BIAS
    relative_only = True

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
        if self.levels == ("token",):
            self.kind = Kind.DISTANCE_BIAS  # its token level alone: a bias by distance
        if dims.window is not None and self.levels != ("token",):
            raise ConfigError(
                f"model.window={dims.window}: the hierarchical bias's sentence and paragraph levels have no "
                "sliding window here; use model.window=null or encoding.levels=[token]"
            )
        h = dims.n_heads
        mlps = {level: DistanceMLP(h, num_freqs, max_dist, hidden) for level in self.levels}
        self.level_mlps = nn.ModuleDict(mlps)
        if combine == "mix":
            # mix[l] maps level l's H heads to the output H heads; starts as the plain sum
            self.mix = nn.Parameter(torch.eye(h).repeat(len(self.levels), 1, 1))  # (levels, H, H)

    @property
    def static_form(self) -> bool:  # type: ignore[override]
        return self.levels == ("token",)

    def attention_form(self, pos: Positions, queries: int, dtype: torch.dtype) -> Form:
        """The token level by distance beside the structural levels: `LowRank` on the CPU (factors),
        elsewhere one `Additive` with the levels gathered by index."""
        token = self.distance_form(pos, queries, dtype) if "token" in self.levels else None
        structural = [level for level in self.levels if level != "token"]
        if not structural:
            return token
        if pos.token.device.type != "cpu":
            gathered = sum(self._level_gathered(level, pos, queries) for level in structural)
            return Additive(gathered if token is None else token.dense_bias() + gathered, dtype)
        return LowRank(token, self.bias_factors(pos, queries), dtype)

    @classmethod
    def same_in_training(cls, setting: str, before: Any, after: Any, train_len: int) -> bool:
        """`clamp` between reaches that never act in training (none, or >= train_len - 1)."""
        return setting == "clamp" and clamp_unseen_in_training(before, after, train_len, "hierarchical")

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

    def bias_factors(self, pos: Positions, queries: int) -> BiasFactors:
        """The sentence and paragraph levels, their factors side by side: (B, H, c, R_s + R_p) for the last
        `queries` queries and (B, 1, n, R_s + R_p) for every key."""
        factors = [self._level_factors(level, pos) for level in self.levels if level != "token"]
        if len(factors) == 1:
            query, key = factors[0].query, factors[0].key
        else:
            query = torch.cat([f.query for f in factors], dim=-1)  # (B, H, n, R_s + R_p)
            key = torch.cat([f.key for f in factors], dim=-1)  # (B, 1, n, R_s + R_p)
        return BiasFactors(query if queries == pos.length else query[:, :, -queries:], key)

    def _level_gathered(self, level: str, pos: Positions, queries: int) -> Tensor:
        """One structural level gathered by index: (B, H, c, n), b(s_i - s_j) from its (H, 2n-1) table."""
        units, n = self._indices(pos, level), pos.length  # (B, n)
        table = self._mixed(level, self.level_mlps[level](distances(n, units.device)))  # (H, 2n-1)
        relative = units[:, -queries:, None] - units[:, None, :]  # (B, c, n), |s_i - s_j| < n
        return table[:, relative + (n - 1)].transpose(0, 1)  # (H, B, c, n) -> (B, H, c, n)

    def _level_factors(self, level: str, pos: Positions) -> BiasFactors:
        """U (B, H, n, R) and E (B, 1, n, R) of one structural level; R = its largest span + 1."""
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
