"""The study budget: the step where the ranking by validation loss stops changing, on synthetic curves."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from report_runs import finished_run

from posab.report.grouping import group_rows
from posab.report.records import ReportError, RunRecord
from posab.report.runs_csv import write_csv
from posab.studies.budget import loss_by_step, main, rankings, settled_step

STEPS = list(range(100, 1100, 100))


def run(encoding: str, seed: int, losses: list[float]) -> RunRecord:
    """A finished run of study `s` whose validation loss at STEPS is `losses`."""
    return finished_run(
        f"{encoding}-{seed}", encoding, seed, "s", val_curve=list(zip(STEPS, losses, strict=True))
    )


def crossing_runs() -> list[RunRecord]:
    """`b` leads until step 600, `a` from step 700 on (two seeds each, the mean decides); `c` is last."""
    a = [3.0 - 0.2 * i for i in range(10)]  # 3.0 .. 1.2
    b = [2.5 - 0.1 * i for i in range(10)]  # 2.5 .. 1.6, less 0.001: 1.999 < 2.0 at 600, 1.899 > 1.8 at 700
    c = [4.0] * 10
    return [
        *(run("a", s, [x + d for x in a]) for s, d in ((0, 0.01), (1, -0.01))),
        *(run("b", s, [x + d - 0.001 for x in b]) for s, d in ((0, 0.02), (1, -0.02))),
        run("c", 0, c),
    ]


def losses_of(runs: list[RunRecord]) -> pd.DataFrame:
    (rows,) = group_rows(runs).values()
    return loss_by_step({row.label: row for row in rows})


def test_the_ranking_settles_where_the_leader_changes_for_good() -> None:
    losses = losses_of(crossing_runs())
    assert list(losses.index) == STEPS
    assert rankings(losses)[0] == ("b", "a", "c") and rankings(losses)[-1] == ("a", "b", "c")
    assert settled_step(losses, minimum=100) == 700
    assert settled_step(losses, minimum=800) == 800  # never below the minimum
    assert settled_step(losses, minimum=2000) is None  # the runs end below it


def test_a_late_swap_leaves_the_ranking_unsettled() -> None:
    runs = crossing_runs()
    late = [*runs[:-1], run("c", 0, [4.0] * 9 + [1.0])]  # c jumps to the lead at the last step
    assert settled_step(losses_of(late), minimum=100) == 1000


def test_budget_script_writes_its_files_and_refuses_one_row(tmp_path: Path) -> None:
    write_csv(crossing_runs(), tmp_path / "runs.csv")
    assert main([str(tmp_path), "--out", str(tmp_path / "out"), "--minimum", "100"]) == 0
    text = (tmp_path / "out" / "budget.md").read_text()
    assert "The ranking settles at step **700**" in text
    assert "| 600 | b 1.999 < a 2.000 < c 4.000 | no |" in text and "| 700 | a " in text
    ranking = pd.read_csv(tmp_path / "out" / "ranking.csv")
    assert list(ranking.columns) == ["step", "a", "b", "c", "study"] and len(ranking) == len(STEPS)
    with pytest.raises(ReportError, match="two rows"):
        losses_of([run("a", 0, [1.0] * 10)])
