"""A claims family's procedure (Holm's step-down or a fixed sequence, each worked by hand) and its power
planned before its runs (`posab claims plan`, `posab.studies.power`), and `posab claims` refusing a
preregistered family that cannot reach α at the seeds it declares."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from test_claims import CLAMP, HEADER, VS_ALIBI, claims_file, clamp_pool, floor_family

from posab.cli import main as posab_main
from posab.report.records import ReportError
from posab.report.resampling import PERMUTATIONS
from posab.report.runs_csv import write_csv
from posab.report.stats import INDISTINGUISHABLE, ORDERED, PAIRED_METRICS, SUGGESTIVE
from posab.studies.claims import family_adjusted, read_claims
from posab.studies.power import FamilyPlan, seeds_needed
from posab.studies.readings import BEGIN, END, claims_section, family_floor
from posab.studies.readings import main as claims_main
from posab.studies.verdicts import claim_verdict, claim_verdicts

PLAN_HEADER = HEADER.rstrip("\n") + ",procedure,seeds\n"


def plan_file(tmp_path: Path, claims: int, procedure: str, seeds: str, family: str = "part11a") -> Path:
    """A claims file of one family: `claims` preregistered copies of CLAMP with this procedure and seeds."""
    line = CLAMP.replace("multiscale,", f"{family},", 1)
    lines = [f"{line},preregistered,abc1234,claim {i},{procedure},{seeds}" for i in range(claims)]
    return claims_file(tmp_path, lines, "plan.csv", PLAN_HEADER)


def adjusted(procedure: str, p_values: list[float]) -> list[float]:
    frame = pd.DataFrame({"family": "f", "procedure": procedure, "p_claim": p_values})
    return family_adjusted(frame).tolist()


def test_holm_by_hand() -> None:
    # sorted: 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> running max 0.03, 0.06, 0.06
    assert adjusted("holm", [0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    # 0.01 x 5, 0.01 x 4, 0.03 x 3, 0.04 x 2, 0.20 x 1 -> 0.05, 0.05, 0.09, 0.09, 0.20, back in file order
    assert adjusted("holm", [0.01, 0.04, 0.03, 0.20, 0.01]) == pytest.approx([0.05, 0.09, 0.09, 0.20, 0.05])


def test_a_fixed_sequence_by_hand_and_no_claim_after_its_first_failure_is_ordered() -> None:
    p_adjusted = adjusted("fixed-sequence", [0.01, 0.04, 0.03, 0.20, 0.01])
    assert p_adjusted == pytest.approx([0.01, 0.04, 0.04, 0.20, 0.20])  # the running maximum in file order
    lines = [
        {"low": -0.2, "high": -0.1, "direction": "less", "status": "preregistered", "p_holm": p}
        for p in p_adjusted
    ]  # every interval below 0, the claimed side
    assert [claim_verdict(line) for line in lines] == [ORDERED] * 3 + [SUGGESTIVE] * 2


def test_a_fixed_sequence_family_follows_its_file_order(tmp_path: Path) -> None:
    def verdicts(first: str, second: str) -> pd.DataFrame:
        lines = [f"{c},preregistered,abc1234,s,fixed-sequence," for c in (first, second)]
        claims = read_claims(claims_file(tmp_path, lines, header=PLAN_HEADER), PAIRED_METRICS)
        return claim_verdicts(claims, clamp_pool())

    clamp_first = verdicts(CLAMP, VS_ALIBI)  # the clamp's p is 1/32; ALiBi equals the note's form: p = 1
    assert clamp_first["p_claim"].tolist() == pytest.approx([1 / 32, 1.0])
    assert clamp_first["p_holm"].tolist() == pytest.approx([1 / 32, 1.0])  # no multiplier, unlike Holm's 2/32
    assert clamp_first["verdict"].tolist() == [ORDERED, INDISTINGUISHABLE]
    assert set(clamp_first["procedure"]) == {"fixed-sequence"}
    clamp_second = verdicts(VS_ALIBI, CLAMP)  # the first claim fails: the sequence stops there
    assert clamp_second["p_holm"].tolist() == pytest.approx([1.0, 1.0])
    assert clamp_second["verdict"].tolist() == [INDISTINGUISHABLE, SUGGESTIVE]
    section = "\n".join(claims_section(clamp_first))
    assert "A fixed sequence: its claims are tested in this order" in section
    assert "| p | fixed seq. | verdict |" in section  # the adjusted p's column, named for the procedure
    assert "- fixed sequence (a family that declares it" in section  # and the legend's item


def test_a_fixed_sequence_familys_header_states_its_first_claims_least_p() -> None:
    assert family_floor(floor_family(7, 5, "fixed-sequence")).endswith(
        "The least adjusted p its seeds allow, its first claim's least p: 1/32 = 0.031, below α = 0.05."
    )


def test_a_plan_of_seven_holm_claims_at_five_seeds_is_refused_and_names_eight(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert posab_main(["claims", "plan", str(plan_file(tmp_path, 7, "holm", "5"))]) == 2
    error = capsys.readouterr().err
    assert error == (
        "error: family part11a: 7 claims, holm, 5 seeds: least adjusted p 7/32 = 0.219 >= 0.05; needs 8 "
        "seeds under holm (7/256 = 0.027) or 5 seeds under fixed-sequence (1/32 = 0.031)\n"
    )
    assert seeds_needed(7, "holm", 0.05) == 8 and seeds_needed(7, "fixed-sequence", 0.05) == 5


def test_a_plan_passes_as_a_fixed_sequence_at_five_seeds_or_holm_at_eight(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert claims_main(["plan", str(plan_file(tmp_path, 7, "fixed-sequence", "5"))]) == 0
    out = capsys.readouterr().out
    assert "| part11a | 7 | fixed-sequence | 5 | 1/32 = 0.031 | 1/32 = 0.031 | yes |" in out
    assert claims_main(["plan", str(plan_file(tmp_path, 7, "holm", "5")), "--seeds", "8"]) == 0
    assert "| part11a | 7 | holm | 8 | 1/256 = 0.004 | 7/256 = 0.027 | yes |" in capsys.readouterr().out


def test_a_plan_needs_seeds_and_beyond_sixteen_pairs_the_least_p_is_the_sampled_tests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert claims_main(["plan", str(plan_file(tmp_path, 2, "holm", ""))]) == 2
    assert "family part11a: no seed pairs planned" in capsys.readouterr().err
    assert FamilyPlan("f", 3, "holm", 20).least_p == 1 / (1 + PERMUTATIONS)  # not 2^-20: sampled signs


def test_a_family_has_one_procedure_and_a_known_one(tmp_path: Path) -> None:
    line = CLAMP + ",preregistered,abc1234,s"
    lines = [f"{line},holm,8", f"{line},,8", f"{line},fixed-sequence,8"]  # empty is holm
    mixed = claims_file(tmp_path, lines, header=PLAN_HEADER)
    with pytest.raises(ReportError, match=r"family 'multiscale' has two values of `procedure` \(") as found:
        read_claims(mixed, PAIRED_METRICS)
    assert "'holm' on line(s) 2, 3; 'fixed-sequence' on line(s) 4" in str(found.value)
    unknown = claims_file(tmp_path, [f"{line},bonferroni,8"], header=PLAN_HEADER)
    with pytest.raises(ReportError, match="line 2: procedure 'bonferroni'; valid: holm, fixed-sequence"):
        read_claims(unknown, PAIRED_METRICS)


def test_posab_claims_refuses_an_underpowered_declared_family_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "part").mkdir()
    write_csv(clamp_pool(), tmp_path / "part" / "runs.csv")  # runs enough to test it: only its power fails
    (tmp_path / "claims").mkdir()
    plan_file(tmp_path / "claims", 7, "holm", "5")
    readme = tmp_path / "README.md"
    readme.write_text(f"{BEGIN}\nstale\n{END}\n", encoding="utf-8")
    assert claims_main([str(tmp_path), "--write", str(readme)]) == 2
    assert "family part11a: 7 claims, holm, 5 seeds" in capsys.readouterr().err
    assert not any(p.name in ("verdicts.csv", "README.md") for p in (tmp_path / "claims").iterdir())
    assert readme.read_text(encoding="utf-8") == f"{BEGIN}\nstale\n{END}\n"
    plan_file(tmp_path / "claims", 7, "fixed-sequence", "5")  # the same claims, a sequence: it can reach α
    assert claims_main([str(tmp_path), "--write", str(readme)]) == 0
    assert (tmp_path / "claims" / "verdicts.csv").exists() and "stale" not in readme.read_text()
