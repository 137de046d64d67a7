"""The task suite's budgets set by learning (`posab task-budgets`, issue 58), hand-worked, and its pilot
preset."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from report_runs import finished_run

from conftest import ROOT, preset_jobs, typed_config
from posab.data.tasks import TASKS
from posab.report.records import RunRecord
from posab.report.runs_csv import write_csv
from posab.studies.task_budgets import budgets, main, pilot_frame


def pilot_run(encoding: str, task: str, seed: int, steps: int, seen: float) -> RunRecord:
    config = {"data.task.name": task, "train.steps": str(steps)}
    metrics = {"task/exact_seen": seen, "task/exact_unseen": 0.0}
    return finished_run(f"{encoding}-{task}-{seed}-{steps}", encoding, seed, "tasks_pilot", config, metrics)


def pilot() -> list[RunRecord]:
    """copy: NoPE's seed 100 reaches 0.95 only at 2,000 steps, RoPE at 1,000; addition: NoPE never."""
    seen = {
        ("nope", "copy", 100, 1000): 0.90, ("nope", "copy", 101, 1000): 0.97,
        ("nope", "copy", 100, 2000): 0.96, ("nope", "copy", 101, 2000): 0.99,
        ("rope", "copy", 100, 1000): 0.99, ("rope", "copy", 101, 1000): 0.98,
        ("rope", "copy", 100, 2000): 0.97, ("rope", "copy", 101, 2000): 1.00,
        ("nope", "addition", 100, 1000): 0.10, ("nope", "addition", 101, 1000): 0.12,
        ("nope", "addition", 100, 2000): 0.40, ("nope", "addition", 101, 2000): 0.35,
        ("rope", "addition", 100, 1000): 0.50, ("rope", "addition", 101, 1000): 0.60,
        ("rope", "addition", 100, 2000): 0.96, ("rope", "addition", 101, 2000): 0.97,
    }  # fmt: skip
    runs = [pilot_run(e, t, s, steps, v) for (e, t, s, steps), v in seen.items()]
    return [*runs, pilot_run("alibi", "copy", 100, 1000, 0.0)]  # not a reference: not read


def test_a_budget_is_the_fewest_steps_at_which_every_reference_learns_on_every_seed() -> None:
    """copy: both references learn it, NoPE from 2,000 steps. addition: RoPE learns it at 2,000 and NoPE
    never, so its budget is the cap and it stays in the suite; with NoPE as the only reference no reference
    learns it, and it is left out."""
    table = budgets(pilot_frame(pilot(), ["nope", "rope"]), ["nope", "rope"], 0.95).set_index("task")
    assert table.loc["copy", "budget"] == 2000 and bool(table.loc["copy", "learned"])
    assert table.loc["copy", "learned_by"] == "nope rope" and not table.loc["copy", "left_out"]
    assert table.loc["copy", "nope@1000"] == 0.90  # the least over seeds
    assert table.loc["addition", "budget"] == 2000 and not table.loc["addition", "learned"]
    assert table.loc["addition", "learned_by"] == "rope" and not table.loc["addition", "left_out"]
    assert table.loc["addition", "cap"] == 2000 and "alibi@1000" not in table.columns
    nope_only = budgets(pilot_frame(pilot(), ["nope"]), ["nope"], 0.95).set_index("task")
    assert pd.isna(nope_only.loc["addition", "budget"]) and nope_only.loc["addition", "left_out"]
    assert budgets(pilot_frame(pilot(), ["rope"]), ["rope"], 0.95).set_index("task")["budget"].tolist() == [
        2000,
        1000,
    ]  # addition, copy: RoPE alone


def test_the_command_writes_the_budgets_and_names_what_is_left_out(tmp_path: Path) -> None:
    write_csv(pilot(), tmp_path / "runs.csv")
    assert main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "budgets.md").read_text()
    assert "| copy | 2,000 |" in text and "| addition | 2,000 (the cap; learned by rope only) |" in text
    assert "At the cap, learned by some references only: addition (learned by rope)." in text
    assert "Left out of the aggregate (learned by no reference within the cap): none." in text
    assert len(pd.read_csv(tmp_path / "out" / "budgets.csv")) == 2
    assert main([str(tmp_path), "--out", str(tmp_path / "nope"), "--references", "nope"]) == 0
    text = (tmp_path / "nope" / "budgets.md").read_text()
    assert "| addition | not learned within 2,000 |" in text
    assert "Left out of the aggregate (learned by no reference within the cap): addition." in text
    assert main([str(tmp_path), "--out", str(tmp_path / "out"), "--target", "1.5"]) == 2
    assert main([str(tmp_path), "--out", str(tmp_path / "o"), "--references", "fire"]) == 2


def test_a_budget_needs_every_seed_and_a_ladder_below_its_cap_is_still_running(tmp_path: Path) -> None:
    """NoPE's seed 101 missing at 2,000 steps: copy is not learned there on every seed; with the ladder's
    cap at 8,000, copy and addition (run to 2,000) are still running, not left out."""
    runs = [r for r in pilot() if r.name != "nope-copy-101-2000"]
    table = budgets(pilot_frame(runs, ["nope", "rope"]), ["nope", "rope"], 0.95, cap=8000).set_index("task")
    assert not table.loc["copy", "learned"] and not table.loc["copy", "complete"]
    assert table.loc["copy", "nope@2000"] == 0.96  # the seeds there are: shown, not counted
    assert not table.loc["addition", "complete"] and table.loc["addition", "cap"] == 8000
    write_csv(pilot(), tmp_path / "runs.csv")
    assert main([str(tmp_path), "--out", str(tmp_path / "out"), "--cap", "8000"]) == 0
    text = (tmp_path / "out" / "budgets.md").read_text()
    assert "| copy | 2,000 |" in text and "| addition | not learned yet (cap 8,000) |" in text
    assert "within the cap): none." in text and "still running (not learned yet" in text
    sort_at_4000 = pilot_run("rope", "sort", 100, 4000, 0.5)  # a third budget that only one task has
    ladders = budgets(pilot_frame([*runs, sort_at_4000], ["nope", "rope"]), ["nope", "rope"], 0.95)
    assert [c for c in ladders.columns if "@" in c] == [
        f"{e}@{s}" for e in ("nope", "rope") for s in (1000, 2000, 4000)
    ]
    assert main([str(tmp_path), "--out", str(tmp_path / "o"), "--cap", "0"]) == 2


def test_the_stopping_ladder_script_runs_the_preset_s_budgets() -> None:
    script = (Path(__file__).parents[1] / "scripts" / "pilot_ladder.sh").read_text()
    ladder = next(line for line in script.splitlines() if line.startswith("ladder=("))
    jobs = [dict(o.split("=", 1) for o in job) for job in preset_jobs("tasks_pilot", ["task=copy"])]
    budgets_run = sorted({int(j["train.steps"]) for j in jobs})
    assert ladder.split("(")[1].split(")")[0].split() == [str(b) for b in budgets_run]


@pytest.mark.parametrize("task", sorted(TASKS))
def test_the_pilot_runs_the_two_references_on_every_task_at_the_ladder_of_budgets(task: str) -> None:
    jobs = [dict(o.split("=", 1) for o in job) for job in preset_jobs("tasks_pilot", [f"task={task}"])]
    assert {(j["encoding"], j["seed"], j["train.steps"]) for j in jobs} == {
        (e, s, b) for e in ("nope", "rope") for s in ("100", "101") for b in ("1000", "2000", "4000", "8000")
    }
    cfg = typed_config(["+experiment=tasks_pilot", f"task={task}", "train.steps=8000"])
    assert (
        cfg.data.task.name == task
        and cfg.train.seq_len == TASKS[task].tokens(cfg.data.task.train_lengths[1]) - 1
    )


def test_the_ladder_runs_the_nope_study_s_five_at_three_sizes_and_the_variants_their_own_forms() -> None:
    jobs = [dict(o.split("=", 1) for o in job) for job in preset_jobs("tasks_ladder")]
    assert {(j["encoding"], j["model"], j["task"], j["seed"]) for j in jobs} == {
        (e, m, t, s)
        for e in ("nope", "t5", "alibi", "rope", "sinusoidal")
        for m in ("small", "ladder_3m", "ladder_10m")
        for t in ("copy", "mqar")
        for s in ("0", "1", "2")
    }
    sizes = [
        typed_config(["+experiment=tasks_ladder", f"model={m}"]).model for m in ("ladder_3m", "ladder_10m")
    ]
    assert [(m.d_model // m.n_heads, m.n_layers) for m in sizes] == [(32, 6), (32, 8)]
    rate = typed_config(["+experiment=tasks_ladder"]).train.lr  # the protocol's, halved at 10M by its rule
    assert {j["model"]: float(j.get("train.lr", rate)) for j in jobs} == {
        "small": rate,
        "ladder_3m": rate,
        "ladder_10m": rate / 2,
    }
    variants = [dict(o.split("=", 1) for o in job) for job in preset_jobs("tasks_variants")]
    assert {(j["encoding"], j.get("encoding.rotary_dim"), j.get("encoding.init")) for j in variants} == {
        ("rope", "8", None),
        ("t5", None, "hf"),
    }
    assert len(variants) == 12 and all(j["task"] in ("copy", "reverse") for j in variants)
    coupling = [dict(o.split("=", 1) for o in job) for job in preset_jobs("tasks_coupling")]
    rows = {(j["encoding"], j.get("data.task.positions", "sequential")) for j in coupling}
    readers = {(e, p) for e in ("sinusoidal", "learned", "rope") for p in ("sequential", "coupled")}
    assert rows == readers | {("nope", "sequential")} and len(coupling) == 21
    assert all(j["task"] == "addition_padded" for j in coupling)
    budgets = pd.read_csv(ROOT / "results" / "tasks" / "pilot" / "budgets.csv")
    padded = budgets.set_index("task").loc["addition_padded"]
    assert padded["complete"] and not padded["left_out"]
    assert {int(j["train.steps"]) for j in coupling} == {int(padded["budget"])}  # the pilot's budget
    pilot_rate = typed_config(["+experiment=tasks_pilot", "task=addition_padded"]).train.lr
    assert {float(j["train.lr"]) for j in coupling} == {pilot_rate}  # the rate the budget was set at


def test_a_task_no_reference_learned_leaves_the_suite_s_aggregate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`posab tasks --budgets`: parity, not learned in the pilot, is left out of the MRR and of the claims
    with its reason: the claim on the mean covers copy's 3 pairs (6 with parity), and a claim on parity is
    refused with the reason; a budgets file without one of the suite's tasks is an error. A claim on the
    mean waits for every task the pilot keeps: with sort kept and not yet run, it is refused."""
    from test_report_tasks import suite_on_disk

    from posab.studies.tasks import main as tasks_main

    claims = suite_on_disk(tmp_path)  # suite() as runs.csv, and nope > rope on the mean
    budgets_file = tmp_path / "budgets.csv"
    pd.DataFrame(
        [
            {"task": "copy", "budget": 1000, "learned": True, "cap": 8000, "left_out": False},
            {"task": "parity", "budget": None, "learned": False, "cap": 8000, "left_out": True},
        ]  # fmt: skip
    ).to_csv(budgets_file, index=False)
    out = tmp_path / "out"
    command = [str(tmp_path), "--out", str(out), "--budgets", str(budgets_file), "--claims", str(claims)]
    assert tasks_main(command) == 0
    text = (out / "tasks.md").read_text()
    assert "Left out of the aggregate and the claims: parity: learned by no reference within 8,000" in text
    assert "| nope | 1.000 | 0.687 |" in text  # copy alone: NoPE first at every seed
    assert "| nope > rope | mean | +0.200 | +0.100 / +0.200 / +0.300 | 3 |" in text  # copy's pairs alone
    with_sort = pd.concat([pd.read_csv(budgets_file), pd.DataFrame([{"task": "sort", "budget": 8000}])])
    with_sort.assign(left_out=with_sort["left_out"].fillna(False)).to_csv(budgets_file, index=False)
    assert tasks_main(command) == 2  # the pilot keeps sort too, and no part has run it: the mean waits
    assert (
        "covers the suite's kept tasks (copy, sort); no runs of both on sort yet" in capsys.readouterr().err
    )
    pd.DataFrame([{**pd.read_csv(claims).iloc[0].to_dict(), "task": "parity"}]).to_csv(claims, index=False)
    assert tasks_main(command) == 2
    assert "task 'parity' is left out of the suite (learned by no reference" in capsys.readouterr().err
    pd.DataFrame([{"task": "copy", "budget": 1000, "learned": True, "cap": 8000, "left_out": False}]).to_csv(
        budgets_file, index=False
    )
    assert tasks_main([str(tmp_path), "--out", str(out), "--budgets", str(budgets_file)]) == 2


NINE = {"nope", "t5", "alibi", "rope", "sinusoidal", "fire", "dape_alibi", "kerple", "randomized_sinusoidal"}


def family_picks(family: str) -> dict[str, pd.Series] | None:
    """A family's committed tuning picks (results/tasks/tuning_FAMILY/picks.csv) by form; None before it."""
    path = ROOT / "results" / "tasks" / f"tuning_{family}" / "picks.csv"
    return dict(iter(pd.read_csv(path).set_index("form").iterrows())) if path.is_file() else None


def test_the_learned_grid_runs_each_kept_task_at_its_budget_and_each_family_at_its_interior_pick() -> None:
    """Issue 58's grid (`+experiment=tasks_learned`): the nine encodings x seeds 0-2 on every task the pilot
    kept whose family's rate is decided (its tuning, results/tasks/tuning_FAMILY/picks.csv, has an interior
    pick for each of the nine), each task at its pilot budget, at that pick; arithmetic, not tuned, runs at
    the pilot's rate; randomized positions are scored at sampled positions, as they were tuned."""
    jobs = [dict(o.split("=", 1) for o in job) for job in preset_jobs("tasks_learned")]
    budgets = pd.read_csv(ROOT / "results" / "tasks" / "pilot" / "budgets.csv").set_index("task")
    kept = set(budgets.index[~budgets["left_out"] & budgets["budget"].notna()])
    pilot_rate = typed_config(["+experiment=tasks_pilot", "task=copy"]).train.lr
    tuned = {family: family_picks(family) for family in {TASKS[task].family for task in kept}}
    done = {
        f for f, picks in tuned.items() if picks and all(e in picks and not picks[e]["edge"] for e in NINE)
    }
    decided = {t for t in kept if TASKS[t].family in done | {"arithmetic"}}
    assert {(j["encoding"], j["task"], j["seed"]) for j in jobs} == {
        (e, t, str(s)) for e in NINE for t in decided for s in range(3)
    }
    assert len(jobs) == len(NINE) * len(decided) * 3 and {"copy", "parity"} <= decided
    for job in jobs:
        family = TASKS[job["task"]].family
        assert int(job["train.steps"]) == int(budgets.loc[job["task"], "budget"]), job
        if family == "arithmetic":
            assert float(job["train.lr"]) == pilot_rate, job
        else:
            pick = tuned[family][job["encoding"]]  # type: ignore[index]
            assert float(job["train.lr"]) == float(pick["lr"]) and not pick["edge"], job
        assert (job.get("encoding.eval_positions") == "sampled") == job["encoding"].startswith("randomized_")


def test_the_variants_run_at_their_own_picks_and_the_sequence_budgets() -> None:
    """tasks_variants: RoPE at rotary_dim 8 and T5's bias in its own form, each on copy and reverse at the
    pilot's budgets and at its own interior pick in results/tasks/tuning_sequence (tuned as its own form)."""
    picks = family_picks("sequence")
    assert picks is not None
    budgets = pd.read_csv(ROOT / "results" / "tasks" / "pilot" / "budgets.csv").set_index("task")["budget"]
    forms = {"rope": "rope, encoding.rotary_dim=8", "t5": "t5, encoding.init=hf, encoding.scale_logits=false"}
    variants = [dict(o.split("=", 1) for o in job) for job in preset_jobs("tasks_variants")]
    for job in variants:
        pick = picks[forms[job["encoding"]]]
        assert float(job["train.lr"]) == float(pick["lr"]) and not pick["edge"], job
        assert int(job["train.steps"]) == int(budgets[job["task"]]), job
