"""W&B logging with the real library, offline; runs are read back from disk with `wandb leet inspect`."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import run_train
from posab.logging import LoggerConfig
from posab.outputs import Curves, EvalOutput, Table
from posab.plots import new_figure
from posab.wandb_logger import WandbLogger, resolve_mode

WANDB = Path(sys.executable).parent / "wandb"


def isolate(mp: pytest.MonkeyPatch, home: Path) -> None:
    """Offline whatever the developer's shell says; W&B's staging and cache files under `home`."""
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_DATA_DIR", str(home / "data"))
    mp.setenv("WANDB_CACHE_DIR", str(home / "cache"))


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate(monkeypatch, tmp_path / "wandb-home")


def offline_runs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*"))


def only_run(run_dir: Path) -> Path:
    runs = offline_runs(run_dir)
    assert len(runs) == 1, runs
    return runs[0]


def inspect(run: Path, *flags: str) -> str:
    out = subprocess.run(
        [str(WANDB), "leet", "inspect", str(run), "--json", *flags],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout


def summary(run: Path) -> dict[str, Any]:
    """State, exit code, name, tags, config and summary of an offline run."""
    return json.loads(inspect(run, "--summary"))


def records(run: Path, kind: str) -> list[dict[str, Any]]:
    """The run's records of one type (`history`, `run`, `artifact`, ...), in order."""
    lines = (json.loads(line) for line in inspect(run).splitlines() if line.strip())
    return [r[kind] for r in lines if r["type"] == kind]


def table(run: Path, entry: dict[str, Any]) -> dict[str, Any]:
    """A logged table's file ({"columns", "data"}) from its summary entry."""
    assert entry["_type"] == "table-file"
    return json.loads((run / "files" / entry["path"]).read_text())


def logger(run_dir: Path, name: str, **cfg: Any) -> WandbLogger:
    return WandbLogger(
        LoggerConfig(mode="offline", **cfg),
        run_config={"seed": 0},
        run_dir=run_dir,
        name=name,
        group="tests",
        tags=["test"],
        job_type="train",
    )


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny job trained and evaluated with logger=wandb; its offline run directory."""
    tmp = tmp_path_factory.mktemp("wandb")
    args = ["+experiment=tiny", "logger=wandb", f"hydra.run.dir={tmp}/run", f"data.cache_dir={tmp}/cache"]
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, tmp / "wandb-home")
        proc = run_train([*args, "encoding=alibi"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return only_run(tmp / "run")


@pytest.mark.e2e
def test_job_run_has_config_name_tags_and_finished_state(tiny_run: Path) -> None:
    s = summary(tiny_run)
    assert s["state"] == "finished" and s["exit_code"] == 0
    assert s["name"] == "alibi-s0" and s["project"] == "posab"
    assert {"alibi", "synthetic"} <= set(s["tags"])
    assert s["config"]["encoding"]["name"] == "alibi"
    assert s["config"]["train"]["seq_len"] == 128
    assert s["config"]["eval"]["lengths"] == [128, 256]
    (run,) = records(tiny_run, "run")
    assert run["run_group"] == "tiny" and run["job_type"] == "train"


@pytest.mark.e2e
def test_job_history_has_training_and_validation_against_the_step(tiny_run: Path) -> None:
    history = [r["item"] for r in records(tiny_run, "history")]
    train = [h for h in history if "train/loss" in h]
    val = [h for h in history if "val/loss" in h]
    assert [h["trainer/step"] for h in train] == [2, 4, 6, 8]
    assert [h["trainer/step"] for h in val] == [4, 8]
    assert {"train/lr", "train/grad_norm", "train/tokens_per_s"} <= set(train[0])
    metrics = {m.get("glob_name"): m.get("step_metric") for m in records(tiny_run, "metric")}
    assert metrics["train/*"] == metrics["val/*"] == "trainer/step"


@pytest.mark.e2e
def test_job_summary_has_evaluation_scalars_tables_and_heatmap(tiny_run: Path) -> None:
    s = summary(tiny_run)["summary"]
    scalars = ["ppl/128", "ppl/256", "loss/128", "needle/acc", "needle/acc@256/depth0.5", "shift/offset1/kl"]
    assert all(isinstance(s[key], int | float) for key in scalars), {k: s.get(k) for k in scalars}
    assert 1 < s["ppl/128"] < 1e4 and 0 <= s["needle/acc"] <= 1
    ppl = table(tiny_run, s["eval/perplexity"])
    assert ppl["columns"] == ["length", "loss", "ppl", "windows"]
    assert [row[0] for row in ppl["data"]] == [128, 256]
    assert math.isclose(ppl["data"][0][2], s["ppl/128"])
    needle = table(tiny_run, s["eval/needle"])
    assert len(needle["data"]) == 2 * 3  # lengths x depths of the tiny preset
    shift = table(tiny_run, s["eval/shift"])
    shifts = [["offset", 1], ["offset", 64], ["prefix", 16], ["prefix", 64], ["context", 16], ["context", 64]]
    assert [row[:2] for row in shift["data"]] == shifts
    positions = table(tiny_run, s["eval/position_loss_table"])
    assert {row[1] for row in positions["data"]} == {"L=128", "L=256"}
    assert s["eval/needle_heatmap"]["_type"] == "image-file"
    assert "eval/ppl_vs_length_table" in s
    assert not [a for a in records(tiny_run, "artifact") if a["type"] == "model"]  # log_checkpoint: false


@pytest.mark.e2e
def test_any_evaluation_output_is_logged_without_knowing_its_evaluator(tmp_path: Path) -> None:
    """The logger logs whatever an evaluator returns: scalars to the summary, a table, a line plot and an
    image into the history, under names it has never seen."""
    figure = new_figure(2.0, 2.0)
    figure.add_subplot().plot([0, 1], [1, 0])
    output = EvalOutput(
        scalars={"made_up/score@64": 0.25},
        data={"made_up/grid": [[1, 2]]},
        tables={"made_up_cells": Table(["a", "b"], [[1, 2.5], [3, 4.5]])},
        curves={"made_up_curve": Curves("A curve", "x", {"first": ([0.0, 1.0], [2.0, 3.0])})},
        figures={"made_up_figure": figure},
    )
    job = logger(tmp_path, "generic")
    job.log_evaluation(output, step=5)
    job.finish("finished")
    s = summary(only_run(tmp_path))["summary"]
    assert s["made_up/score@64"] == 0.25 and "made_up/grid" not in s
    assert table(only_run(tmp_path), s["eval/made_up_cells"])["data"] == [[1, 2.5], [3, 4.5]]
    curve = table(only_run(tmp_path), s["eval/made_up_curve_table"])
    assert [row[1] for row in curve["data"]] == ["first", "first"]
    assert s["eval/made_up_figure"]["_type"] == "image-file"


@pytest.mark.e2e
def test_failed_job_marks_the_run_failed_and_nan_does_not_crash(tmp_path: Path) -> None:
    job = logger(tmp_path, "failing")
    job.log({"train/loss": float("nan"), "train/lr": float("inf")}, step=1)
    job.finish("failed")
    run = only_run(tmp_path)
    s = summary(run)
    assert s["state"] == "failed" and s["exit_code"] == 1
    (item,) = [r["item"] for r in records(run, "history")]
    assert item["train/loss"] == "NaN" and item["trainer/step"] == 1


@pytest.mark.e2e
def test_two_jobs_in_one_process_are_two_runs(tmp_path: Path) -> None:
    for name in ("first", "second"):
        logger(tmp_path / name, name).finish("finished")
    runs = [only_run(tmp_path / name) for name in ("first", "second")]
    found = [summary(run) for run in runs]
    assert [s["name"] for s in found] == ["first", "second"]
    assert found[0]["run_id"] != found[1]["run_id"]
    assert all(s["state"] == "finished" for s in found)


@pytest.mark.e2e
def test_checkpoint_artifact_only_when_asked_and_finished(tmp_path: Path) -> None:
    jobs = [("logged", True, "finished"), ("off", False, "finished"), ("bad", True, "failed")]
    for name, asked, status in jobs:
        (tmp_path / name).mkdir()
        (tmp_path / name / "checkpoint.pt").write_bytes(b"weights")
        logger(tmp_path / name, name, log_checkpoint=asked).finish(status)
    models = {
        name: [a for a in records(only_run(tmp_path / name), "artifact") if a["type"] == "model"]
        for name in ("logged", "off", "bad")
    }
    (artifact,) = models["logged"]
    assert artifact["name"].startswith("model-")
    assert [c["path"] for c in artifact["manifest"]["contents"]] == ["checkpoint.pt"]
    assert models["off"] == [] and models["bad"] == []


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No WANDB_MODE, no API key, and an empty .netrc; returns the .netrc path."""
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("")
    monkeypatch.setenv("NETRC", str(netrc))
    return netrc


def test_auto_mode_is_offline_without_an_api_key(no_credentials: Path) -> None:
    assert resolve_mode("auto") == "offline"
    assert resolve_mode("online") == "online" and resolve_mode("disabled") == "disabled"


def test_auto_mode_is_online_with_an_api_key(no_credentials: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    no_credentials.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    assert resolve_mode("auto") == "online"
    no_credentials.write_text("")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert resolve_mode("auto") == "online"


def test_wandb_mode_variable_wins(no_credentials: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert resolve_mode("auto") == "offline" and resolve_mode("online") == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_mode("offline") == "disabled"


@pytest.mark.e2e
def test_a_task_run_logs_its_accuracy_table_and_figure(tmp_path: Path) -> None:
    """`data=task task=parity` with logger=wandb: exact match at every test length in the summary, the
    accuracy table and its figure as media, tagged with the task."""
    args = ["data=task", "task=parity", "model=tiny", "logger=wandb", f"hydra.run.dir={tmp_path}/run"]
    budget = [
        "train.steps=4",
        "train.batch_size=4",
        "train.val_every=2",
        "train.warmup_steps=1",
        "eval.task.examples=2",
    ]
    proc = run_train([*args, *budget, "train.progress=false", "eval.progress=false", "encoding=nope"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = only_run(tmp_path / "run")
    s = summary(run)
    assert "task-parity" in s["tags"] and s["config"]["data"]["task"]["name"] == "parity"
    values = s["summary"]
    assert {f"task/exact@{n}" for n in range(1, 17)} <= set(values) and "task/exact_unseen" in values
    assert values["eval/task_accuracy_vs_length"]["_type"] == "image-file"
    assert len(table(run, values["eval/task_accuracy"])["data"]) == 16
