"""Multi-scale relative bias (the design note, section 5.1).

score(i, j) = q_i.k_j / sqrt(d) + b(i - j),  b(d) = MLP([sin(d / tau_k), cos(d / tau_k)]_k),
tau_k = exp(linspace(0, ln L_max, K)); one MLP shared by all positions, one output per head. Values are
untouched. The MLP runs on the 2L-1 distinct distances only, then the (H, 2L-1) table is gathered into an
(H, L, L) Toeplitz matrix: never on all L^2 pairs.
"""

import math

import torch
from torch import Tensor, nn

from posab.encodings.base import Dims, Encoding, Positions, distances, toeplitz
from posab.errors import ConfigError


class DistanceMLP(nn.Module):
    """b(d) = MLP([sin(d / tau_k), cos(d / tau_k)]): (N,) distances -> (H, N) per-head bias."""

    def __init__(self, n_heads: int, num_freqs: int = 16, max_dist: float = 4096.0, hidden: int = 64) -> None:
        super().__init__()
        if num_freqs < 1 or max_dist < 1 or hidden < 1:
            raise ConfigError(
                f"multi-scale bias needs num_freqs >= 1, max_dist >= 1 and hidden >= 1; "
                f"got num_freqs={num_freqs}, max_dist={max_dist}, hidden={hidden}"
            )
        taus = torch.exp(torch.linspace(0.0, math.log(max_dist), num_freqs))  # (K,)
        self.register_buffer("taus", taus, persistent=False)
        self.mlp = nn.Sequential(nn.Linear(2 * num_freqs, hidden), nn.GELU(), nn.Linear(hidden, n_heads))

    def features(self, d: Tensor) -> Tensor:
        """(N,) -> (N, 2K)."""
        angles = d.float()[:, None] / self.taus[None, :]  # (N, K)
        return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (N, 2K)

    def forward(self, d: Tensor) -> Tensor:
        return self.mlp(self.features(d)).transpose(0, 1)  # (N, H) -> (H, N)


class MultiScale(Encoding):
    relative_only = True
    static_bias = True

    def __init__(self, dims: Dims, num_freqs: int = 16, max_dist: float = 4096.0, hidden: int = 64) -> None:
        super().__init__(dims)
        self.distance_mlp = DistanceMLP(dims.n_heads, num_freqs, max_dist, hidden)

    def bias(self, pos: Positions) -> Tensor:
        device = self.distance_mlp.taus.device
        table = self.distance_mlp(distances(pos.length, device))  # (H, 2L-1)
        return toeplitz(table, pos.length)[None]  # (1, H, L, L)
