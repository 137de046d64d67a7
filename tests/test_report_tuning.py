"""Equal tuning: each encoding's learning rate, then its encoding lr_mult, picked on the validation loss."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from report_runs import finished_run

from posab.report.records import ReportError, RunRecord
from posab.report.runs_csv import write_csv
from posab.studies.tuning import grid_lines, main, picks, points


def run(encoding: str, lr: float, val_loss: float, lr_mult: float | None = None) -> RunRecord:
    config = {"train.lr": str(lr)} | ({"encoding.lr_mult": str(lr_mult)} if lr_mult else {})
    return finished_run(f"{encoding}-{lr}-{lr_mult}", encoding, 0, "tune", config, {"val_loss": val_loss})


def sweep() -> list[RunRecord]:
    """alibi: best at 3e-3 (no parameters); multiscale: best at 6e-3 (the edge), where lr_mult 10 helps;
    t5: best at 1e-3 (the edge), where lr_mult 10 hurts."""
    return [
        run("alibi", 1e-3, 1.90),
        run("alibi", 3e-3, 1.80),
        run("alibi", 6e-3, 1.85),
        *(run("multiscale", lr, loss, 1.0) for lr, loss in ((1e-3, 1.9), (3e-3, 1.7), (6e-3, 1.65))),
        run("multiscale", 6e-3, 1.60, 10.0),
        *(run("t5", lr, loss, 1.0) for lr, loss in ((1e-3, 1.7), (3e-3, 1.75), (6e-3, 1.9))),
        run("t5", 1e-3, 1.72, 10.0),
        run("t5", 6e-3, 1.10, 10.0),  # at a rate that is not t5's pick: not considered
    ]


def test_picks_take_the_best_lr_then_the_best_lr_mult_at_it() -> None:
    chosen = {p.form: p for p in picks(points(sweep()))}
    assert (chosen["alibi"].lr, chosen["alibi"].lr_mult, chosen["alibi"].edge) == (3e-3, 1.0, False)
    assert (chosen["multiscale"].lr, chosen["multiscale"].lr_mult) == (6e-3, 10.0)
    assert chosen["multiscale"].score == 1.60 and chosen["multiscale"].edge
    assert (chosen["t5"].lr, chosen["t5"].lr_mult, chosen["t5"].edge) == (1e-3, 1.0, True)
    assert grid_lines([chosen["multiscale"]]) == [
        "- seed: 0,1,2",
        "  encoding: multiscale",
        "  train.lr: 0.006",
        "  encoding.lr_mult: 10",
    ]


def test_a_pick_from_one_rate_is_flagged_not_called_interior(tmp_path: Path) -> None:
    """A part of a tuning with one rate run so far has searched nothing: flagged, with no rate to add."""
    write_csv([*sweep(), run("rope", 1e-3, 1.5)], tmp_path / "runs.csv")
    assert main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "tuning.md").read_text()
    assert "3 of 4 picks sit at an edge" in text and "Every pick is interior" not in text
    assert "- rope: picked 0.001; one rate searched, so no grid to extend" in text


def test_tuning_script_writes_the_table_and_picks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_csv(sweep(), tmp_path / "runs.csv")
    assert main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "tuning.md").read_text()
    assert "| multiscale | 1.9 | — | 1.7 | 1.65 | 1.6 | 0.006 (edge) | 10 | 1.6 |" in text
    assert "encoding: alibi" in capsys.readouterr().out
    # the edge picks, flagged, each with the rate one step past it (the grid's ratio: sqrt(6) = 2.449)
    assert "2 of 3 picks sit at an edge of the grid searched" in text
    assert "- multiscale: picked 0.006; add 0.0147" in text and "- t5: picked 0.001; add 0.000408" in text
    assert (tmp_path / "out" / "picks.csv").read_text().count("\n") == 4  # header + 3 encodings
    assert "](tuning.png)" in text
    assert (tmp_path / "out" / "tuning.png").read_bytes().startswith(b"\x89PNG")


def test_a_form_of_an_encoding_is_tuned_apart_from_the_encoding() -> None:
    """Issue 58's variants: RoPE at rotary_dim 8 beside RoPE (rotary_dim null) is its own form, with its
    own pick and its option in its grid lines, while RoPE at its yaml's default keeps its name; an option
    every run of an encoding shares makes no form."""

    def form_run(encoding: str, lr: float, loss: float, options: dict[str, str]) -> RunRecord:
        config = {"train.lr": str(lr), **options}
        name = f"{encoding}-{lr}-{'-'.join(options.values())}"
        return finished_run(name, encoding, 0, "tune", config, {"val_loss": loss})

    quarter, full = {"encoding.rotary_dim": "8"}, {"encoding.rotary_dim": "null"}
    runs = [
        *(form_run("rope", lr, loss, full) for lr, loss in ((1e-3, 0.3), (2e-3, 0.1), (4e-3, 0.2))),
        *(form_run("rope", lr, loss, quarter) for lr, loss in ((1e-3, 0.3), (2e-3, 0.4), (4e-3, 0.2))),
        *(form_run("multiscale", lr, 1 / lr, {"encoding.clamp": "train"}) for lr in (1e-3, 2e-3)),
    ]
    chosen = {p.form: p for p in picks(points(runs))}
    assert set(chosen) == {"rope", "rope, encoding.rotary_dim=8", "multiscale"}
    variant = chosen["rope, encoding.rotary_dim=8"]
    assert (variant.encoding, variant.options, variant.lr, variant.edge) == (
        "rope",
        "encoding.rotary_dim=8",
        4e-3,
        True,
    )
    assert (chosen["rope"].lr, chosen["rope"].options, chosen["multiscale"].lr) == (2e-3, "", 2e-3)
    assert grid_lines([variant]) == [
        "- seed: 0,1,2",
        "  encoding: rope",
        "  encoding.rotary_dim: 8",
        "  train.lr: 0.004",
    ]


def test_an_encoding_without_a_run_at_lr_mult_1_is_refused() -> None:
    with pytest.raises(ReportError, match="t5: no finished run at encoding.lr_mult=1"):
        picks(points([run("t5", 1e-3, 1.7, 10.0)]))


def task_run(encoding: str, task: str, lr: float, val_loss: float) -> RunRecord:
    config = {"train.lr": str(lr), "data.task.name": task}
    return finished_run(f"{encoding}-{task}-{lr}", encoding, 0, "tasks_tune", config, {"val_loss": val_loss})


def test_a_task_suite_picks_on_the_mean_over_the_tasks_an_encoding_was_tuned_on() -> None:
    """rope: copy prefers 1e-3, addition 3e-3; the mean picks 3e-3. nope: its 6e-3 addition run is
    missing, so 6e-3 (the best copy loss) cannot be picked. hierarchical: tuned on addition alone."""
    runs = [
        *(task_run("rope", "copy", lr, loss) for lr, loss in ((1e-3, 0.10), (3e-3, 0.20), (6e-3, 0.90))),
        *(task_run("rope", "addition", lr, loss) for lr, loss in ((1e-3, 1.00), (3e-3, 0.50), (6e-3, 0.60))),
        *(task_run("nope", "copy", lr, loss) for lr, loss in ((1e-3, 0.50), (3e-3, 0.40), (6e-3, 0.01))),
        *(task_run("nope", "addition", lr, loss) for lr, loss in ((1e-3, 0.70), (3e-3, 0.80))),
        *(
            task_run("hierarchical", "addition", lr, loss)
            for lr, loss in ((1e-3, 0.3), (3e-3, 0.2), (6e-3, 0.4))
        ),
    ]
    frame = points(runs)
    chosen = {p.encoding: p for p in picks(frame)}
    assert chosen["rope"].lr == 3e-3 and chosen["rope"].score == pytest.approx(0.35)
    assert chosen["nope"].lr == 1e-3 and chosen["nope"].score == pytest.approx(0.60)
    assert chosen["hierarchical"].lr == 3e-3 and chosen["hierarchical"].score == pytest.approx(0.2)
    assert len(frame) == 9 and "task" not in frame.columns  # one line per (encoding, lr, lr_mult)


def test_a_family_is_tuned_on_its_own_tasks(tmp_path: Path) -> None:
    """`--family`: the picks of a task suite's runs on one family's tasks alone (copy: sequence; addition:
    arithmetic); a family no task has is named."""
    runs = []
    for task, best in (("copy", 3e-3), ("addition", 1e-3)):
        for lr in (1e-3, 3e-3, 6e-3):
            config = {"train.lr": str(lr), "data.task.name": task, "data.task.train_lengths": "[1, 8]"}
            loss = 1.0 + abs(lr - best) * 100
            runs.append(finished_run(f"nope-{task}-{lr}", "nope", 0, "tune", config, {"val_loss": loss}))
    write_csv(runs, tmp_path / "runs.csv")
    assert main([str(tmp_path), "--out", str(tmp_path / "seq"), "--family", "sequence"]) == 0
    assert main([str(tmp_path), "--out", str(tmp_path / "ari"), "--family", "arithmetic"]) == 0
    lrs = [float(pd.read_csv(tmp_path / f / "picks.csv")["lr"].iloc[0]) for f in ("seq", "ari")]
    assert lrs == [3e-3, 1e-3]
    assert main([str(tmp_path), "--out", str(tmp_path / "x"), "--family", "poetry"]) == 2


def preset_jobs_dicts(name: str) -> list[dict[str, str]]:
    from conftest import preset_jobs

    return [dict(o.split("=", 1) for o in job) for job in preset_jobs(name)]


def test_the_state_family_is_picked_on_its_whole_validation_curve(tmp_path: Path) -> None:
    """Flip-flop is learned at every rate, so the state family picks on the geometric mean of the logged
    validation losses, not the last one: 1e-3 ends lowest (1e-9) but learns late (curve 1, 1, 1e-9: geometric
    mean 1e-3); 2e-3 learns at once and stays learned (1e-2, 1e-4, 1e-8: 1e-4.67), so it wins; 4e-3 spikes
    (1e-4, 1, 1e-6: 1e-3.33). A logged 0 counts as 1e-12. Copy (sequence) still picks on the final loss."""
    curves = {1e-3: [1, 1, 1e-9], 2e-3: [1e-2, 1e-4, 1e-8], 4e-3: [1e-4, 1, 1e-6], 8e-3: [1, 1, 0.0]}
    runs = []
    for task in ("flipflop", "copy"):
        for lr, curve in curves.items():
            config = {"train.lr": str(lr), "data.task.name": task}
            logged = [(step, float(loss)) for step, loss in zip((250, 500, 750), curve, strict=True)]
            metrics = {"val_loss": float(curve[-1])}
            runs.append(finished_run(f"{task}-{lr}", "nope", 0, "tune", config, metrics, val_curve=logged))
    write_csv(runs, tmp_path / "runs.csv")
    for family in ("state", "sequence"):
        assert main([str(tmp_path), "--out", str(tmp_path / family), "--family", family]) == 0
    state, sequence = (pd.read_csv(tmp_path / f / "picks.csv").iloc[0] for f in ("state", "sequence"))
    assert state["lr"] == 2e-3 and state["score"] == pytest.approx(10 ** (-14 / 3)) and not state["edge"]
    assert sequence["lr"] == 8e-3 and sequence["score"] == 0.0 and sequence["criterion"] == "final"
    table = (tmp_path / "state" / "tuning.md").read_text()
    assert state["criterion"] == "curve" and "Score: the geometric mean" in table
    assert "| nope | 0.001 | 2.15e-05 | 0.000464 | 0.0001 | 0.002 |" in table  # 8e-3: (1 * 1 * 1e-12) ** 1/3


def test_a_curve_criterion_needs_the_curve() -> None:
    with pytest.raises(ReportError, match="nope-x: no validation curve"):
        points([finished_run("nope-x", "nope", 0, "tune", {"train.lr": "0.001"}, {"val_loss": 1.0})], "curve")


def test_the_family_tuning_grid_reaches_past_the_old_edge_at_each_task_s_pilot_budget() -> None:
    """Every encoding at every rate on each task it tunes, each task at its budget in the pilot's budgets.csv
    (a task whose budget is not decided, or that the pilot left out, is not tuned), one task a family."""
    from conftest import ROOT
    from posab.data.tasks import TASKS

    every = preset_jobs_dicts("tasks_tune_families")
    variants = [j for j in every if "encoding.rotary_dim" in j or "encoding.init" in j]
    jobs = [j for j in every if j not in variants]
    budgets = pd.read_csv(ROOT / "results" / "tasks" / "pilot" / "budgets.csv").set_index("task")
    assert {float(j["train.lr"]) for j in jobs} == {2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3}
    tasks = {j["task"] for j in jobs}
    suite = {j["encoding"] for j in preset_jobs_dicts("tasks")}  # the grid's 19 encodings
    for task in tasks:
        assert budgets.loc[task, "learned"] and not budgets.loc[task, "left_out"], task
        assert {int(j["train.steps"]) for j in jobs if j["task"] == task} == {
            int(budgets.loc[task, "budget"])
        }
        assert {j["encoding"] for j in jobs if j["task"] == task} == suite, task
    assert len({TASKS[t].family for t in tasks}) == len(tasks)  # one representative a family
    assert {j["seed"] for j in jobs} == {"200"} and len(jobs) == 19 * 5 * len(tasks)
    # the variants (tasks_variants.yaml) at every rate, on copy alone: the family of their tasks
    assert {(j["encoding"], j.get("encoding.rotary_dim"), j.get("encoding.init")) for j in variants} == {
        ("rope", "8", None),
        ("t5", None, "hf"),
    }
    assert len(variants) == 2 * 5 and {(j["task"], j["train.steps"]) for j in variants} == {("copy", "2000")}
