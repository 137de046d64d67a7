"""Learned absolute position embeddings added to the token embeddings (GPT-2; Radford et al., 2019).

x_p <- x_p + E[p], with E a learned (P, C) table, init N(0, init_std^2): with the default init_std = the
model's INIT_STD, ||E[p]|| equals the token embeddings' norm at initialisation. P = dims.max_positions, the
largest position + 1 the run will use (evaluation and shift offsets included). Only rows below the training
length ever receive a gradient: the rows past it stay at their random initialisation, which is what an
evaluation past the training length honestly measures (`summary`: rows trained vs allocated). A position
>= P is an error.

The table is drawn row by row from a generator of its own, seeded from the run's seed: row p is the same
whatever P is, and building the table leaves the global RNG alone, so the evaluation lengths (which set P)
change neither the table's first rows nor the rest of the model's initialisation.

A checkpoint saved with another number of rows (re-evaluation at other lengths) loads its rows into the
first rows of the table; rows it lacks keep their fresh initialisation, and rows past the table (positions
this run never uses) are dropped.
"""

from typing import Any

import torch
from torch import Tensor, nn

from posab.encodings.base import INIT_STD, Dims, Encoding, Kind, Positions
from posab.errors import ConfigError

SEED_OFFSET = 10_000  # the table's generator seed = run seed + this: never a run's own torch seed (0, 1, ...)


def table_rows(rows: int, width: int, seed: int) -> Tensor:
    """(rows, width) standard normal draws, row p from the p-th draw of a generator seeded with `seed`:
    the first rows are the same whatever `rows` is (one draw of the whole table is not, for every width)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randn(width, generator=generator) for _ in range(rows)])  # (rows, width)


class Learned(Encoding):
    kind = Kind.ABSOLUTE
    relative_only = False

    def __init__(self, dims: Dims, init_std: float = INIT_STD) -> None:
        super().__init__(dims)
        if dims.max_positions < 1 or init_std < 0:
            raise ConfigError(
                f"learned positions need max_positions >= 1 and init_std >= 0; "
                f"got max_positions={dims.max_positions}, init_std={init_std}"
            )
        rows = table_rows(dims.max_positions, dims.d_model, dims.seed + SEED_OFFSET)
        self.weight = nn.Parameter(rows * init_std)  # (P, C)

    @property
    def num_rows(self) -> int:
        return self.weight.shape[0]

    def summary(self) -> dict[str, float]:
        """The rows allocated and the rows training reaches (positions below the training length)."""
        trained = min(self.dims.train_len, self.num_rows)
        return {"learned/rows_allocated": self.num_rows, "learned/rows_trained": trained}

    def embed(self, x: Tensor, pos: Positions) -> Tensor:
        last = pos.last  # on the host: no read of `pos.token` from its device
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
