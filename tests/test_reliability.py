"""Checkpoints, exact resume, pre-emption, NaN handling and refusing to overwrite finished runs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import ROOT, isolated_env, run_main, run_train
from posab.errors import ConfigError
from posab.io import atomic_write, publish_directory, write_json, write_text

RESUMABLE = ["train.steps=30", "train.batch_size=16", "train.checkpoint_every=5", "train.val_every=5",
             "train.log_every=1", "logger=jsonl"]  # fmt: skip


def args_for(run: Path, cache: Path, *more: str) -> list[str]:
    return ["+experiment=tiny", "encoding=multiscale", f"hydra.run.dir={run}", f"data.cache_dir={cache}",
            *RESUMABLE, *more]  # fmt: skip


def start_train(args: list[str]) -> subprocess.Popen[str]:
    env = isolated_env()
    cmd = [sys.executable, str(ROOT / "train.py"), *args]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def logged_steps(run: Path) -> list[int]:
    """The steps of the complete lines of metrics.jsonl (a line being written is left out)."""
    metrics = run / "metrics.jsonl"
    text = metrics.read_text() if metrics.is_file() else ""
    return [json.loads(line)["step"] for line in text.split("\n")[:-1] if line]


def wait_for_step(run: Path, step: int, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    """Poll metrics.jsonl (every 20 ms) until the run has logged `step`; fail if it exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if any(s >= step for s in logged_steps(run)):
            return
        time.sleep(0.02)
    raise AssertionError(f"step {step} not reached (exit code {proc.poll()})")


def curve(run: Path) -> list[tuple[int, str, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], k, v) for r in rows for k, v in r.items() if k in ("train/loss", "val/loss")]


def evaluation(run: Path) -> dict[str, object]:
    results = json.loads((run / "results.json").read_text())
    return {k: v for k, v in results["eval"].items() if not k.startswith("time/")}


def assert_same_run(a: Path, b: Path) -> None:
    state_a = torch.load(a / "checkpoint.pt", weights_only=True)["model"]
    state_b = torch.load(b / "checkpoint.pt", weights_only=True)["model"]
    assert state_a.keys() == state_b.keys()
    for name in state_a:
        assert torch.equal(state_a[name], state_b[name]), name  # bit for bit
    assert curve(a) == curve(b)
    assert evaluation(a) == evaluation(b)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("reliability")
    proc = run_train(args_for(root / "reference", root / "cache"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return root / "reference", root / "cache"


@pytest.mark.e2e
def test_resume_after_sigkill_is_exact(uninterrupted: tuple[Path, Path], tmp_path: Path) -> None:
    """Killed once the run has logged step 11 (past its checkpoint of step 10, before step 30 and the
    evaluation): the rerun resumes from the checkpoint and ends bit for bit as the uninterrupted run."""
    reference, cache = uninterrupted
    run = tmp_path / "killed"
    proc = start_train(args_for(run, cache))
    wait_for_step(run, 11, proc)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL  # the kill ended it, not the end of the run
    # the kill landed mid-run: no final results, the last step not logged, a checkpoint of step 10..25
    assert json.loads((run / "results.json").read_text())["status"] == "running"
    assert 11 <= max(logged_steps(run)) < 30
    saved_step = torch.load(run / "checkpoint.pt", weights_only=True)["step"]
    assert saved_step in (10, 15, 20, 25) and saved_step <= max(logged_steps(run))
    again = run_train(args_for(run, cache))
    assert again.returncode == 0, again.stderr[-2000:]
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "finished" and results["resumed_from_step"] == saved_step
    assert_same_run(reference, run)


@pytest.mark.e2e
def test_a_stage_resumes_after_sigkill_exactly_and_records_its_parent(
    uninterrupted: tuple[Path, Path], tmp_path: Path
) -> None:
    """A second stage (issue 59) continued from the finished reference run with its encoding changed
    (DroPE's move: the bias dropped, NoPE continues), killed past its checkpoint of step 10: the rerun
    resumes from the stage's own checkpoint, not from the parent's weights again, and ends bit for bit as
    the uninterrupted stage; both record their parent."""
    reference, cache = uninterrupted
    stage = [f"train.init_from={reference}", "train.init_encoding=changed"]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    done = run_train(stage_args(whole, cache, *stage))
    assert done.returncode == 0, done.stderr[-2000:]
    proc = start_train(stage_args(killed, cache, *stage))
    wait_for_step(killed, 11, proc)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    saved_step = torch.load(killed / "checkpoint.pt", weights_only=True)["step"]
    again = run_train(stage_args(killed, cache, *stage))
    assert again.returncode == 0, again.stderr[-2000:]
    results = json.loads((killed / "results.json").read_text())
    assert results["status"] == "finished" and results["resumed_from_step"] == saved_step >= 10
    assert results["parent"] == {"run": str(reference), "encoding": "multiscale", "steps": 30,
                                 "git_commit": results["git_commit"]}  # fmt: skip
    assert_same_run(whole, killed)


def stage_args(run: Path, cache: Path, *more: str) -> list[str]:
    """A stage's arguments: `args_for`'s with NoPE for the reference run's multi-scale bias."""
    return [arg for arg in args_for(run, cache, *more) if arg != "encoding=multiscale"] + ["encoding=nope"]


@pytest.mark.e2e
def test_sigterm_saves_a_checkpoint_and_exits_with_its_own_code(
    uninterrupted: tuple[Path, Path], tmp_path: Path
) -> None:
    reference, cache = uninterrupted
    run = tmp_path / "preempted"
    proc = start_train(args_for(run, cache))
    wait_for_step(run, 3, proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 3, proc.stderr.read() if proc.stderr else ""
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "preempted"
    saved_step = torch.load(run / "checkpoint.pt", weights_only=True)["step"]
    assert 3 <= saved_step < 30
    again = run_train(args_for(run, cache))
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads((run / "results.json").read_text())["resumed_from_step"] == saved_step
    assert_same_run(reference, run)


@pytest.mark.e2e
def test_nan_loss_stops_at_once_and_keeps_the_last_checkpoint(tmp_path: Path) -> None:
    args = args_for(tmp_path / "run", tmp_path / "cache", "train.lr=1e30", "train.warmup_steps=0",
                    "train.grad_clip=1e30", "train.checkpoint_every=1", "train.precision=fp32")  # fmt: skip
    proc = run_train(args)
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: loss is nan at step ") and "checkpoint of step" in line
    nan_step = int(line.split("at step ")[1].split(";")[0])
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["status"] == "failed" and "TrainingError" in results["error"]
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert state["step"] == nan_step - 1
    assert all(torch.isfinite(t).all() for t in state["model"].values())


@pytest.mark.e2e
def test_a_finished_run_is_not_overwritten(uninterrupted: tuple[Path, Path]) -> None:
    reference, cache = uninterrupted
    before = (reference / "results.json").read_text()
    proc = run_train(args_for(reference, cache))
    assert proc.returncode == 2
    assert "holds a finished run; pass train.overwrite=true" in proc.stderr
    assert (reference / "results.json").read_text() == before


def test_a_corrupted_checkpoint_is_named(tmp_path: Path) -> None:
    """In-process (train.py prints the ConfigError on one line, exit code 2)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError) as info:
        run_main(args_for(run, tmp_path / "cache"), run)
    assert f"checkpoint '{run / 'checkpoint.pt'}' cannot be read" in str(info.value)
    assert "\n" not in str(info.value)
    assert (run / "checkpoint.pt").read_bytes() == b"not a checkpoint"  # left as it was
    assert json.loads((run / "results.json").read_text())["status"] == "failed"


@pytest.mark.e2e
def test_an_incompatible_checkpoint_names_the_fields(
    uninterrupted: tuple[Path, Path], tmp_path: Path
) -> None:
    reference, cache = uninterrupted
    run = tmp_path / "crashed"
    run.mkdir()
    (run / "checkpoint.pt").write_bytes((reference / "checkpoint.pt").read_bytes())
    proc = run_train(args_for(run, cache, "model.d_model=64"))
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[-1]
    assert "incompatible config" in line and "model.d_model: 32 in the checkpoint, 64 now" in line


def sweep_args(sweep: Path, cache: Path) -> list[str]:
    return ["-m", "+experiment=tiny", "encoding=multiscale,alibi", f"hydra.sweep.dir={sweep}",
            f"data.cache_dir={cache}", *RESUMABLE]  # fmt: skip


@pytest.mark.e2e
def test_a_sweep_rerun_into_its_folder_keeps_its_finished_jobs(tmp_path: Path) -> None:
    sweep, cache = tmp_path / "sweep", tmp_path / "cache"
    first = run_train(sweep_args(sweep, cache))
    assert first.returncode == 0, first.stderr[-2000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    before = {job.name: (job / "results.json").read_text() for job in jobs}
    again = run_train(sweep_args(sweep, cache))
    assert again.returncode == 0, again.stderr[-2000:]
    assert {job.name: (job / "results.json").read_text() for job in jobs} == before
    assert (again.stdout + again.stderr).count("holds a finished run: kept") == 2


@pytest.mark.e2e
def test_sigterm_stops_a_sweep_and_its_rerun_resumes_it(tmp_path: Path) -> None:
    sweep, cache = tmp_path / "sweep", tmp_path / "cache"
    proc = start_train(sweep_args(sweep, cache))
    swept = sorted(o for o in RESUMABLE if not o.startswith("logger="))  # logger: not in the folder name
    first_job = sweep / f"0_encoding=multiscale,{','.join(swept)}"
    wait_for_step(first_job, 3, proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 3, proc.stderr.read() if proc.stderr else ""
    assert json.loads((first_job / "results.json").read_text())["status"] == "preempted"
    assert [p.name for p in sweep.iterdir() if p.is_dir()] == [first_job.name]  # the sweep stopped there
    again = run_train(sweep_args(sweep, cache))
    assert again.returncode == 0, again.stderr[-2000:]
    resumed = json.loads((first_job / "results.json").read_text())
    assert resumed["status"] == "finished" and resumed["resumed_from_step"] >= 3
    second_job = sweep / first_job.name.replace("0_encoding=multiscale", "1_encoding=alibi")
    assert json.loads((second_job / "results.json").read_text())["status"] == "finished"


def test_atomic_write_keeps_the_old_file_and_leaves_no_temp_file_when_writing_fails(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    write_json(path, {"status": "running"})

    def fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, fail)
    with pytest.raises(TypeError):
        write_json(path, {("a", "tuple"): "keys must be strings"})  # type: ignore[dict-item]
    assert json.loads(path.read_text()) == {"status": "running"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_atomic_writes_leave_the_permissions_a_plain_write_would(tmp_path: Path) -> None:
    """Not tempfile's owner-only ones: a new file and a published folder get the umask's mode, and a file
    written over keeps its own."""
    (tmp_path / "plain.txt").write_text("x")
    (tmp_path / "plain").mkdir()
    mode = lambda p: p.stat().st_mode & 0o7777  # noqa: E731
    assert mode(write_text(tmp_path / "new.txt", "x")) == mode(tmp_path / "plain.txt")
    published = publish_directory(tmp_path / "cache", lambda staging: (staging / "part").write_text("x"))
    assert mode(published) == mode(tmp_path / "plain")
    (tmp_path / "new.txt").chmod(0o640)
    assert mode(write_text(tmp_path / "new.txt", "y")) == 0o640
