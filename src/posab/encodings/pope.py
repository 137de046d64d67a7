"""PoPE, polar coordinate position embeddings (Gopalakrishnan et al., 2025, "Decoupling the 'What' and
'Where' With Polar Coordinate Positional Embeddings", arXiv:2509.10534; x-transformers' `PolarEmbedding`
and `apply_polar_pos_emb`): each channel c of a query or key becomes a complex number whose magnitude is
the content alone, softplus(x_c), and whose phase is the position alone, p theta_c with one frequency per
channel, theta_c = base^(-c/D), c = 0 .. D - 1, and for keys a learned phase bias delta_{h,c} in
[-2 pi, 0] (zero at initialisation, clamped as the reference clamps it):

    q'_i = [softplus(q_i) cos(i theta), softplus(q_i) sin(i theta)]                  (2D channels)
    k'_j = [softplus(k_j) cos(j theta + delta), softplus(k_j) sin(j theta + delta)]
    q'_i . k'_j = sum_c softplus(q_ic) softplus(k_jc) cos((i - j) theta_c - delta_c),

a function of i - j alone. The logits keep the head's own scale, q'.k' / sqrt(D) (the reference's
`dim_head ** -0.5`): the attention forms divide by the root of q's last dimension, now 2D, so q' carries a
factor sqrt(2). One phase bias per head, shared by the layers (one `PolarEmbedding` per model, as the
reference builds it). Computed in float32 (the reference turns autocast off) and returned in q's dtype.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posab.encodings.base import Dims, Encoding, Kind, Positions


def polar_frequencies(base: float, head_dim: int) -> Tensor:
    """theta_c = base^(-c/D), c = 0 .. D - 1: (D,) float64 (one per channel, not per pair as RoPE's)."""
    return base ** -(torch.arange(head_dim, dtype=torch.float64) / head_dim)


def polar(x: Tensor, angles: Tensor, gain: float = 1.0) -> Tensor:
    """x (B, H, T, D) as [softplus(x) cos(angles), softplus(x) sin(angles)] * gain, angles (.., T, D)
    broadcast over x: (B, H, T, 2D) in x's dtype."""
    magnitude = F.softplus(x.float())  # (B, H, T, D)
    angles = angles.float()
    out = torch.cat([magnitude * angles.cos(), magnitude * angles.sin()], dim=-1)  # (B, H, T, 2D)
    return (out * gain if gain != 1.0 else out).to(x.dtype)


class PoPE(Encoding):
    kind = Kind.ROTARY  # acts through `rotate` on each token's own position (its phase)
    relative_only = True  # q'.k' depends on i - j alone, up to float rounding of the angles

    def __init__(self, dims: Dims, base: float = 10000.0) -> None:
        super().__init__(dims)
        self.base = base
        self.register_buffer("inv_freq", polar_frequencies(base, dims.head_dim), persistent=False)  # (D,)
        self.phase_bias = nn.Parameter(torch.zeros(dims.n_heads, 1, dims.head_dim))  # delta: (H, 1, D)

    def angles(self, pos: Positions) -> Tensor:
        """p theta_c of every token: (T, D) float64."""
        return pos.token.to(torch.float64)[:, None] * self.inv_freq[None, :]

    def rotate(self, q: Tensor, k: Tensor, pos: Positions, layer: int = 0) -> tuple[Tensor, Tensor]:
        """q, k (B, H, T, D) -> q', k' (B, H, T, 2D) (module docstring)."""
        angles = self.angles(pos).float()  # (T, D)
        delta = self.phase_bias.clamp(-2 * math.pi, 0.0)  # (H, 1, D), the reference's clamp
        return polar(q, angles, math.sqrt(2.0)), polar(k, angles + delta)  # (H, T, D) angles for keys
