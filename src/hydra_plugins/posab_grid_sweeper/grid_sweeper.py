"""`hydra/sweeper=grids`: the union of several Cartesian grids, run as one multirun.

Hydra's basic sweeper runs one product of its `params`. A study such as "every encoding x 3 seeds, plus
anchors off for two of them" is a union of products; this sweeper takes `grids`, a list of `params`
mappings, expands each one like the basic sweeper, drops jobs that an earlier grid already has, and
launches the rest in order with consecutive job numbers.

A command-line override of a key that a grid sets selects among that grid's values (`seed=0` keeps the
grid's seed-0 jobs; `encoding=t5,fire` keeps the grids of those encodings, each at its own other values);
a grid left with no value for the key runs nothing. A command-line override of any other key applies to
every job of the grid, as with the basic sweeper. Nothing left in any grid is an error naming the overrides.
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


def _override_value(value: Any) -> str:
    """A grid's YAML value as an override writes it: null for None (Python's `None` would be the string)."""
    return "null" if value is None else str(value)


def _values(override: Override) -> list[Any]:
    """The values an override sets: each value of a sweep, or its one value."""
    return list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]


def _value_strings(override: Override) -> list[str]:
    """The same values as written in the override (the strings Hydra puts in the job's overrides)."""
    if override.is_sweep_override():
        return list(override.sweep_string_iterator())
    return [override.get_value_element_as_str()]


def _select(
    params: list[Override], selection: list[Override], parser: OverridesParser
) -> list[Override] | None:
    """The grid's params with each key in `selection` cut down to the values the selection also has;
    None when a key has none left."""
    chosen = {override.key_or_group: _values(override) for override in selection}
    selected = []
    for param in params:
        if param.key_or_group not in chosen:
            selected.append(param)
            continue
        wanted = chosen[param.key_or_group]
        pairs = zip(_value_strings(param), _values(param), strict=True)
        kept = [text for text, value in pairs if value in wanted]
        if not kept:
            return None
        selected += parser.parse_overrides([f"{param.key_or_group}={','.join(kept)}"])
    return selected


def expand_grids(
    grids: list[dict[str, Any]], arguments: list[Override], parser: OverridesParser
) -> list[list[str]]:
    """Every job of every grid in order, each a list of overrides; a job an earlier grid has is dropped.
    `arguments` (the command line) select among a grid's values for the keys it sets, and apply to every
    job for the keys it does not."""
    jobs: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()
    for grid in grids:
        params = parser.parse_overrides([f"{key}={_override_value(value)}" for key, value in grid.items()])
        keys = {param.key_or_group for param in params}
        selected = _select(params, [a for a in arguments if a.key_or_group in keys], parser)
        if selected is None:
            continue
        rest = [a for a in arguments if a.key_or_group not in keys]
        for job in BasicSweeper.split_arguments([*selected, *rest], None)[0]:
            identity = tuple(sorted(job))
            if identity not in seen:
                seen.add(identity)
                jobs.append(job)
    if not jobs:
        given = " ".join(a.input_line or f"{a.key_or_group}=..." for a in arguments)
        raise HydraException(f"hydra.sweeper.grids: no grid has a job that matches the command line: {given}")
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
