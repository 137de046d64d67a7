"""The end-of-run table (`posab.run.summary`): the lengths and shift sizes read from the keys."""

from __future__ import annotations

from pathlib import Path

from posab.run.summary import summary_text


def test_the_summary_reads_its_lengths_and_shift_sizes_from_the_keys() -> None:
    """Plain keys on the run's split only: a scaled, a corpus and a timing key make no column or row."""
    scalars = {
        "ppl/512": 10.0, "ppl/1024": 12.5, "ppl_tail/1024": 14.0, "ppl@pi/2048": 11.0,
        "wikitext2:ppl/256": 3.0, "time/ppl@512_s": 1.0, "needle/acc@512": 0.5, "needle/acc@1024": 0.25,
        "needle/acc@1024/depth0.5": 1.0, "shift/offset64/max_abs_logit": 0.001,
        "shift/offset1/max_abs_logit": 0.0, "shift/prefix64/dloss": 0.1,
    }  # fmt: skip
    lines = summary_text({"encoding": "rope", "eval": scalars}, Path("run")).splitlines()
    assert lines[2].split() == ["length", "512", "1024"]
    assert lines[3].split() == ["ppl", "10.00", "12.50"]
    assert lines[4].split() == ["ppl", "tail", "–", "14.00"]
    assert lines[5].split() == ["needle", "acc", "0.50", "0.25"]
    assert lines[7].split() == ["offset", "max|Δlogit|", "k=1:", "0", "k=64:", "0.001"]
    assert lines[8].split() == ["prefix", "Δloss", "k=64:", "+0.100"]
    needle_only = summary_text({"eval": {"needle/acc@512": 0.5}}, Path("run")).splitlines()
    assert needle_only[2].split() == ["length", "512"]


def test_a_run_without_the_passkey_stage_shows_how_to_get_the_needle_instead_of_its_floor() -> None:
    scalars = {"ppl/512": 10.0, "ppl/1024": 12.0, "needle/acc@512": 0.0, "needle/gain@512": -0.0}
    plain = summary_text({"status": "finished", "eval": scalars}, Path("run")).splitlines()
    assert not any(line.startswith("needle acc") or line.startswith("needle gain") for line in plain)
    assert any(line.startswith("needle: no passkey stage") and "+experiment=needle" in line for line in plain)
    staged = {"status": "finished", "eval": scalars, "passkey_stage": {"steps": 30}}
    lines = summary_text(staged, Path("run")).splitlines()
    assert lines[4].split() == ["needle", "acc", "0.00", "–"] and not any(
        "no passkey stage" in x for x in lines
    )
