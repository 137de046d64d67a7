"""T5 relative position bias (Raffel et al., 2020), causal bucketing.

b_h(i, j) = W[bucket(i - j), h], with W a learned (num_buckets, H) table, init N(0, 0.02^2).
bucket(n) for n = max(i - j, 0), as in the T5 code's `_relative_position_bucket(bidirectional=False)`:
with e = num_buckets // 2, n < e -> n (exact); otherwise
e + floor(ln(n / e) / ln(max_distance / e) * (num_buckets - e)), capped at num_buckets - 1 (every distance
from max_distance on shares the last bucket). Future distances (j > i, masked anyway) fall in bucket 0.
Buckets are computed on the 2L-1 distinct distances, then gathered into the (H, L, L) Toeplitz matrix.
"""

import math

import torch
from torch import Tensor, nn

from posab.encodings.base import Dims, Encoding, Positions, distances, toeplitz
from posab.errors import ConfigError


def t5_buckets(distance: Tensor, num_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """(N,) query-minus-key distances i - j -> (N,) int64 bucket ids in [0, num_buckets)."""
    n = distance.clamp(min=0).float()  # future distances -> 0
    exact = num_buckets // 2
    # clamp inside the log only to avoid log(0) on the exact branch, which `where` discards
    scaled = torch.log(n.clamp(min=exact) / exact) / math.log(max_distance / exact) * (num_buckets - exact)
    large = (exact + scaled.long()).clamp(max=num_buckets - 1)
    return torch.where(n < exact, n.long(), large)


class T5Bias(Encoding):
    relative_only = True
    static_bias = True

    def __init__(self, dims: Dims, num_buckets: int = 32, max_distance: int = 128) -> None:
        super().__init__(dims)
        if num_buckets < 2 or max_distance <= num_buckets // 2:
            raise ConfigError(
                f"t5 bias needs num_buckets >= 2 and max_distance > num_buckets // 2; "
                f"got num_buckets={num_buckets}, max_distance={max_distance}"
            )
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.table = nn.Parameter(torch.randn(num_buckets, dims.n_heads) * 0.02)  # (num_buckets, H)

    def bias(self, pos: Positions) -> Tensor:
        buckets = t5_buckets(distances(pos.length, self.table.device), self.num_buckets, self.max_distance)
        table = self.table[buckets].transpose(0, 1)  # (2L-1, H) -> (H, 2L-1)
        return toeplitz(table, pos.length)[None]  # (1, H, L, L)
