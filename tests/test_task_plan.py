"""`posab task-plan` (issue 58): a task claims family's power, planned by hand before its grid."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from posab.studies.task_plan import main, task_family_plans
from posab.studies.tasks import TaskClaim


def claim(family: str, task: str) -> TaskClaim:
    return TaskClaim(family, "nope", "rope", task, "greater", "preregistered", "abc", "a sentence", fit=0.9)


def test_a_mean_claim_covers_tasks_times_seeds_and_a_task_claim_its_seeds() -> None:
    """Seven Holm claims on the mean of 8 tasks at 3 seeds: 24 pairs, least p 1/20,001 (sampled past 16),
    least Holm p 7/20,001; they need 8 pairs (7/256 < 0.05, 7/128 is not), so 16 may be lost. A family of
    two one-task claims at 3 seeds: 3 pairs, 2/8 = 0.25, out of reach."""
    claims = [claim("mean7", "mean")] * 7 + [claim("copy2", "copy")] * 2
    mean7, copy2 = task_family_plans(claims, tasks=8, seeds=3)
    assert (mean7.claims, mean7.seeds, copy2.claims, copy2.seeds) == (7, 24, 2, 3)
    assert mean7.least_adjusted_p == pytest.approx(7 / 20_001) and mean7.reaches(0.05)
    assert copy2.least_adjusted_p == pytest.approx(2 / 8) and not copy2.reaches(0.05)


def test_the_command_prints_the_pairs_a_family_may_lose_and_refuses_one_out_of_reach(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "claims.csv"
    pd.DataFrame([vars(claim("mean7", "mean"))] * 7).to_csv(path, index=False)
    assert main([str(path), "--tasks", "8", "--seeds", "3"]) == 0
    assert "| mean7 | 7 | 24 | 1/20001 = 5e-05 | 7/20001 = 0.00035 | yes | 16 |" in capsys.readouterr().out
    assert main([str(path), "--tasks", "2", "--seeds", "3"]) == 2  # 6 pairs: 7/64 = 0.109
    err = capsys.readouterr().err
    assert "family mean7: 7 claims at 6 pairs: least Holm p 7/64 = 0.109 >= 0.05; needs 8 pairs" in err
    pd.DataFrame([vars(claim("mean7", "divide"))]).to_csv(path, index=False)
    assert main([str(path), "--tasks", "8", "--seeds", "3"]) == 2
    assert "task 'divide'; valid: addition" in capsys.readouterr().err


def test_issue_58_s_claims_are_the_nope_study_s_ranking_with_a_fit_rule_and_can_reach_alpha() -> None:
    """results/tasks/claims_learned.csv, registered before issue 58's tuning and grid: the seven orderings
    of issue 44's family on the mean, each with fit 0.9, reachable at the fewest tasks the pilot keeps so
    far (copy, reverse, sort, parity) at the grid's 3 seeds."""
    from posab.data.tasks import TASKS
    from posab.studies.tasks import read_task_claims

    root = Path(__file__).parents[1] / "results" / "tasks"
    learned = read_task_claims(root / "claims_learned.csv", sorted(TASKS))
    before = read_task_claims(root / "claims.csv", sorted(TASKS))
    assert [(c.row, c.reference, c.direction) for c in learned] == [
        (c.row, c.reference, c.direction) for c in before
    ]
    assert {(c.family, c.task, c.fit, c.status) for c in learned} == {
        ("nope_study_learned", "mean", 0.9, "preregistered")
    }
    (plan,) = task_family_plans(learned, tasks=4, seeds=3)
    assert plan.seeds == 12 and plan.reaches(0.05)
