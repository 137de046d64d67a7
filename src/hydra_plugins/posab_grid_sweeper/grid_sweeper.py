"""`hydra/sweeper=grids`: the union of several Cartesian grids, run as one multirun.

Hydra's basic sweeper runs one product of its `params`. A study such as "every encoding x 3 seeds, plus
anchors off for two of them" is a union of products; this sweeper takes `grids`, a list of `params`
mappings, expands each one like the basic sweeper (with the command-line overrides applied to every grid),
drops jobs that an earlier grid already has, and launches the rest in order with consecutive job numbers.
"""

from dataclasses import dataclass, field
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException


@dataclass
class GridSweeperConf:
    _target_: str = "hydra_plugins.posab_grid_sweeper.grid_sweeper.GridSweeper"
    # no `from __future__ import annotations` here: Hydra loads plugin modules outside sys.modules, where
    # dataclasses cannot resolve string annotations
    max_batch_size: int | None = None
    grids: list[dict[str, Any]] = field(default_factory=list)


ConfigStore.instance().store(group="hydra/sweeper", name="grids", node=GridSweeperConf, provider="posab")


def expand_grids(
    grids: list[dict[str, Any]], arguments: list[Override], parser: OverridesParser
) -> list[list[str]]:
    """Every job of every grid in order, each a list of overrides; a job an earlier grid has is dropped."""
    jobs: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()
    for grid in grids:
        params = parser.parse_overrides([f"{key}={value}" for key, value in grid.items()])
        for job in BasicSweeper.split_arguments([*params, *arguments], None)[0]:
            identity = tuple(sorted(job))
            if identity not in seen:
                seen.add(identity)
                jobs.append(job)
    return jobs


class GridSweeper(BasicSweeper):
    """The basic sweeper, with `grids` (a list of params mappings) in place of one `params` mapping."""

    def __init__(self, max_batch_size: int | None, grids: list[dict[str, Any]]) -> None:
        super().__init__(max_batch_size=max_batch_size, params=None)
        if not grids:
            raise HydraException("hydra/sweeper=grids needs hydra.sweeper.grids: a list of params mappings")
        self.grids = [dict(grid) for grid in grids]

    def split_arguments(self, overrides: list[Override], max_batch_size: int | None) -> list[list[list[str]]]:
        """Called by BasicSweeper.sweep with the command-line overrides; returns the job batches."""
        assert self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        jobs = expand_grids(self.grids, overrides, parser)
        return list(BasicSweeper.split_overrides_to_chunks(jobs, max_batch_size))
