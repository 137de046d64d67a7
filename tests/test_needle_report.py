"""needle.md over several seeds: rows as the report's, mean ± std cells, the stage's probes and curves."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_runs import finished_run

from posab.report.records import STAGE_KEY_LOSS, STAGE_LAST_START, STAGE_PROBES, RunRecord
from posab.report.runs_csv import write_csv
from posab.studies import needle as needle_report


def staged_run(encoding: str, seed: int, acc: float, probes: list[tuple[int, float]]) -> RunRecord:
    """A finished run with a passkey stage of 10 steps whose last length starts at step 6."""
    metrics = {
        "needle/acc@128": acc,
        "needle/acc@256": acc / 2,
        "needle/gain@128": 10.0 * acc,
        "needle/gain@256": 5.0,
        "needle/digit_acc@128/d0": acc,
        "needle/digit_acc@256/d0": 0.5,
        "ppl/128": 4.0 + seed,
        "ppl/256": 5.0,
        "passkey_stage/steps": 10.0,
        "passkey_stage/needle_loss": 0.1 * (seed + 1),
        "passkey_stage/time_s": 30.0,
        STAGE_LAST_START: 6.0,
        "wall_time_s": 100.0,
    }
    curves = {STAGE_KEY_LOSS: [(1, 2.0), (10, 0.1)], STAGE_PROBES: probes}
    return finished_run(f"{encoding}-{seed}", encoding, seed, "s", {"passkey.enabled": "true"}, metrics,
                        stage_curves=curves)  # fmt: skip


def table(needle_md: str) -> dict[str, dict[str, str]]:
    """needle.md's first table: {row: {column: cell}}."""
    lines = [line for line in needle_md.split("## ", 1)[0].splitlines() if line.startswith("|")]
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines]
    return {cells[0]: dict(zip(rows[0], cells, strict=True)) for cells in rows[2:]}


@pytest.fixture
def report_folder(tmp_path: Path) -> Path:
    """A report folder (runs.csv) of alibi at seeds 0, 1 and one rope run without the stage."""
    runs = [
        staged_run("alibi", 0, 0.5, [(2, 0.0), (8, 0.6), (10, 0.9)]),
        staged_run("alibi", 1, 1.0, [(4, 0.1), (7, 1.0)]),
        finished_run("rope-0", "rope", 0, "s", None, {"ppl/128": 9.0}),
    ]
    write_csv(runs, tmp_path / "runs.csv")
    return tmp_path


def test_cells_are_mean_and_std_over_seeds_from_a_report_folder(
    report_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = report_folder / "needle"
    assert needle_report.main([str(report_folder), "--out", str(out)]) == 0
    rows = table((out / "needle.md").read_text())
    assert set(rows) == {"alibi"}  # rope has no stage: left out, and named
    assert "left out 'rope'" in capsys.readouterr().err
    alibi = rows["alibi"]
    assert alibi["seeds n"] == "2"
    assert alibi["acc@128"] == "0.75 ± 0.35" and alibi["acc@256"] == "0.38 ± 0.18"
    assert alibi["stage key loss"] == "0.150 ± 0.071" and alibi["ppl@128"] == "4.50 ± 0.71"
    assert alibi["probe acc at last length"] == "0.60–1.00"  # probes after stage step 6 only, both seeds
    assert "| alibi | 0.75 | 0.50 |" in (out / "needle.md").read_text()  # key digit d0 by length, mean
    assert (out / "stage_curves.png").stat().st_size > 0 and (out / "needle_by_length.png").stat().st_size > 0


def test_no_run_with_a_stage_is_an_error(tmp_path: Path) -> None:
    plain = finished_run("rope-0", "rope", 0, "s", None, {"ppl/128": 9.0})
    write_csv([plain], tmp_path / "runs.csv")
    with pytest.raises(SystemExit, match="2"):
        needle_report.main([str(tmp_path), "--out", str(tmp_path / "needle")])
