"""`posab bench ladder`: the task ladder's step times (as a run takes them) and its run-hours projection."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from conftest import preset_jobs
from posab.bench import ladder
from posab.report.budgets import decided_budgets, read_budgets


def test_the_quick_ladder_times_every_encoding_s_step_and_projects_its_hours(tmp_path: Path) -> None:
    assert ladder.main(["--quick", "--no-progress", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader((tmp_path / "ladder.csv").open()))
    assert [r["encoding"] for r in rows] == ["nope", "alibi"]
    assert all(int(r["params"]) > 0 and float(r["step_s"]) > 0 for r in rows)
    (projected,) = csv.DictReader((tmp_path / "projection.csv").open())
    assert projected["budget"] == "8000" and float(projected["eval_s"]) > 0  # tiny: no pilot, the cap
    expected = sum(3 * (float(r["step_s"]) * 8000 + float(projected["eval_s"])) for r in rows) / 3600
    assert float(projected["ladder_run_h"]) == pytest.approx(expected, rel=1e-9)
    assert "The CPUs in the second before it started" in (tmp_path / "ladder.md").read_text()
    busy = ladder.busy_share(0.2)
    assert busy is None or 0 <= busy <= 1


def test_the_projection_takes_a_piloted_budget_and_bounds_an_unpiloted_size_by_the_cap() -> None:
    """Worked by hand: steps of 0.1 s (NoPE) and 0.2 s (RoPE), an evaluation of 10 s, 3 seeds."""
    rows = [
        {"size": size, "task": "copy", "encoding": name, "step_s": step}
        for size in ("small", "ladder_3m")
        for name, step in (("nope", 0.1), ("rope", 0.2))
    ]
    evaluation = {("small", "copy"): 10.0, ("ladder_3m", "copy"): 10.0}
    small, bigger = ladder.projection(rows, evaluation, {"copy": 2000}, 8000, 3)
    assert (small["budget"], bigger["budget"]) == (2000, 8000)
    assert small["ladder_run_h"] == pytest.approx(3 * (210 + 410) / 3600)  # 0.1 x 2000 + 10, 0.2 x 2000 + 10
    assert small["pilot_run_h"] == 0  # piloted already
    assert bigger["ladder_run_h"] == pytest.approx(3 * (810 + 1610) / 3600)
    # its own pilot: 2 seeds x (NoPE, RoPE) x the whole ladder, 15,000 steps, and an evaluation per run
    assert bigger["pilot_run_h"] == pytest.approx(2 * (1510 + 3010) / 3600)


def test_budgets_are_read_where_decided(tmp_path: Path) -> None:
    path = tmp_path / "budgets.csv"
    path.write_text("task,budget,learned\ncopy,2000.0,True\nmqar,,False\n")
    assert decided_budgets(read_budgets(path)) == {"copy": 2000}


def test_a_bad_budgets_file_stops_the_benchmark_before_it_times_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere.csv"
    assert ladder.main(["--quick", "--no-progress", "--out", str(tmp_path), "--budgets", str(missing)]) == 2
    assert f"budgets file {missing}: unreadable" in capsys.readouterr().err
    assert not (tmp_path / "ladder.csv").exists()


def test_the_benchmark_sizes_the_presets_ladder_and_pilot() -> None:
    """Its sizes, tasks and encodings are the ladder preset's; its pilot ladder is the pilot preset's."""
    jobs = [dict(o.split("=", 1) for o in job) for job in preset_jobs("tasks_ladder")]
    assert set(ladder.SIZES) == {j["model"] for j in jobs} and set(ladder.TASKS) == {j["task"] for j in jobs}
    assert set(ladder.ENCODINGS) == {j["encoding"] for j in jobs}
    pilot = [dict(o.split("=", 1) for o in job) for job in preset_jobs("tasks_pilot", ["task=copy"])]
    assert ladder.PILOT_LADDER == tuple(sorted({int(j["train.steps"]) for j in pilot}))
    assert len({j["seed"] for j in pilot}) == ladder.PILOT_SEEDS
