"""FIRE (Li et al., 2023, "Functional Interpolation for Relative Positions Improves Long Context
Transformers", arXiv:2310.04418; ICLR 2024).

b(i, j) = f( psi(i - j) / psi(max(i, L_thr)) ) for j <= i, psi(x) = ln(1 + c x), f: 1 -> hidden -> H ReLU
MLP (the paper's code). c = exp(log_c) > 0 (init `init_c`: 0.1, the paper's code) and
L_thr = train_len * exp(log_scale) > 0 (init the training length) are learned. i is the absolute query
position (offset included): the normaliser depends on it, so FIRE is not offset invariant. Future pairs
(masked anyway) get input 0.

Exact and cheap: f is piecewise linear in its scalar input, with a kink at each hidden unit's t_k = -b1_k /
w1_k. On the segment between consecutive sorted kinks the same units are active, so
f(x) = S[s] x + I[s] with S[s] = sum_{k active} w2_k w1_k, I[s] = b2 + sum_{k active} w2_k b1_k: an
(hidden + 1, H) table built from the MLP's weights (differentiable), one `searchsorted` per pair for s,
then a gather and a multiply-add per pair and head, instead of hidden * (H + 1) multiply-adds per pair.
Autograd gives the same gradients as the MLP's (ReLU's derivative taken as 0 at a kink).
"""

import math

import torch
from torch import Tensor, nn

from posab.encodings.base import Dims, Encoding, Kind, Positions, distances
from posab.errors import ConfigError
from posab.forms import Additive, Form, block_toeplitz


def relu_mlp_pieces(mlp: nn.Sequential) -> tuple[Tensor, Tensor, Tensor]:
    """A 1 -> K -> H ReLU MLP as a piecewise-linear function.

    returns kinks (K,) sorted ascending, slopes (K+1, H) and intercepts (K+1, H): on segment s (the inputs
    x with exactly s kinks below x), f(x) = slopes[s] x + intercepts[s].
    """
    w1, b1 = mlp[0].weight[:, 0], mlp[0].bias  # (K,), (K,)
    w2, b2 = mlp[2].weight, mlp[2].bias  # (H, K), (H,)
    k = w1.shape[0]
    with torch.no_grad():  # which units are active where: piecewise constant, no gradient
        kinks = torch.where(w1 != 0, -b1 / w1, torch.full_like(w1, math.inf))  # (K,); flat unit: never
        kinks, order = kinks.sort()
        rank = torch.empty_like(order)
        rank[order] = torch.arange(k, device=w1.device)  # rank[u]: place of unit u's kink
        seg = torch.arange(k + 1, device=w1.device)[:, None]  # (K+1, 1)
        active = torch.where(w1 > 0, rank < seg, torch.where(w1 < 0, rank >= seg, b1 > 0))  # (K+1, K)
    act = active.to(w2.dtype)[:, None, :]  # (K+1, 1, K); elementwise sums: float32 even under autocast
    slopes = (act * (w2 * w1)[None]).sum(-1)  # (K+1, H, K) -> (K+1, H)
    intercepts = (act * (w2 * b1)[None]).sum(-1) + b2  # (K+1, H)
    return kinks, slopes, intercepts


class FIRE(Encoding):
    kind = Kind.DENSE_BIAS
    relative_only = False

    def __init__(self, dims: Dims, hidden: int = 32, init_c: float = 0.1) -> None:
        super().__init__(dims)
        if hidden < 1 or init_c <= 0 or dims.train_len < 1:
            raise ConfigError(
                f"fire needs hidden >= 1, init_c > 0 and train.seq_len >= 1; "
                f"got hidden={hidden}, init_c={init_c}, seq_len={dims.train_len}"
            )
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, dims.n_heads))
        self.log_c = nn.Parameter(torch.tensor(math.log(init_c)))
        self.log_scale = nn.Parameter(torch.tensor(0.0))  # L_thr = train_len * exp(log_scale)

    @property
    def c(self) -> Tensor:
        return self.log_c.exp()

    @property
    def threshold(self) -> Tensor:
        return self.dims.train_len * self.log_scale.exp()

    def psi(self, x: Tensor) -> Tensor:
        """psi(x) = ln(1 + c x), elementwise."""
        return torch.log1p(self.c * x)

    def inputs(self, pos: Positions, queries: int | None = None) -> Tensor:
        """(c, n) MLP inputs psi(i - j) / psi(max(i, L_thr)) of the last `queries` queries (default all n)
        over the n keys, in [0, 1] for j <= i; 0 for j > i."""
        n = pos.length
        c = n if queries is None else queries
        psi_d = self.psi(distances(n, pos.token.device).clamp(min=0))  # (2n-1,)
        numer = block_toeplitz(psi_d[None], c, n)[0]  # (1, 2n-1) -> (1, c, n) -> (c, n)
        denom = self.psi(torch.maximum(pos.token[-c:].float(), self.threshold))  # (c,)
        return numer / denom[:, None]  # (c, n)

    def attention_form(self, pos: Positions, queries: int, dtype: torch.dtype) -> Form:
        """A bias by distance and query position: the dense form, (1, H, c, n)."""
        bias = self._mlp(self.inputs(pos, queries))[None]  # (H, c, n) -> (1, H, c, n)
        return Additive(bias, dtype, window=self.dims.window)

    def distance_bias(self, distance: Tensor) -> Tensor:
        """(D,) distances i - j >= 0 -> (H, D) the bias of the query i = max(distance), as `bias` computes
        its row (read by the extrapolation audit).

        FIRE's bias depends on the query through its normaliser psi(max(i, L_thr)); given the distances
        0 .. L-1 of a window of L tokens, this is the row of its last query, i = L - 1: the only query that
        sees every distance of the window, and the one whose normaliser is furthest from training's."""
        x = self.psi(distance.clamp(min=0)) / self.psi(torch.maximum(distance.max(), self.threshold))  # (D,)
        return self._mlp(x[None])[:, 0]  # (1, D) -> (H, 1, D) -> (H, D)

    def _mlp(self, x: Tensor) -> Tensor:
        """The MLP through its linear pieces: (N, M) inputs -> (H, N, M)."""
        kinks, slopes, intercepts = relu_mlp_pieces(self.mlp)
        inputs = x.detach().contiguous()  # a block's inputs are a strided view
        seg = torch.searchsorted(kinks, inputs, out_int32=True).flatten()  # (N*M,): number of kinks < x
        slope = slopes.t().index_select(1, seg).view(-1, *x.shape)  # (H, K+1) -> (H, N*M) -> (H, N, M)
        intercept = intercepts.t().index_select(1, seg).view(-1, *x.shape)  # (H, N*M) -> (H, N, M)
        return torch.addcmul(intercept, slope, x)  # (H, N, M)
