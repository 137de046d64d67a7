"""`posab compare-runs`: two folders of runs held to each other, number by number, timings aside."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posab.run.compare import main


def write_run(folder: Path, name: str, val_loss: float, wall: float, ppl: float) -> None:
    run = folder / name
    run.mkdir(parents=True)
    results = {
        "status": "finished",
        "val_loss": val_loss,
        "wall_time_s": wall,
        "tokens_per_s": 1000.0 / wall,
        "git_commit": f"commit-{wall}",
        "train": {"train_time_s": wall - 1.0, "val_loss": val_loss},
        "eval": {"ppl/128": ppl, "time/perplexity_s": wall / 2},
    }
    (run / "results.json").write_text(json.dumps(results))


def test_runs_that_differ_only_in_timings_are_identical(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for folder, wall in (("before", 3.0), ("after", 5.0)):
        write_run(tmp_path / folder, "0_alibi_s0", 2.5, wall, 12.25)
    assert main([str(tmp_path / "before"), str(tmp_path / "after")]) == 0
    assert "identical: 1 runs" in capsys.readouterr().out


def test_a_changed_number_and_a_missing_run_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path / "before", "0_alibi_s0", 2.5, 3.0, 12.25)
    write_run(tmp_path / "before", "1_rope_s0", 2.4, 3.0, 11.0)
    write_run(tmp_path / "after", "0_alibi_s0", 2.5, 3.0, 12.250001)
    assert main([str(tmp_path / "before"), str(tmp_path / "after")]) == 1
    out = capsys.readouterr().out
    assert "0_alibi_s0: eval/ppl/128: 12.25 -> 12.250001" in out
    assert f"only in {tmp_path / 'before'}: 1_rope_s0" in out


def test_bad_arguments_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path)]) == 2
    assert main([str(tmp_path), str(tmp_path / "missing")]) == 2
    assert "usage: posab compare-runs" in capsys.readouterr().err
