"""Sinusoidal absolute positions (Vaswani et al., 2017), added to the token embeddings.

PE(p, 2i) = sin(p / base^(2i/d)), PE(p, 2i+1) = cos(p / base^(2i/d)); defined at any position p.
`scale_embeddings=true` multiplies the token embeddings by sqrt(d) first, as the paper does: with GPT-2
initialisation (std 0.02) the unscaled position signal (norm sqrt(d/2)) is ~35x the token signal at d=128.
"""

import math

import torch
from torch import Tensor

from posab.encodings.base import Dims, Encoding, Positions
from posab.errors import ConfigError


class Sinusoidal(Encoding):
    relative_only = False

    def __init__(self, dims: Dims, base: float = 10000.0, scale_embeddings: bool = False) -> None:
        super().__init__(dims)
        self.token_scale = math.sqrt(dims.d_model) if scale_embeddings else 1.0
        if dims.d_model % 2:
            raise ConfigError(f"sinusoidal encoding needs an even model.d_model, got {dims.d_model}")
        exponents = torch.arange(0, dims.d_model, 2, dtype=torch.float32) / dims.d_model
        self.register_buffer("inv_freq", base**-exponents, persistent=False)  # (C/2,)

    def table(self, positions: Tensor) -> Tensor:
        """positions: (T,) -> (T, C) with sin in even and cos in odd channels."""
        angles = positions.float()[:, None] * self.inv_freq[None, :]  # (T, C/2)
        return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # (T, C/2, 2) -> (T, C)

    def embed(self, x: Tensor, pos: Positions) -> Tensor:
        return x * self.token_scale + self.table(pos.token).to(x.dtype)[None]
