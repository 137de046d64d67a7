"""Multi-scale relative bias (the design note, section 5.1), with the design space of its section 3.3.

score(i, j) = q_i.k_j / sqrt(d) + b(i - j),  b(d) = MLP([sin(d / tau_k), cos(d / tau_k)]_k),
tau_k = exp(linspace(0, ln L_max, K)); one MLP shared by all positions, one output per head. Values are
untouched. The MLP runs on the 2L-1 distinct distances only, then the (H, 2L-1) table is gathered into an
(H, L, L) Toeplitz matrix: never on all L^2 pairs.

Options (the note's defaults first):
- `spacing`: `log` (tau_k log-spaced, the note) or `linear` (tau_k = linspace(1, L_max, K));
- `input`: `raw` (d itself, the note), `log` (sign(d) ln(1 + |d|), rescaled so that d = L_max maps to L_max:
  the input grows slowly past the training length), or `fire` (FIRE-style, Li et al. 2023:
  u = ln(1 + d) / ln(1 + max(i, L_train)) * L_max for j <= i, bounded at any length; it depends on the
  query position i beyond the training length, so it is not offset-invariant there), or `fire_held` (the
  FIRE input with its normaliser held at training's, u = ln(1 + d) / ln(1 + L_train) * L_max at every
  query: the same input as `fire` in training, where no query reaches L_train, and past it an input of d
  alone, so the trained distances keep their inputs; issue 28, what the audit's `novelty_near` suggests);
- `form`: `additive` (form (1): + b(d)) or `multiplicative` (form (2): q.k * g(d) / sqrt(d) + b(d), with
  g(d) = 1 + MLP_g(...) from its own multi-scale MLP, initialised to g = 1);
- `clamp`: None (the note: every distance its own input), `train` (L_train - 1) or a distance N >= 1:
  b(d) = b(min(d, N)), so no distance past N is an input the MLP has not seen in training when N < L_train.
  T5's treatment of its last bucket (Raffel et al. 2020, section 2.1: every distance beyond `max_distance`
  shares one bucket); issue 28's ablation arm.
"""

import math
from typing import Any

import torch
from torch import Tensor, nn

from posab.encodings.base import Dims, Encoding, Kind, Positions, distances
from posab.errors import ConfigError
from posab.forms import Additive, Form, Scaled

SPACINGS = ("log", "linear")
INPUTS = ("raw", "log", "fire", "fire_held")
FORMS = ("additive", "multiplicative")
CHUNK = 1 << 20  # distinct inputs per MLP call when they are many (fire input beyond the training length)


def clamp_unseen_in_training(before: Any, after: Any, train_len: int, label: str) -> bool:
    """Whether both clamps leave every training distance (<= train_len - 1) its own input."""
    reaches = [clamp_distance(value, train_len, label) for value in (before, after)]
    return all(reach is None or reach >= train_len - 1 for reach in reaches)


def clamp_distance(clamp: int | str | None, train_len: int, label: str = "multiscale") -> int | None:
    """The largest distance the MLP sees: None (no clamp), `train` -> train_len - 1, or N >= 1 (`label`:
    the encoding, for the error)."""
    if clamp is None:
        return None
    if clamp == "train":
        return train_len - 1
    if isinstance(clamp, bool) or not isinstance(clamp, int) or clamp < 1:
        raise ConfigError(f"{label} clamp={clamp!r}: use null, 'train' (L_train - 1) or a distance >= 1")
    return clamp


class DistanceMLP(nn.Module):
    """b(d) = MLP([sin(d / tau_k), cos(d / tau_k)]): (N,) distances -> (H, N) per-head bias."""

    def __init__(
        self,
        n_heads: int,
        num_freqs: int = 16,
        max_dist: float = 4096.0,
        hidden: int = 64,
        spacing: str = "log",
    ) -> None:
        super().__init__()
        if num_freqs < 1 or max_dist < 1 or hidden < 1:
            raise ConfigError(
                f"multi-scale bias needs num_freqs >= 1, max_dist >= 1 and hidden >= 1; "
                f"got num_freqs={num_freqs}, max_dist={max_dist}, hidden={hidden}"
            )
        if spacing not in SPACINGS:
            raise ConfigError(f"multi-scale spacing={spacing!r}: use one of {list(SPACINGS)}")
        if spacing == "log":
            taus = torch.exp(torch.linspace(0.0, math.log(max_dist), num_freqs))  # (K,)
        else:
            taus = torch.linspace(1.0, max_dist, num_freqs)  # (K,)
        self.register_buffer("taus", taus, persistent=False)
        self.mlp = nn.Sequential(nn.Linear(2 * num_freqs, hidden), nn.GELU(), nn.Linear(hidden, n_heads))

    def features(self, d: Tensor) -> Tensor:
        """(N,) -> (N, 2K)."""
        angles = d.float()[:, None] / self.taus[None, :]  # (N, K)
        return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (N, 2K)

    def forward(self, d: Tensor) -> Tensor:
        return self.mlp(self.features(d)).transpose(0, 1)  # (N, H) -> (H, N)


class MultiScale(Encoding):
    kind = Kind.DISTANCE_BIAS  # on its raw, log or held inputs, additive (`__init__`: by its settings)
    relative_only = True
    static_form = True

    def __init__(
        self,
        dims: Dims,
        num_freqs: int = 16,
        max_dist: float = 4096.0,
        hidden: int = 64,
        spacing: str = "log",
        input: str = "raw",
        form: str = "additive",
        clamp: int | str | None = None,
    ) -> None:
        super().__init__(dims)
        self.clamp = clamp_distance(clamp, dims.train_len)
        if input not in INPUTS:
            raise ConfigError(f"multiscale input={input!r}: use one of {list(INPUTS)}")
        if form not in FORMS:
            raise ConfigError(f"multiscale form={form!r}: use one of {list(FORMS)}")
        self.input, self.max_dist, self.train_len = input, max_dist, dims.train_len
        self.relative_only = self.static_form = input != "fire"
        self.kind = (
            Kind.SCALED if form == FORMS[1] else Kind.DENSE_BIAS if input == "fire" else Kind.DISTANCE_BIAS
        )
        self.distance_mlp = DistanceMLP(dims.n_heads, num_freqs, max_dist, hidden, spacing)
        self.gate_mlp = (
            DistanceMLP(dims.n_heads, num_freqs, max_dist, hidden, spacing) if form == FORMS[1] else None
        )
        if self.gate_mlp is not None:
            nn.init.zeros_(self.gate_mlp.mlp[-1].weight)  # g(d) = 1 at the start
            nn.init.zeros_(self.gate_mlp.mlp[-1].bias)

    def attention_form(self, pos: Positions, queries: int, dtype: torch.dtype) -> Form:
        bias = self._pairwise(self.distance_mlp, pos, queries, dtype)
        if self.gate_mlp is None:
            return bias
        gate = self._pairwise(self.gate_mlp, pos, queries, dtype).dense_bias()  # (1, H, c, n)
        return Scaled(1.0 + gate, bias)

    @classmethod
    def same_in_training(cls, setting: str, before: Any, after: Any, train_len: int) -> bool:
        """`clamp` between reaches that never act in training (none, or >= train_len - 1), and `input`
        between `fire` and `fire_held`, which agree at every query below the training length."""
        if setting == "clamp":
            return clamp_unseen_in_training(before, after, train_len, "multiscale")
        return setting == "input" and {before, after} <= {"fire", "fire_held"}

    def distance_bias(self, distance: Tensor) -> Tensor:
        """(D,) distances i - j >= 0 -> (H, D) the additive bias b(d) as `bias` computes it; with the `fire`
        input, that of the query i = max(distance), the last query of a window of distances 0 .. L-1 (read
        by the extrapolation audit; a `multiplicative` form's g(d) is not included)."""
        return self.distance_mlp(self._inputs(distance))

    def bias_features(self, distance: Tensor) -> Tensor:
        """(D,) distances as `distance_bias` -> (D, 2K) the bias MLP's input features (audit: novelty)."""
        return self.distance_mlp.features(self._inputs(distance))

    def _pairwise(self, mlp: DistanceMLP, pos: Positions, queries: int, dtype: torch.dtype) -> Additive:
        """`mlp`'s bias as a form: from the 2n-1 distances, or from the distinct FIRE inputs of the queries
        (their largest position read on the host: `Positions.last`)."""
        if self.input == "fire" and pos.last >= self.train_len:
            bias = self._query_normalised(mlp, pos, queries)[None]  # (1, H, c, n)
            return Additive(bias, dtype, window=self.dims.window)
        d = self._clamped(distances(pos.length, pos.token.device))  # (2n-1,)
        return Additive.by_distance(mlp(self._transform(d)), queries, pos.length, dtype, self.dims.window)

    def _inputs(self, distance: Tensor) -> Tensor:
        """(D,) the MLP's scalar inputs at distances i - j >= 0 for the query i = max(distance), on the branch
        `_pairwise` takes for a window whose last query is i."""
        query = distance.max()
        if self.input == "fire" and int(query) >= self.train_len:  # the audit's curve, not a forward pass
            return self._fire_input(self._clamped(distance), query)
        return self._transform(self._clamped(distance))

    def _clamped(self, d: Tensor) -> Tensor:
        """Distances past `clamp` set to it (future ones, negative, untouched); d itself without a clamp."""
        return d if self.clamp is None else d.clamp(max=self.clamp)

    def _transform(self, d: Tensor) -> Tensor:
        """The MLP's input for distances d, while the FIRE normaliser is the same for every query."""
        scale = self.max_dist / math.log1p(self.max_dist)
        if self.input == "log":
            return d.sign() * torch.log1p(d.abs()) * scale
        if self.input in ("fire", "fire_held"):
            return torch.log1p(d.clamp_min(0)) / math.log1p(self.train_len) * self.max_dist
        return d

    def _query_normalised(self, mlp: DistanceMLP, pos: Positions, queries: int) -> Tensor:
        """FIRE input past the training length: the MLP on the distinct (query, distance) inputs of the last
        `queries` queries (`torch.unique`: a host synchronisation, and no meta kernel). Returns (H, c, n)."""
        keys = pos.token.float()  # (n,)
        i = keys[-queries:]  # (c,)
        d = self._clamped(i[:, None] - keys[None, :])  # (c, n)
        values, inverse = torch.unique(self._fire_input(d, i[:, None]), return_inverse=True)
        table = torch.cat([mlp(chunk) for chunk in values.split(CHUNK)], dim=1)  # (H, N)
        return table[:, inverse]  # (H, c, n)

    def _fire_input(self, d: Tensor, query: Tensor) -> Tensor:
        """The FIRE input of distances d (future ones clamped to 0) at query positions `query`, broadcast
        against d: ln(1 + d) / ln(1 + max(i, L_train)) * L_max."""
        return torch.log1p(d.clamp_min(0)) / torch.log1p(query.clamp_min(self.train_len)) * self.max_dist
