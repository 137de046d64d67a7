"""The extrapolation audit beside the flat verdict: each audited run's numbers, and for a row whose runs
disagree the means of its flat and broken runs side by side."""

from __future__ import annotations

import pytest
from report_runs import finished_run

from posab.report.audit import audit_section
from posab.report.cli import selected
from posab.report.content_audit import content_audit_section
from posab.report.grouping import group_rows
from posab.report.records import ReportError

LENGTHS = (512, 1024, 4096)


def audited_run(seed: int, ppl: tuple[float, ...], jump: float, outside: float, entropy: float) -> object:
    metrics = {f"ppl/{n}": p for n, p in zip(LENGTHS, ppl, strict=True)}
    metrics |= {f"ppl_tail/{n}": 1.05 * p for n, p in zip(LENGTHS[1:], ppl[1:], strict=True)}
    metrics |= {"audit/bias_jump": jump, f"audit/novelty_outside@{LENGTHS[-1]}": outside}
    metrics |= {f"audit/entropy@{n}": entropy + i for i, n in enumerate(LENGTHS)}
    metrics |= {f"audit/distance@{n}": n / 10 for n in LENGTHS}
    metrics |= {
        f"audit/novelty_nearest@{LENGTHS[-1]}": 2 * outside,
        f"audit/bias_pull@{LENGTHS[-1]}": outside,
    }
    config = {"train.seq_len": "512"}
    return finished_run(f"multiscale-s{seed}", "multiscale", seed, "s", config, metrics)


def test_audit_section_lists_each_run_and_the_flat_and_broken_means() -> None:
    runs = [
        audited_run(0, (4.6, 4.6, 4.6), jump=0.01, outside=0.0, entropy=2.0),
        audited_run(1, (4.6, 9.5, 38.6), jump=0.90, outside=0.5, entropy=3.0),
        audited_run(2, (4.7, 4.8, 5.9), jump=0.70, outside=0.3, entropy=2.5),
    ]
    lines = audit_section("s", group_rows(runs)["s"])
    text = "\n".join(lines)
    assert "### Extrapolation audit by verdict (study s)" in text
    rows = [line for line in lines if line.startswith("| multiscale |")]
    assert len(rows) == 3 + 2  # one line per run, then the flat and the broken means
    assert rows[0].split(" | ")[1:5] == ["0", "yes", "1.050", "4.60"]  # the tail's ratio, 1.05 x 4.6 / 4.6
    assert rows[1].split(" | ")[1:7] == ["1", "no", "8.811", "4.60", "38.60", "0.9"]
    flat, broken = rows[3].split(" | "), rows[4].split(" | ")
    assert flat[1:6] == ["flat", "1", "0.01", "0.000", "0.000"]
    assert broken[1:6] == ["broken", "2", "0.8", "0.400", "0.400"]  # means of 0.9 and 0.7, of 0.5 and 0.3
    assert "entropy@512" in text and "entropy@4096" in text


def test_a_study_without_the_audit_has_no_audit_section() -> None:
    plain = finished_run(
        "alibi-s0", "alibi", 0, "s", {"train.seq_len": "512"}, {"ppl/512": 5.0, "ppl/4096": 5.1}
    )
    assert audit_section("s", group_rows([plain])["s"]) == []


def test_the_report_keeps_the_chosen_encodings_and_experiments_and_names_a_missing_one() -> None:
    runs = [audited_run(0, (4.6, 4.6, 4.6), 0.0, 0.0, 2.0)]
    runs.append(finished_run("alibi-s0", "alibi", 0, "s", {}, {}))
    runs.append(finished_run("nope-s0", "nope", 0, "s", {}, {}))
    for run, experiment in zip(runs, ("study_extrapolation", "study_main", "study_main"), strict=True):
        run.info["experiment"] = experiment
    assert [r.name for r in selected(runs, ["alibi", "multiscale"], None)] == ["multiscale-s0", "alibi-s0"]
    assert [r.name for r in selected(runs, None, ["study_main"])] == ["alibi-s0", "nope-s0"]
    assert selected(runs, None, None) == runs
    with pytest.raises(
        ReportError, match="no run of encoding.s. rope; the runs have: alibi, multiscale, nope"
    ):
        selected(runs, ["rope"], None)


def counted_run(seed: int, ppl_4096: float, past: tuple[float, float]) -> object:
    """A CoPE run whose two heads count past their largest count at 512 in the shares `past`."""
    metrics = {"ppl/512": 4.8, "ppl/4096": ppl_4096, "ppl_tail/4096": ppl_4096}
    metrics |= {"audit/cope_count_max@512": 350.0, "audit/cope_count_max@4096": 2900.0}
    metrics |= {"audit/cope_clamped@4096": 0.4, "audit/cope_past_trained@4096": sum(past) / 2}
    metrics |= {f"audit/cope_past_trained@4096/layer0/head{h}": share for h, share in enumerate(past)}
    return finished_run(f"cope-s{seed}", "cope", seed, "s", {"train.seq_len": "512"}, metrics)


def test_content_audit_section_gives_each_counting_run_its_counts_and_its_largest_head() -> None:
    runs = [counted_run(0, 16.8, (0.2, 0.6)), counted_run(1, 4.9, (0.0, 0.1))]
    lines = content_audit_section("s", group_rows(runs)["s"])
    assert lines[0] == "### Extrapolation audit: position counts (CoPE) (study s)"
    rows = [line.split(" | ") for line in lines if line.startswith("| cope |")]
    assert [r[1:4] for r in rows] == [["0", "no", "3.500"], ["1", "yes", "1.021"]]  # 16.8 / 4.8, 4.9 / 4.8
    past_mean, past_largest = rows[0][-2], rows[0][-1].rstrip(" |")
    assert (past_mean, past_largest) == ("0.400", "0.600")
    assert not any("forget gates" in line for line in lines)  # no run reports FoX's gates


def test_a_study_without_content_statistics_has_no_content_audit_section() -> None:
    runs = [audited_run(0, (4.6, 4.6, 4.6), jump=0.0, outside=0.0, entropy=2.0)]
    assert content_audit_section("s", group_rows(runs)["s"]) == []
