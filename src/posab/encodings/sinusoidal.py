"""Sinusoidal absolute positions (Vaswani et al., 2017), added to the token embeddings.

PE(p, 2i) = sin(p / base^(2i/d)), PE(p, 2i+1) = cos(p / base^(2i/d)); defined at any position p, and every
row has norm sqrt(d/2). How PE meets the token embeddings x (norm ~ INIT_STD * sqrt(d) at initialisation,
0.23 at d=128) is `form`:

- `scaled` (default): x + s * PE, s a scalar, learned unless `learn_scale=false`: x-transformers'
  `ScaledSinusoidalEmbedding` (lucidrains/x-transformers). x-transformers starts s at d^-0.5 for its own
  embeddings; here s starts at INIT_STD * sqrt(d) / sqrt(d/2) = INIT_STD * sqrt(2), so that s * PE has the
  token embeddings' norm at initialisation and position and token enter the first LayerNorm equally.
- `paper`: x * sqrt(d) + PE, as the paper's section 3.4 writes it; with INIT_STD the position signal is
  still ~3x the token signal.
- `unscaled`: x + PE, the form every run used before `form` existed: the position signal is ~35x the
  token signal at d=128, so the first LayerNorm sees almost nothing of the token.
"""

import math

import torch
from torch import Tensor, nn

from posab.encodings.base import INIT_STD, Dims, Encoding, Kind, Positions
from posab.errors import ConfigError

FORMS = ("scaled", "paper", "unscaled")


class Sinusoidal(Encoding):
    kind = Kind.ABSOLUTE
    relative_only = False

    def __init__(
        self, dims: Dims, base: float = 10000.0, form: str = "scaled", learn_scale: bool = True
    ) -> None:
        super().__init__(dims)
        d = dims.d_model
        if d % 2:
            raise ConfigError(f"sinusoidal encoding needs an even model.d_model, got {d}")
        if form not in FORMS:
            raise ConfigError(f"sinusoidal form={form!r}: use one of {list(FORMS)}")
        self.form = form
        self.token_scale = math.sqrt(d) if form == "paper" else 1.0
        # s of the scaled form, E||x|| / ||PE row|| at initialisation; None in the other forms
        scale = torch.tensor(INIT_STD * math.sqrt(d) / math.sqrt(d / 2)) if form == "scaled" else None
        if scale is not None and learn_scale:
            self.scale = nn.Parameter(scale)  # ()
        else:
            self.register_buffer("scale", scale, persistent=False)
        exponents = torch.arange(0, d, 2, dtype=torch.float32) / d
        self.register_buffer("inv_freq", base**-exponents, persistent=False)  # (C/2,)

    def table(self, positions: Tensor) -> Tensor:
        """positions: (T,) -> (T, C) with sin in even and cos in odd channels."""
        angles = positions.float()[:, None] * self.inv_freq[None, :]  # (T, C/2)
        return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # (T, C/2, 2) -> (T, C)

    def embed(self, x: Tensor, pos: Positions) -> Tensor:
        pe = self.table(pos.token)  # (T, C)
        if self.scale is not None:
            pe = pe * self.scale
        return x * self.token_scale + pe.to(x.dtype)[None]
