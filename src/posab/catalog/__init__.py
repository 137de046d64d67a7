"""Each evaluator's report columns, one module per evaluator (named as it is), torch-free: the report reads a
study's columns from here without importing the evaluators, which take their `order` from here.

A module holds `ORDER` (the evaluator's place among the others) and `report_columns(keys) -> [Column]`,
the columns it contributes given the scalar keys the runs of a study have. A new evaluator adds its module
here; tests/test_catalog.py fails for an evaluator without one.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Collection
from functools import cache
from types import ModuleType

from posab.outputs import Column

__all__ = ["catalog_modules", "evaluator_columns"]


@cache
def catalog_modules() -> dict[str, ModuleType]:
    """Evaluator name -> its catalog module, in the evaluators' `ORDER`."""
    found = {m.name: importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)}
    return dict(sorted(found.items(), key=lambda item: (item[1].ORDER, item[0])))


def evaluator_columns(keys: Collection[str]) -> list[Column]:
    """Every evaluator's columns for these keys, in the evaluators' order."""
    return [column for module in catalog_modules().values() for column in module.report_columns(keys)]
