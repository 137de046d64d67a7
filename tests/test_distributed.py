"""Where a process sits in a data-parallel job: torchrun's variables, else SLURM's."""

from __future__ import annotations

import os

import pytest

from posab.distributed import World, export_slurm_rank, world


def use_environment(monkeypatch: pytest.MonkeyPatch, **variables: str) -> dict[str, str]:
    """Replace the whole environment (restored after the test)."""
    env = dict(variables)
    monkeypatch.setattr(os, "environ", env)
    return env


def test_single_process_without_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    use_environment(monkeypatch)
    assert world() == World(0, 1, 0) and world().is_main and not world().distributed


def test_torchrun_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    use_environment(monkeypatch, RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", SLURM_NTASKS="8", SLURM_PROCID="5")
    assert world() == World(3, 4, 1) and not world().is_main


def test_slurm_tasks_become_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    env = use_environment(
        monkeypatch, SLURM_NTASKS="2", SLURM_PROCID="1", SLURM_LOCALID="1", SLURM_JOB_ID="12345"
    )
    w = world()
    assert w == World(1, 2, 1)
    export_slurm_rank(w)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("1", "2", "1")
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == str(20000 + 12345 % 20000)
