"""Where the task suite's errors are (`posab.studies.task_errors`, issue 58): the breakdown of wrong answers
and the oracle-length reading per task and encoding, hand-worked, and the heatmap."""

from __future__ import annotations

from pathlib import Path

from report_runs import finished_run

from posab.report.records import RunRecord
from posab.report.runs_csv import write_csv
from posab.studies.task_errors import error_lines, heatmap_figure
from posab.studies.tasks import write_tasks_report


def classed_run(
    encoding: str, seed: int, exact: float, early: float, long: float, task: str = "copy", high: int = 2
) -> RunRecord:
    """A run of `task` trained to n = `high` (2), scored at n = 1 .. 4: right up to it; past it `exact`,
    `early` stopped early, `long` ran long, the rest a wrong token; the oracle reading right where the
    answer only ran long (exact + long)."""
    metrics: dict[str, float] = {}
    for n in (1, 2, 3, 4):
        shares = (1.0, 0.0, 0.0) if n <= high else (exact, early, long)
        metrics |= {f"task/exact@{n}": shares[0], f"task/stopped_early@{n}": shares[1]}
        metrics |= {f"task/ran_long@{n}": shares[2], f"task/wrong_token@{n}": 1.0 - sum(shares)}
        metrics[f"task/oracle_exact@{n}"] = shares[0] + shares[2]
    metrics |= {"task/exact_seen": 1.0, "task/exact_unseen": exact}
    config = {"data.task.name": task, "data.task.train_lengths": f"[1, {high}]"}
    return finished_run(f"{encoding}-{task}-{seed}", encoding, seed, "tasks", config, metrics)


def runs() -> list[RunRecord]:
    return [
        classed_run("nope", 0, 0.5, 0.1, 0.2),
        classed_run("nope", 1, 0.3, 0.1, 0.4),
        classed_run("rope", 0, 0.0, 0.0, 1.0),  # every unseen answer right but for its end
    ]


def test_the_breakdown_is_the_mean_over_seeds_and_unseen_lengths() -> None:
    old = classed_run("alibi", 0, 0.5, 0.0, 0.0)
    old.metrics = type(old.metrics)({k: v for k, v in old.metrics.items() if "@" not in k or "exact@" in k})
    lines = error_lines([*runs(), old])
    table = lines[lines.index("### copy (trained to n = 2)") + 2 :]
    nope = next(line for line in table if line.startswith("| NoPE |"))
    rope = next(line for line in table if line.startswith("| RoPE |"))
    # exact, stopped early, ran long, wrong token, oracle; then the same at n = 3
    assert nope.split(" | ")[1:7] == ["2", "0.400", "0.100", "0.300", "0.200", "0.700"]
    assert rope.split(" | ")[1:7] == ["1", "0.000", "0.000", "1.000", "0.000", "1.000"]
    assert not any(line.startswith("| ALiBi |") for line in table)
    assert "1 runs made before errors were classed are not in these tables." in lines
    assert error_lines([old]) == []  # no classed run: no section


def test_the_heatmap_has_a_panel_per_task_and_the_report_writes_it(tmp_path: Path) -> None:
    suite = [*runs(), classed_run("nope", 0, 0.9, 0.0, 0.0, "parity", high=3)]
    figure = heatmap_figure(suite)
    assert figure is not None and len([ax for ax in figure.axes if ax.images]) == 2
    labels = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert labels == ["NoPE", "RoPE"]  # the NoPE study's five first, by unseen exact match
    write_csv(suite, tmp_path / "runs.csv")
    path = write_tasks_report([tmp_path], tmp_path / "out", None)
    text = path.read_text()
    assert "## Where the errors are" in text and (tmp_path / "out" / "tasks_heatmap.png").is_file()
