"""Sinusoidal absolute positions (Vaswani et al., 2017), added to the token embeddings.

PE(p, 2i) = sin(p / base^(2i/d)), PE(p, 2i+1) = cos(p / base^(2i/d)); defined at any position p.
"""

import torch
from torch import Tensor

from posab.encodings.base import Dims, Encoding, Positions
from posab.errors import ConfigError


class Sinusoidal(Encoding):
    relative_only = False

    def __init__(self, dims: Dims, base: float = 10000.0) -> None:
        super().__init__(dims)
        if dims.d_model % 2:
            raise ConfigError(f"sinusoidal encoding needs an even model.d_model, got {dims.d_model}")
        exponents = torch.arange(0, dims.d_model, 2, dtype=torch.float32) / dims.d_model
        self.register_buffer("inv_freq", base**-exponents, persistent=False)  # (C/2,)

    def table(self, positions: Tensor) -> Tensor:
        """positions: (T,) -> (T, C) with sin in even and cos in odd channels."""
        angles = positions.float()[:, None] * self.inv_freq[None, :]  # (T, C/2)
        return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # (T, C/2, 2) -> (T, C)

    def embed(self, x: Tensor, pos: Positions) -> Tensor:
        return x + self.table(pos.token).to(x.dtype)[None]
