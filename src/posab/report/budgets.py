"""The task pilot's budgets file (`posab task-budgets`'s budgets.csv), read once for every command that
takes it: the task report (which tasks leave the aggregate, which a `mean` claim covers) and the ladder's
benchmark (which budgets are decided)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from posab.report.records import ReportError


def read_budgets(path: Path, tasks: Sequence[str] = ()) -> pd.DataFrame:
    """A budgets file, checked to list every task of `tasks`; a task it does not list, or a file it cannot
    read, is an error naming it."""
    try:
        table = pd.read_csv(path)
    except (OSError, ValueError) as err:
        raise ReportError(f"budgets file {path}: unreadable ({err}); `posab task-budgets` writes it") from err
    missing = sorted(set(tasks) - set(table["task"]))
    if missing:
        raise ReportError(f"budgets file {path}: no budget for task(s) {missing}; run the pilot on them")
    return table


def decided_budgets(budgets: pd.DataFrame) -> dict[str, int]:
    """task -> budget (steps), for the tasks whose budget is decided."""
    decided = budgets[budgets["budget"].notna()]
    return {str(task): int(steps) for task, steps in zip(decided["task"], decided["budget"], strict=True)}


def unlearned_tasks(budgets: pd.DataFrame, tasks: Sequence[str]) -> dict[str, str]:
    """The tasks of `tasks` the budgets leave out (no reference learned them within the cap), each with its
    reason."""
    return {
        line["task"]: f"learned by no reference within {int(line['cap']):,} steps (the pilot's rule)"
        for _, line in budgets.iterrows()
        if line["task"] in tasks and bool(line["left_out"])
    }


def kept_tasks(budgets: pd.DataFrame) -> list[str]:
    """The tasks the budgets keep in the suite (given a budget, not left out): a `mean` claim's tasks."""
    return sorted(budgets.loc[~budgets["left_out"].astype(bool) & budgets["budget"].notna(), "task"])
