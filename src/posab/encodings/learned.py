"""Learned absolute position embeddings added to the token embeddings (GPT-2; Radford et al., 2019).

x_p <- x_p + E[p], with E a learned (P, C) table, init N(0, 0.02^2). P = dims.max_positions, the largest
position + 1 the run will use (evaluation and shift offsets included). Only rows below the training
length ever receive a gradient: the rows past it stay at their random initialisation (weight decay aside),
which is what an evaluation past the training length honestly measures. A position >= P is an error.

A checkpoint saved with another number of rows (re-evaluation at other lengths) loads its rows into the
first rows of the table; rows it lacks keep their fresh initialisation, and rows past the table (positions
this run never uses) are dropped.
"""

from typing import Any

import torch
from torch import Tensor, nn

from posab.encodings.base import Dims, Encoding, Positions
from posab.errors import ConfigError


class Learned(Encoding):
    relative_only = False

    def __init__(self, dims: Dims, init_std: float = 0.02) -> None:
        super().__init__(dims)
        if dims.max_positions < 1 or init_std < 0:
            raise ConfigError(
                f"learned positions need max_positions >= 1 and init_std >= 0; "
                f"got max_positions={dims.max_positions}, init_std={init_std}"
            )
        self.weight = nn.Parameter(torch.randn(dims.max_positions, dims.d_model) * init_std)  # (P, C)

    @property
    def num_rows(self) -> int:
        return self.weight.shape[0]

    def embed(self, x: Tensor, pos: Positions) -> Tensor:
        last = int(pos.token.max())
        if last >= self.num_rows:
            raise ConfigError(
                f"learned position embeddings: position {last} needs a row, but the table has "
                f"{self.num_rows} rows (positions 0..{self.num_rows - 1}); it is sized from the longest "
                "eval.lengths / eval.needle.lengths / eval.shift setting of the run"
            )
        return x + self.weight[pos.token].to(x.dtype)[None]  # (T, C) -> (1, T, C)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        """Accept a saved table with another number of rows: copy its rows into the first rows."""
        key = prefix + "weight"
        saved = state_dict.get(key)
        if (
            isinstance(saved, Tensor)
            and saved.dim() == 2
            and saved.shape[1] == self.weight.shape[1]
            and saved.shape[0] != self.num_rows
        ):
            rows = min(saved.shape[0], self.num_rows)
            merged = self.weight.detach().clone()  # (P, C): saved rows first, initialised rows after
            merged[:rows] = saved[:rows].to(merged)
            state_dict[key] = merged
        super()._load_from_state_dict(state_dict, prefix, *args)
