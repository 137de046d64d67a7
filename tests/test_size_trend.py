"""`posab size-trend`: a claim across model sizes tested as a trend (Jonckheere-Terpstra, exact permutation
p), planned for power before the ladder runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from report_runs import finished_run

from posab.report.records import ReportError
from posab.studies import size_trend
from posab.studies.size_trend import jonckheere, least_p, may_lose, trend_p

SIZES = ("small", "ladder_3m", "ladder_10m")
HEADER = "family,row,task,sizes,direction,status,registered,statement,fit\n"


def test_the_statistic_and_its_exact_p_by_hand() -> None:
    """Two groups [0, 1] and [2]: J = 2; the three assignments give J = 2, 1, 0, so p = 1/3."""
    groups = [np.array([0.0, 1.0]), np.array([2.0])]
    assert jonckheere(groups) == 2 and trend_p(groups) == pytest.approx(1 / 3)
    assert trend_p(groups, "decreasing") == 1.0
    assert jonckheere([np.array([1.0]), np.array([1.0])]) == 0.5  # a tie counts a half
    ordered = [np.array([0.1, 0.2, 0.3]), np.array([0.4, 0.5, 0.6]), np.array([0.7, 0.8, 0.9])]
    assert jonckheere(ordered) == 27 and trend_p(ordered) == pytest.approx(1 / 1680)  # 9! / (3!)^3
    assert trend_p([np.zeros(3)] * 3) == 1.0  # every run at 0: nothing to order


def test_past_the_exact_limit_the_p_is_sampled() -> None:
    """Four sizes of five runs: 20! / (5!)^4 assignments, too many; 20,000 drawn, (k + 1) / 20,001."""
    groups = [np.arange(5) + 5.0 * i for i in range(4)]
    assert trend_p(groups) == pytest.approx(1 / 20_001)
    assert least_p([5, 5, 5, 5]) == pytest.approx(1 / 20_001)


def test_the_plan_gives_the_least_p_and_the_runs_the_fit_rule_may_drop() -> None:
    assert least_p([3, 3, 3]) == pytest.approx(1 / 1680) and least_p([3, 0, 0]) == 1.0
    # one claim: dropping 2 leaves at worst (3, 3, 1): 1/140; dropping 3 can leave (3, 3, 0): 1/20 = α
    assert may_lose(3, 3, 1, 0.05) == 2
    assert may_lose(2, 2, 1, 0.05) == 0  # 4! / (2! 2!) = 6: 1/6 already


def claims_file(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "claims.csv"
    path.write_text(HEADER + "".join(f"{line}\n" for line in lines))
    return path


LINE = "ladder,nope,copy,small ladder_3m ladder_10m,increasing,preregistered,before,NoPE rises,0.9"


def test_the_plan_refuses_a_family_that_cannot_reach_alpha(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = claims_file(tmp_path, LINE)
    assert size_trend.main(["--plan", str(path), "--seeds", "3"]) == 0
    assert "| ladder | 1 | 3 | 0.000595 | 0.000595 | yes | 2 |" in capsys.readouterr().out
    two = claims_file(tmp_path, LINE.replace("small ladder_3m ladder_10m", "small ladder_10m"))
    assert size_trend.main(["--plan", str(two), "--seeds", "2"]) == 2
    assert "family ladder: 1 claims at 2 runs per size: least Holm p 0.167 >= 0.05" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (LINE.replace("ladder_3m", "huge"), "model size 'huge' is no conf/model config; valid: .*ladder_10m"),
        (LINE.replace("increasing", "up"), "direction 'up'; valid: increasing, decreasing"),
        (LINE.replace("small ladder_3m ladder_10m", "small"), "give two or more model configs"),
    ],
)
def test_a_bad_claim_line_is_named(tmp_path: Path, line: str, message: str) -> None:
    with pytest.raises(ReportError, match=message):
        size_trend.read_size_claims(claims_file(tmp_path, line))


def ladder_run(size: str, seed: int, unseen: float, seen: float = 1.0, encoding: str = "nope"):
    shape = dict(zip(size_trend.SIZE_KEYS, size_trend.model_shape(size), strict=True))
    config = {"data.task.name": "copy", **{f"model.{k}": v for k, v in shape.items()}}
    metrics = {"task/exact_unseen": unseen, "task/exact_seen": seen}
    return finished_run(f"{encoding}-{size}-{seed}", encoding, seed, "tasks_ladder", config, metrics)


def test_the_verdicts_test_the_trend_over_every_fitting_run(tmp_path: Path) -> None:
    """NoPE rises with size on every seed; one 10M run does not fit (seen 0.5) and is dropped; ALiBi's runs
    are not read. 3, 3 and 2 runs: 8! / (3! 3! 2!) = 560 assignments, p = 1/560."""
    unseen = {"small": (0.01, 0.02, 0.03), "ladder_3m": (0.2, 0.3, 0.25), "ladder_10m": (0.6, 0.7, 0.65)}
    runs = [ladder_run(size, s, v) for size, values in unseen.items() for s, v in enumerate(values)]
    runs[-1] = ladder_run("ladder_10m", 2, 0.65, seen=0.5)
    runs.append(ladder_run("small", 0, 0.99, encoding="alibi"))
    frame = size_trend.claim_lines(runs, size_trend.read_size_claims(claims_file(tmp_path, LINE)))
    (line,) = frame.to_dict("records")
    assert (line["runs"], line["runs_lost"], line["means"]) == ("3 / 3 / 2", 1, "0.020 / 0.250 / 0.650")
    assert line["p"] == pytest.approx(1 / 560) and line["p_holm"] == line["p"]
    assert line["difference"] == pytest.approx(0.63) and line["low"] > 0 and line["verdict"] == "ordered"
    path = size_trend.write_verdicts(frame, tmp_path / "out")
    assert "| ladder | nope | copy |" in path.read_text()
    assert len(pd.read_csv(tmp_path / "out" / "size_trend_verdicts.csv")) == 1


def test_a_size_without_a_counted_run_is_named(tmp_path: Path) -> None:
    runs = [ladder_run("small", s, 0.1) for s in range(3)]
    with pytest.raises(ReportError, match="no counted run at size.*ladder_3m, ladder_10m"):
        size_trend.claim_lines(runs, size_trend.read_size_claims(claims_file(tmp_path, LINE)))


def test_the_ladder_table_and_figure_cover_every_encoding_task_and_size(tmp_path: Path) -> None:
    runs = [
        finished_run(
            f"{e}-{p}-{s}", e, s, "tasks_ladder", {"data.task.name": t},
            {"task/exact_unseen": u + s / 100, "task/exact_seen": 1.0, "params/total": float(p)},
        )
        for e in ("nope", "fox") for t in ("copy", "mqar") for p, u in ((794_112, 0.1), (2_667_264, 0.4))
        for s in range(3)
    ]  # fmt: skip
    assert size_trend.main([str(tmp_path / "none"), "--out", str(tmp_path / "out")]) == 2  # no runs there
    path = size_trend.write_ladder(runs, tmp_path / "out")
    table = pd.read_csv(tmp_path / "out" / "ladder.csv")
    assert len(table) == 8 and set(table["runs"]) == {3}
    first = table[(table["encoding"] == "nope") & (table["task"] == "copy")].iloc[0]
    assert (first["params"], first["unseen"], first["unseen_sd"]) == (
        794_112,
        pytest.approx(0.11),
        pytest.approx(0.01),
    )
    assert (tmp_path / "out" / "ladder.png").stat().st_size > 0 and "| fox | copy |" in path.read_text()
