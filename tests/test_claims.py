"""Claims declared once: claims files, their families tested over a study's runs (`posab claims`), the
generated readings, and the committed study held to them (one comparison, one verdict, in every folder)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pytest
from test_report_designs import base_losses, run

from posab.report.records import ReportError, RunRecord
from posab.report.runs_csv import write_csv
from posab.report.stats import OPPOSITE, ORDERED, PAIRED_METRICS, SAME_WEIGHTS, SUGGESTIVE
from posab.studies.claims import PREREGISTERED, claim_rows, read_claims, read_claims_dir
from posab.studies.readings import BEGIN, END, claims_section, family_floor, replace_block
from posab.studies.readings import main as claims_main
from posab.studies.tasks import TASK_BEGIN, TASK_END
from posab.studies.verdicts import claim_verdicts, study_pool

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "results" / "study"
HEADER = "family,row,reference,metric,length,corpus,direction,status,registered,statement\n"


def claims_file(tmp_path: Path, lines: list[str], name: str = "p.csv", header: str = HEADER) -> Path:
    path = tmp_path / name
    path.write_text(header + "".join(line + "\n" for line in lines), encoding="utf-8")
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


def floor_family(claims: int, pairs: int, procedure: str = "holm") -> pd.DataFrame:
    """A family's verdict lines as `family_floor` reads them: `claims` seed-matched claims, `pairs` pairs."""
    line = {"design": "seed-matched", "seeds_row": pairs, "seeds_reference": pairs, "procedure": procedure}
    return pd.DataFrame([line] * claims)


def test_a_family_header_states_the_least_holm_p_its_seeds_allow() -> None:
    assert family_floor(floor_family(7, 5)) == (
        "The least Holm p its seeds allow: 7 × 1/32 = 0.219, at or above α = 0.05: none of its claims can "
        "be `ordered`."
    )
    assert family_floor(floor_family(1, 5)).endswith("1 × 1/32 = 0.031, below α = 0.05.")


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


@pytest.mark.parametrize(
    "readme", [ROOT / "results" / "README.md", STUDY / "README.md"], ids=["results", "study"]
)
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
# Words that state an effect or a cause: a claim's words, whoever writes them.
EFFECT_WORDS = re.compile(r"\b(repairs?|repaired|fix(?:es)?|level with|because|help(?:s|ed)?)\b", re.I)
SUPPORTING = {ORDERED, SUGGESTIVE}  # a verdict on the claimed side
LIST_ITEM = re.compile(r"\n(?=[ \t]*(?:[-*+]|\d+\.)[ \t])")  # a line that opens a list item
NAMES = re.compile(r"`[^`]*`|\]\([^)]*\)|<!--.*?-->", re.S)  # code, commands, link targets, comments
QUOTED = re.compile(r"\"[^\"]*\"|“[^”]*”")  # another's words, quoted as theirs (the design note's claims)


def prose_paragraphs(readme: Path) -> list[str]:
    """The README's prose, outside the generated blocks (the study's claims block and the task suite's)
    and the paragraphs marked `<!-- history -->`, as paragraphs: the blocks between blank lines, and each
    list item of one its own paragraph (a bullet says what it says, whatever its neighbours cite)."""
    prose = readme.read_text(encoding="utf-8")
    if BEGIN in prose:  # the study's generated block: its verdicts are the claims' own tests
        prose = prose.split(BEGIN, 1)[0] + prose.split(END, 1)[1]
    if TASK_BEGIN in prose:  # the task suite's generated block: its verdicts are its own tests'
        prose = prose.split(TASK_BEGIN, 1)[0] + prose.split(TASK_END, 1)[1]
    return [
        item
        for block in re.split(r"\n\s*\n", prose)
        if HISTORY not in block
        for item in LIST_ITEM.split(block)
    ]


READINGS = [
    ROOT / "README.md",
    ROOT / "results" / "README.md",
    STUDY / "README.md",
]  # the prose a reader reads


@pytest.mark.parametrize("readme", READINGS, ids=["README", "results", "study"])
def test_a_sentence_says_ordered_or_tested_only_beside_a_claim_whose_test_says_so(readme: Path) -> None:
    ordered = set(committed_verdicts().query("verdict == @ORDERED")["claim"])
    for paragraph in prose_paragraphs(readme):
        words = NAMES.sub("", paragraph)  # `ordered` in backticks names the verdict, claims nothing
        if VERDICT_WORDS.search(words):
            cited = set(CLAIM_ID.findall(paragraph))
            assert cited and cited <= ordered, f"{readme.name}: {paragraph[:300]!r}"


@pytest.mark.parametrize("readme", READINGS, ids=["README", "results", "study"])
def test_a_sentence_says_repairs_fixes_helps_level_with_or_because_only_beside_a_claim_or_as_exploratory(
    readme: Path,
) -> None:
    """The words "repair(s)", "repaired", "fix(es)", "help(s)", "helped", "level with" and "because" state an
    effect or a cause. A paragraph (each list item is one) that uses one cites a claim whose committed
    verdict supports it, `ordered` or `suggestive` (both on the claimed side; `indistinguishable` and
    `opposite` support none; one supporting claim suffices, since most of the study's families cannot reach
    `ordered`), or it says
    "exploratory", which marks what it says as untested. A cause read from a description (an audit, with no
    intervention) is rephrased rather than marked. Words in backticks (names, flags, commands), link targets,
    comments and quotations ("…": another's claim, named) claim nothing."""
    verdicts = committed_verdicts()
    supporting = set(verdicts.loc[verdicts["verdict"].isin(SUPPORTING), "claim"])
    unsupported = []
    for paragraph in prose_paragraphs(readme):
        words = QUOTED.sub("", NAMES.sub("", paragraph))
        found = EFFECT_WORDS.search(words)
        if found and "exploratory" not in words and not set(CLAIM_ID.findall(paragraph)) & supporting:
            unsupported.append(f"{found.group(0)!r} in {paragraph[:200]!r}")
    assert not unsupported, f"{readme.name}:\n" + "\n".join(unsupported)


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


def git(*args: str) -> tuple[int, str] | None:
    """`git ARGS` in this checkout: its exit status and stripped stdout; None when git cannot run."""
    try:
        found = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return found.returncode, found.stdout.strip()


def registering_commit(path: Path) -> tuple[str, datetime]:
    """The commit that added a claims file, the oldest add (`--follow`: a file moved from claims/pending/
    keeps its history), and its committer time; skips the test when git cannot tell (no history here)."""
    relative = path.relative_to(ROOT).as_posix()
    found = git("log", "--follow", "--diff-filter=A", "--format=%H %ct", "--", relative)
    if found is None or found[0] != 0 or not found[1]:
        pytest.skip(f"git cannot tell which commit added {relative} in this checkout")
    commit, seconds = found[1].splitlines()[-1].split()
    return commit, datetime.fromtimestamp(int(seconds), tz=timezone.utc)


def is_strict_ancestor(commit: str, of: str) -> bool:
    """Whether `commit` is an ancestor of `of` and not `of` itself (short or full hashes); skips the test
    when git cannot tell (a commit missing from this checkout)."""
    full = [git("rev-parse", "--verify", "--quiet", f"{c}^{{commit}}") for c in (commit, of)]
    answer = git("merge-base", "--is-ancestor", commit, of)
    if any(f is None or f[0] != 0 for f in full) or answer is None or answer[0] not in (0, 1):
        pytest.skip(f"git cannot tell whether {commit} precedes {of} in this checkout")
    return answer[0] == 0 and full[0] != full[1]


def registration_problem(
    registered: str,
    registered_at: datetime,
    started_from: str,
    started_at: str,
    strict_ancestor: Callable[[str, str], bool],
) -> str:
    """Why a run cannot test a claim preregistered by commit `registered` (committed at `registered_at`), or
    "": its start commit `started_from` must descend from `registered` strictly (the same commit could have
    been written after the run began), and its `started_at` (ISO 8601 UTC; "" in runs older than the column:
    not checked) must not precede the commit."""
    if not strict_ancestor(registered, started_from):
        return f"started from {started_from}, of which {registered} is not a strict ancestor"
    if started_at and datetime.fromisoformat(started_at.replace("Z", "+00:00")) < registered_at:
        return f"started at {started_at}, before {registered} was committed ({registered_at.isoformat()})"
    return ""


def test_the_registration_check_fails_a_run_from_the_registering_commit_or_started_before_it() -> None:
    at = datetime(2026, 12, 4, 20, 26, 41, tzinfo=timezone.utc)

    def strict(commit: str, of: str) -> bool:  # a fake history: a, then b
        return (commit, of) == ("a", "b")

    assert registration_problem("a", at, "b", "", strict) == ""
    assert registration_problem("a", at, "b", "2026-12-04T20:30:00Z", strict) == ""
    assert "not a strict ancestor" in registration_problem("a", at, "a", "2026-12-05T00:00:00Z", strict)
    assert "before a was committed" in registration_problem("a", at, "b", "2026-12-04T20:26:40Z", strict)
    assert not is_strict_ancestor("c8f0b99", "c8f0b994fd3b50b5e6c9951aa5876e02d07590c0")  # the same commit
    assert is_strict_ancestor("c8f0b99", "a45351a") and not is_strict_ancestor("a45351a", "c8f0b99")


def test_a_preregistered_claim_was_committed_before_every_run_it_tests_started(
    committed_pool: list[RunRecord],
) -> None:
    """Each preregistered claim's file was added (git) in a strict ancestor of every run's start commit,
    and before its recorded start time where the run has one (`registration_problem`)."""
    checked = claims = 0
    for path in sorted(p for p in (STUDY / "claims").glob("*.csv") if p.name != VERDICTS.name):
        for claim in read_claims(path, PAIRED_METRICS):
            if claim.status != PREREGISTERED:
                continue
            registered, registered_at = registering_commit(path)
            claims += 1
            for record in (r for row in claim_rows(claim, committed_pool) for r in row.runs):
                started_from = record.info.get("git_commit_start") or record.info["git_commit"]
                started_at = record.info.get("started_at", "")
                problem = registration_problem(
                    registered, registered_at, started_from, started_at, is_strict_ancestor
                )
                where = f"{claim.id} ({path.name}, added at {registered[:7]})"
                assert not problem, f"{where}: {record.name} {problem}"
                checked += 1
    assert checked >= 2 * claims


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
    assert (tmp_path / "claims" / "forest_multiscale.png").read_bytes()[:4] == b"\x89PNG"  # the family's plot
    claims_file(tmp_path / "claims", [CLAMP.replace("loss,", "ppl,") + ",preregistered,abc1234,s"], "q.csv")
    (tmp_path / "claims" / "verdicts.csv").unlink()
    assert claims_main([str(tmp_path), "--write", str(readme)]) == 2
    assert not (tmp_path / "claims" / "verdicts.csv").exists()


def yarn_pool(with_yarn: bool = True) -> list[RunRecord]:
    """RoPE runs read unscaled (1 nat above ALiBi at 4,096) and, where `with_yarn`, with YaRN (0.2 above),
    and ALiBi, seed-matched."""
    pool = []
    for seed in range(5):
        rope = run("rope", seed, base_losses(seed))
        rope.windows = {"loss/4096": [v + 1.0 for v in base_losses(seed)]}
        if with_yarn:
            rope.windows["loss@yarn/4096"] = [v + 0.2 for v in base_losses(seed)]
        alibi = run("alibi", seed, base_losses(seed))
        alibi.windows = {"loss/4096": base_losses(seed)}
        pool += [rope, alibi]
    return pool


def test_a_selector_reads_rope_with_yarn_as_a_same_weights_row_of_rope(tmp_path: Path) -> None:
    lines = [
        "y,encoding=alibi,encoding=rope; scaling=yarn,loss,4096,,less,preregistered,abc1234,vs yarn",
        "y,encoding=rope; scaling=yarn,encoding=rope,loss,4096,,less,preregistered,abc1234,yarn vs rope",
    ]
    claims = read_claims(claims_file(tmp_path, lines), PAIRED_METRICS)
    vs_yarn, yarn_vs_rope = claim_verdicts(claims, yarn_pool()).to_dict("records")
    assert vs_yarn["difference"] == pytest.approx(-0.2) and vs_yarn["design"] != SAME_WEIGHTS
    assert yarn_vs_rope["difference"] == pytest.approx(-0.8) and yarn_vs_rope["design"] == SAME_WEIGHTS
    with pytest.raises(ReportError, match=r"claim y.1 .* not evaluated with scaling 'yarn'; it has none"):
        claim_verdicts(claims, yarn_pool(with_yarn=False))
