"""Claims declared once: claims files, their families tested over a study's runs (`posab claims`), the
generated readings, and the committed study held to them (one comparison, one verdict, in every folder)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from test_report_designs import base_losses, run

from posab.report.claims import claim_rows, read_claims, read_claims_dir
from posab.report.readings import BEGIN, END, claims_section, holm_floor, replace_block
from posab.report.readings import main as claims_main
from posab.report.records import ReportError, RunRecord
from posab.report.runs_csv import write_csv
from posab.report.stats import OPPOSITE, ORDERED, PAIRED_METRICS, SAME_WEIGHTS, SUGGESTIVE
from posab.report.tasks import TASK_BEGIN, TASK_END
from posab.report.verdicts import claim_verdicts, study_pool

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "results" / "study"
HEADER = "family,row,reference,metric,length,corpus,direction,status,registered,statement\n"


def claims_file(tmp_path: Path, lines: list[str], name: str = "p.csv") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + "".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def clamp_pool(shift: float = -0.05) -> list[RunRecord]:
    """Five same-weights pairs: the clamped runs read each note-form run's weights, `shift` lower in every
    window; and ALiBi, seed-matched, equal to the note-form runs."""
    same = {s: (2.0 + s, 2.5 + s) for s in range(5)}
    note = [run("multiscale", s, base_losses(s), same[s], {"encoding.clamp": "null"}) for s in range(5)]
    clamped = [
        run("multiscale", s, [v + shift for v in base_losses(s)], same[s], {"encoding.clamp": "train"})
        for s in range(5)
    ]
    for r in clamped:
        r.name += "-clamped"
    return note + clamped + [run("alibi", s, base_losses(s)) for s in range(5)]


NOTE, CLAMPED = "encoding=multiscale; encoding.clamp=null", "encoding=multiscale; encoding.clamp=train"
CLAMP = f"multiscale,{CLAMPED},{NOTE},loss,512,,less"
VS_ALIBI = f"multiscale,{NOTE},encoding=alibi,loss,512,,less"


def test_a_preregistered_claim_alone_in_its_family_is_ordered_at_one_in_thirty_two(tmp_path: Path) -> None:
    claims = read_claims(
        claims_file(tmp_path, [CLAMP + ",preregistered,abc1234,the clamp helps"]), PAIRED_METRICS
    )
    line = claim_verdicts(claims, clamp_pool()).iloc[0]
    assert (line["claim"], line["design"]) == ("multiscale.1", SAME_WEIGHTS)
    assert line["p_claim"] == pytest.approx(1 / 32) and line["p_holm"] == pytest.approx(1 / 32)
    assert line["verdict"] == ORDERED


def test_a_second_claim_in_the_family_costs_the_first_its_order(tmp_path: Path) -> None:
    lines = [CLAMP + ",preregistered,abc1234,s1", VS_ALIBI + ",preregistered,abc1234,s2"]
    frame = claim_verdicts(read_claims(claims_file(tmp_path, lines), PAIRED_METRICS), clamp_pool())
    assert frame["p_holm"].iloc[0] == pytest.approx(2 / 32)  # Holm over two: 2 x 1/32
    assert frame["verdict"].iloc[0] == SUGGESTIVE  # the interval holds, the family-wise test does not


def test_a_post_hoc_claim_is_at_most_suggestive_and_a_reversed_one_is_opposite(tmp_path: Path) -> None:
    post_hoc = read_claims(claims_file(tmp_path, [CLAMP + ",post-hoc,abc1234,s"]), PAIRED_METRICS)
    assert claim_verdicts(post_hoc, clamp_pool())["verdict"].iloc[0] == SUGGESTIVE
    registered = read_claims(claims_file(tmp_path, [CLAMP + ",preregistered,abc1234,s"]), PAIRED_METRICS)
    assert claim_verdicts(registered, clamp_pool(shift=+0.05))["verdict"].iloc[0] == OPPOSITE


def test_a_bad_claims_file_is_an_error_naming_the_line_and_the_valid_values(tmp_path: Path) -> None:
    bad = claims_file(tmp_path, [CLAMP.replace(",less", ",lower") + ",preregistered,abc,s"])
    with pytest.raises(ReportError, match=r"line 2: direction 'lower'; valid: less, greater"):
        read_claims(bad, PAIRED_METRICS)
    claims_file(tmp_path, [CLAMP + ",post-hoc,abc,s"], "a.csv")
    claims_file(tmp_path, [VS_ALIBI + ",post-hoc,abc,s"], "b.csv")
    (tmp_path / "p.csv").unlink()
    with pytest.raises(ReportError, match="family 'multiscale' is declared in"):
        read_claims_dir(tmp_path, PAIRED_METRICS)
    nothing = read_claims(
        claims_file(tmp_path, [VS_ALIBI.replace("alibi", "t5") + ",post-hoc,abc,s"]), PAIRED_METRICS
    )
    with pytest.raises(ReportError, match="`encoding=t5` matches no finished run"):
        claim_verdicts(nothing, clamp_pool())


def test_the_study_pool_takes_a_run_copied_into_two_folders_once_and_refuses_two_versions(
    tmp_path: Path,
) -> None:
    pool = clamp_pool()
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        write_csv(pool, tmp_path / folder / "runs.csv")
    assert len(study_pool(tmp_path)) == len(pool)
    changed = [r for r in pool if r.name != "alibi-0"] + [run("alibi", 0, [9.0] * 4)]
    write_csv(changed, tmp_path / "b" / "runs.csv")
    with pytest.raises(ReportError, match="run alibi-0 differs between two folders"):
        study_pool(tmp_path)


def test_a_family_header_states_the_least_holm_p_its_seeds_allow() -> None:
    def family(claims: int, pairs: int) -> pd.DataFrame:
        line = {"design": "seed-matched", "seeds_row": pairs, "seeds_reference": pairs}
        return pd.DataFrame([line] * claims)

    assert holm_floor(family(7, 5)) == (
        "The least Holm p its seeds allow: 7 × 1/32 = 0.219, at or above α = 0.05: none of its claims can "
        "be `ordered`."
    )
    assert holm_floor(family(1, 5)).endswith("1 × 1/32 = 0.031, below α = 0.05.")


def test_a_claims_block_is_replaced_between_its_markers_and_its_absence_is_an_error() -> None:
    text = f"intro\n{BEGIN}\nold\n{END}\noutro\n"
    assert replace_block(text, ["new"], "R") == f"intro\n{BEGIN}\nnew\n{END}\noutro\n"
    with pytest.raises(ReportError, match="R: no claims block"):
        replace_block("intro\n", ["new"], "R")


# The committed study, held to its claims.

VERDICTS = STUDY / "claims" / "verdicts.csv"


def committed_verdicts() -> pd.DataFrame:
    return pd.read_csv(VERDICTS, dtype={"comparison": str}, keep_default_na=False)


def block_of(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


@pytest.mark.parametrize("readme", [ROOT / "README.md", STUDY / "README.md"], ids=["README", "study README"])
def test_the_readings_claims_block_is_what_the_verdicts_give(readme: Path) -> None:
    assert block_of(readme) == "\n".join(claims_section(committed_verdicts()))


def test_every_report_of_the_study_gives_one_comparison_one_verdict() -> None:
    frames = [
        pd.read_csv(p, dtype={"comparison": str}) for p in sorted(STUDY.glob("*/paired_differences.csv"))
    ]
    lines = pd.concat(frames, ignore_index=True)
    verdicts = lines.groupby("comparison")[["verdict", "p_seeds", "family"]].nunique()
    assert (verdicts <= 1).all().all(), verdicts[(verdicts > 1).any(axis=1)]
    claimed = committed_verdicts().set_index("comparison")["verdict"]
    reported = lines[lines["comparison"].isin(claimed.index)]
    assert (reported["verdict"] == claimed[reported["comparison"]].to_numpy()).all()
    assert set(lines.loc[lines["family"] == "exploratory", "verdict"]) <= {SUGGESTIVE, "indistinguishable"}


HISTORY = "<!-- history -->"  # a paragraph that quotes an earlier reading as it was, marked as such
VERDICT_WORDS = re.compile(r"\b(ordered|tested)\b")
CLAIM_ID = re.compile(r"\b(part\w+\.\d+)\b")


@pytest.mark.parametrize("readme", [ROOT / "README.md", STUDY / "README.md"], ids=["README", "study README"])
def test_a_sentence_says_ordered_or_tested_only_beside_a_claim_whose_test_says_so(readme: Path) -> None:
    text = readme.read_text(encoding="utf-8")
    prose = text.split(BEGIN, 1)[0] + text.split(END, 1)[1]
    if TASK_BEGIN in prose:  # the task suite's generated block: its verdicts are its own tests'
        prose = prose.split(TASK_BEGIN, 1)[0] + prose.split(TASK_END, 1)[1]
    ordered = set(committed_verdicts().query("verdict == @ORDERED")["claim"])
    for paragraph in re.split(r"\n\s*\n", prose):
        words = re.sub(r"`[^`]*`", "", paragraph)  # `ordered` in backticks names the verdict, claims nothing
        if VERDICT_WORDS.search(words) and HISTORY not in paragraph:
            cited = set(CLAIM_ID.findall(paragraph))
            assert cited and cited <= ordered, f"{readme.name}: {paragraph[:300]!r}"


@pytest.fixture(scope="module")
def committed_pool() -> list[RunRecord]:
    return study_pool(STUDY)


def test_the_committed_verdicts_recompute_from_the_claims_files_and_the_runs(
    committed_pool: list[RunRecord],
) -> None:
    claims = read_claims_dir(STUDY / "claims", PAIRED_METRICS)
    recomputed = claim_verdicts(claims, committed_pool)
    committed = committed_verdicts()
    assert recomputed["claim"].tolist() == committed["claim"].tolist()
    assert recomputed["verdict"].tolist() == committed["verdict"].tolist()
    assert recomputed["comparison"].tolist() == committed["comparison"].tolist()
    assert recomputed["p_holm"].to_numpy() == pytest.approx(committed["p_holm"].to_numpy(), rel=1e-9)


def _is_ancestor(commit: str, of: str) -> bool | None:
    """Whether `commit` is `of` or an ancestor of it in this checkout; None when git cannot tell."""
    try:
        found = subprocess.run(
            ["git", "merge-base", "--is-ancestor", commit, of], cwd=ROOT, capture_output=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return {0: True, 1: False}.get(found.returncode)


def test_a_preregistered_claim_was_registered_at_or_before_the_commit_its_runs_started_from(
    committed_pool: list[RunRecord],
) -> None:
    claims = [c for c in read_claims_dir(STUDY / "claims", PAIRED_METRICS) if c.status == "preregistered"]
    checked = 0
    for claim in claims:
        registered = claim.registered.split()[0]
        for row in claim_rows(claim, committed_pool):
            for record in row.runs:
                started = record.info.get("git_commit_start") or record.info["git_commit"]
                answer = _is_ancestor(registered, started)
                if answer is None:
                    pytest.skip(f"git cannot tell whether {registered} precedes {started} in this checkout")
                assert answer, f"{claim.id}: run {record.name} started from {started}, before {registered}"
                checked += 1
    assert checked >= 2 * len(claims)


def test_posab_claims_writes_the_verdicts_the_readme_and_the_blocks_and_a_bad_file_writes_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "part").mkdir()
    write_csv(clamp_pool(), tmp_path / "part" / "runs.csv")
    (tmp_path / "claims").mkdir()
    claims_file(tmp_path / "claims", [CLAMP + ",preregistered,abc1234,the clamp helps"])
    readme = tmp_path / "README.md"
    readme.write_text(f"# Study\n{BEGIN}\nstale block\n{END}\n", encoding="utf-8")
    assert claims_main([str(tmp_path), "--write", str(readme)]) == 0
    verdicts = pd.read_csv(tmp_path / "claims" / "verdicts.csv")
    assert verdicts["verdict"].tolist() == [ORDERED]
    assert "| multiscale.1 | the clamp helps |" in readme.read_text()
    assert "stale block" not in readme.read_text()
    assert (tmp_path / "claims" / "README.md").read_text().startswith("# The study's claims, tested")
    claims_file(tmp_path / "claims", [CLAMP.replace("loss,", "ppl,") + ",preregistered,abc1234,s"], "q.csv")
    (tmp_path / "claims" / "verdicts.csv").unlink()
    assert claims_main([str(tmp_path), "--write", str(readme)]) == 2
    assert not (tmp_path / "claims" / "verdicts.csv").exists()
