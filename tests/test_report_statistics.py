"""The report's statistics against hand computations: the permutation test on the seeds, Holm, Wilson, the
hierarchical bootstrap and its Monte Carlo error, the verdicts; the flat counts; precision as part of a
run's identity; the provenance columns; the window documents added to a report folder."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from report_runs import finished_run
from test_report_paired import line, record, runs_of

from posab.data import DataConfig, SyntheticConfig, prepare_data
from posab.report.document import write_report
from posab.report.flat import (
    FLAT_RATIO,
    SENSITIVITY_RATIOS,
    TAIL,
    WHOLE,
    RunRatio,
    flat_counts,
    flat_section,
)
from posab.report.grouping import group_rows
from posab.report.records import PROVENANCE_KEYS, ReportError, RunRecord
from posab.report.resampling import (
    BATCH,
    Interval,
    bootstrap_interval,
    holm,
    percentile_mc_error,
    permutation_p,
    wilson_interval,
)
from posab.report.rundirs import load_run, read_config
from posab.report.runs_csv import load_csv, write_csv
from posab.report.stats import ORDERED, SUGGESTIVE, paired_differences, verdict
from posab.studies.window_documents import backfill


@pytest.mark.parametrize(
    ("arm", "reference", "expected"),
    [
        ([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], 2 / 20),  # 3 vs 3 fully separated: 0.1, the least there is
        ([1.0, 2.0], [4.0, 5.0, 6.0], 2 / 10),  # 2 vs 3: 0.2, though the mirror split is less extreme
        ([1.0, 2.0], [4.0, 5.0], 2 / 6),  # 2 vs 2: 1/3
        ([0.0, 1, 2, 3, 4], [5.0, 6, 7, 8, 9], 2 / 252),  # 5 vs 5
        ([1.0], [2.0], 1.0),  # one seed each: no evidence
        ([1.0, 3.0], [2.0, 4.0], 4 / 6),  # overlapping: 2 of 6 splits at most -1, doubled
    ],
)
def test_the_permutation_p_of_the_seeds_is_the_hand_count(
    arm: list[float], reference: list[float], expected: float
) -> None:
    assert permutation_p(arm, reference) == pytest.approx(expected, abs=1e-12)
    assert permutation_p(reference, arm) == pytest.approx(expected, abs=1e-12)  # two-sided


def test_beyond_sixteen_seeds_the_permutation_p_is_monte_carlo() -> None:
    """9 vs 9 fully separated: exact p = 2 / C(18, 9) ~ 4e-5; 20,000 random splits give (1 + hits) / 20,001
    doubled, hits the few draws of the observed split."""
    p = permutation_p(list(range(9)), list(range(9, 18)))
    assert 2 / 20001 <= p <= 2 * 4 / 20001


def test_holm_adjusts_a_hand_example() -> None:
    """Sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> running max 0.02, 0.03,
    0.06, 0.06, back in the given order; capped at 1."""
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]) == [1.0, 1.0]
    assert holm([0.2]) == [0.2]


def test_wilson_interval_matches_a_hand_computation() -> None:
    """k = 4, n = 9, z = 1.96: centre 5.9207 / 12.8415 = 0.46106, half-width 0.15263 x sqrt(20/9 + 0.96037)
    = 0.27229; k = 0 of 3: [0, 0.5615]."""
    low, high = wilson_interval(4, 9)
    assert (low, high) == pytest.approx((0.18878, 0.73335), abs=1e-5)
    assert wilson_interval(0, 3) == pytest.approx((0.0, 0.56149), abs=1e-5)
    assert all(math.isnan(v) for v in wilson_interval(0, 0))


def documents_study(sigma_doc: float, documents: int = 30, per_document: int = 16, seed: int = 0) -> tuple:
    """(arm, reference, documents, effects): the arm differs from the reference by an effect per document
    (sd `sigma_doc`) and by almost nothing else (window and seed noise 1e-4)."""
    rng = np.random.default_rng(seed)
    ids = np.repeat(np.arange(documents), per_document)  # (W,)
    effects = rng.normal(0.0, sigma_doc, size=documents)  # (D,)
    difficulty = rng.normal(3.0, 0.5, size=len(ids))  # (W,), shared by both rows
    reference = difficulty + rng.normal(0.0, 1e-4, size=(3, len(ids)))  # (seeds, W)
    arm = difficulty + effects[ids] + rng.normal(0.0, 1e-4, size=(3, len(ids)))  # (seeds, W)
    return arm, reference, ids, effects


def test_the_hierarchical_interval_has_the_width_of_the_between_document_variance() -> None:
    """Resampling D documents: the mean of their effects has sd std(effects) / sqrt(D), so the 95% interval
    is about 2 x 1.96 x that wide; resampling the 480 windows as if independent gives one about sqrt(16) = 4
    times narrower."""
    arm, reference, ids, effects = documents_study(0.05)
    interval = bootstrap_interval(arm, reference, ids)
    expected = 2 * 1.96 * effects.std() / math.sqrt(len(effects))
    assert interval.high - interval.low == pytest.approx(expected, rel=0.15)
    assert interval.difference == pytest.approx(effects.mean(), abs=1e-4)
    windows_only = bootstrap_interval(arm, reference)
    assert interval.high - interval.low > 3 * (windows_only.high - windows_only.low)
    assert interval == bootstrap_interval(arm, reference, ids)  # seeded: the same interval again


def test_the_monte_carlo_error_of_an_interval_end_falls_as_one_over_root_n() -> None:
    """For N(0, 1) replicates the 2.5th percentile's error is 1.96 sqrt(0.025 x 0.975 / n) / phi(1.96)
    = 5.235 / sqrt(n)."""
    rng = np.random.default_rng(0)
    errors = {n: percentile_mc_error(np.sort(rng.normal(size=n)), 2.5) for n in (4000, 64000)}
    for n, error in errors.items():
        assert error == pytest.approx(5.235 / math.sqrt(n), rel=0.25), n
    assert 2.5 < errors[4000] / errors[64000] < 6


def test_draws_are_added_until_both_ends_are_within_the_bound() -> None:
    """Interval sd ~ 0.05 / sqrt(10) = 0.016: ends' error ~ 5.2 x 0.016 / sqrt(n) < 0.001 from n ~ 7,000."""
    arm, reference, ids, _ = documents_study(0.05, documents=10, per_document=4)
    found = bootstrap_interval(arm, reference, ids, bound=0.001)
    assert found.draws % BATCH == 0 and max(found.mc_error_low, found.mc_error_high) < 0.001
    assert 2 * BATCH <= found.draws <= 8 * BATCH
    fewer = bootstrap_interval(arm, reference, ids, bound=0.001, cap=found.draws - BATCH)
    assert max(fewer.mc_error_low, fewer.mc_error_high) >= 0.001  # the same draws, one batch short
    capped = bootstrap_interval(arm, reference, ids, bound=1e-9, cap=3 * BATCH)
    assert capped.draws == 3 * BATCH


def test_an_end_within_its_monte_carlo_error_of_zero_is_unstable_and_orders_nothing() -> None:
    near = Interval(0.02, 0.0003, 0.05, 2000, 0.0005, 0.001)
    assert near.excludes_zero and near.unstable
    assert not Interval(0.02, 0.001, 0.05, 2000, 0.0005, 0.001).unstable
    assert Interval(0.0, -0.01, 0.0004, 2000, 0.0005, 0.0005).unstable  # contains 0, barely
    assert verdict(True, False, 0.01) == ORDERED
    assert verdict(True, False, 0.2) == verdict(False, False, 0.01) == SUGGESTIVE
    assert verdict(False, False, 0.2) == "indistinguishable"
    assert verdict(False, True, 0.01) == "opposite"  # the interval on the side nobody claimed


def seeds_apart(encoding: str, shift: float, seeds: int) -> list[RunRecord]:
    """`seeds` runs scoring 8 windows in 2 documents, `shift` above a common difficulty plus seed noise."""
    rng = np.random.default_rng(len(encoding))
    difficulty = np.random.default_rng(9).normal(3.0, 0.3, size=8)  # (W,), the same for every encoding
    losses = difficulty + shift + rng.normal(0.0, 0.002, size=(seeds, 8))  # (seeds, W)
    starts = [1000 * i for i in range(8)]
    return [
        record(encoding, seed, {"loss/64": row.tolist()}, starts, documents=[0] * 4 + [1] * 4)
        for seed, row in enumerate(losses)
    ]


def test_seed_matched_rows_are_compared_by_the_sign_flip_test_and_never_ordered_unclaimed() -> None:
    """5 seed-matched pairs, every difference one way: the sign-flip p is 2/32 = 0.0625 two-sided whatever
    the size of the difference; exploratory, so suggestive at most. 3 pairs: 2/8 = 0.25."""
    runs = seeds_apart("nope", 0.0, 5) + seeds_apart("rope", 0.1, 5) + seeds_apart("t5", 0.2, 5)
    frame = paired_differences(group_rows(runs), references=["nope"]).frame
    for arm in ("rope", "t5"):
        found = line(frame, arm, "nope", 64)
        assert (found["design"], found["p_seeds"]) == ("seed-matched", pytest.approx(1 / 16))
        assert pd.isna(found["p_holm"]) and found["family"] == "exploratory"
        assert found["documents"] == 2 and found["excludes_zero"] and found["verdict"] == SUGGESTIVE
    few = [r for r in runs if r.seed is not None and r.seed < 3]
    frame = paired_differences(group_rows(few), references=["nope"]).frame
    assert frame["p_seeds"].tolist() == pytest.approx([0.25, 0.25]) and set(frame["verdict"]) == {SUGGESTIVE}


def test_runs_without_window_documents_resample_windows_alone_and_the_report_says_so(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    arm, reference = rng.normal(3.0, 0.1, size=(2, 8)), rng.normal(3.0, 0.1, size=(2, 8))  # (seeds, W)
    runs = runs_of("rope", arm) + runs_of("nope", reference)
    paired = paired_differences(group_rows(runs))
    found = line(paired.frame, "rope", "nope", 512)
    assert pd.isna(found["documents"]) and paired.windows_only == {"s": ["`rope` vs `nope`"]}
    rounded = [np.array([r.windows["loss/512"] for r in runs if r.encoding == e]) for e in ("rope", "nope")]
    expected = bootstrap_interval(*rounded, paired=True)  # seeds 0 and 1 of both: seed-matched
    assert found["design"] == "seed-matched" and (found["low"], found["high"]) == (
        expected.low,
        expected.high,
    )
    report = write_report(runs, tmp_path).read_text()
    assert "No run of this study records each window's document" in report
    assert "every interval resamples the windows alone" in report


def test_runs_that_place_the_windows_in_different_documents_are_not_compared() -> None:
    runs = seeds_apart("nope", 0.0, 2) + seeds_apart("rope", 0.1, 2)
    moved = [replace(r, window_documents=[0] * 8) if r.encoding == "rope" else r for r in runs]
    paired = paired_differences(group_rows(moved))
    assert paired.frame.empty and "different documents" in paired.notes["s"][0]


def ppl_run(
    encoding: str,
    seed: int,
    ppl: dict[int, float],
    study: str = "ablation",
    tail: dict[int, float] | None = None,
) -> RunRecord:
    """A finished run trained at 512 with these perplexities by length (`ppl/L`) and tail perplexities past
    512 (`ppl_tail/L`)."""
    metrics = {f"ppl/{n}": v for n, v in ppl.items()} | {f"ppl_tail/{n}": v for n, v in (tail or {}).items()}
    return finished_run(f"{encoding}-{seed}", encoding, seed, study, {"train.seq_len": "512"}, metrics)


def test_a_run_is_flat_when_its_tail_at_every_longer_length_stays_within_the_ratio(tmp_path: Path) -> None:
    """ppl 5.0 at 512: a tail of 5.5 at 1,024 is 1.10 x (flat, the bound included); 5.51 at 2,048 is not,
    whatever the whole windows say; a run without 2,048 is not judged."""
    assert FLAT_RATIO == 1.10
    assert SENSITIVITY_RATIOS == (1.05, 1.10, 1.20)
    whole = {512: 5.0, 1024: 5.0, 2048: 5.0}
    runs = [
        ppl_run("multiscale", 0, {512: 5.0, 1024: 5.6, 2048: 5.1}, tail={1024: 5.5, 2048: 5.2}),
        ppl_run("multiscale", 1, whole, tail={1024: 5.0, 2048: 5.51}),
        ppl_run("multiscale", 2, {512: 5.0, 1024: 5.0}, tail={1024: 5.0}),
        *(ppl_run("alibi", seed, whole, tail={1024: 5.0, 2048: 5.0}) for seed in (0, 1)),
    ]
    rows = group_rows(runs)["ablation"]
    counts = {c.row.label: c for c in flat_counts(rows)}
    multiscale, alibi = counts["multiscale"], counts["alibi"]
    assert (multiscale.k, multiscale.n, multiscale.disagree) == (1, 2, True)
    assert multiscale.flat == {"multiscale-0": True, "multiscale-1": False}
    assert multiscale.ratios["multiscale-1"] == RunRatio(pytest.approx(5.51 / 5.0), TAIL)
    assert (alibi.k, alibi.n, alibi.disagree) == (2, 2, False)
    section = flat_section("ablation", rows)
    assert section[0] == "### Extrapolation: flat in k of n (study ablation)"
    header = "| encoding, swept values | lengths | basis | flat | Wilson 95% | flat at 1.05 / 1.10 / 1.20 |"
    assert section[2] == header + " per seed |"
    low, high = wilson_interval(1, 2)
    assert (
        f"| multiscale | 512 → 2048 (4×) | tail | 1 of 2 | [{low:.2f}, {high:.2f}] | 0 / 1 / 2 "
        "| 0: flat 1.100, 1: not 1.102 |"
    ) in section
    per_seed = section.index("`multiscale`: flat in 1 of 2 runs; each seed:")
    assert section[per_seed + 2 : per_seed + 7] == [
        "| seed | ppl@512 | tail@1024 | tail@2048 | flat | ratio |",
        "| --- | --- | --- | --- | --- | --- |",
        "| 0 | 5.00 | 5.50 | 5.20 | yes | 1.100 |",
        "| 1 | 5.00 | 5.00 | 5.51 | no | 1.102 |",
        "| 2 | 5.00 | 5.00 | — | — | — |",
    ]
    assert not any(text.startswith("`alibi`") for text in section)  # agreeing seeds: no per-seed table
    assert flat_section("short", group_rows([ppl_run("rope", 0, {512: 5.0}, "short")])["short"]) == []
    report = write_report(runs, tmp_path).read_text()
    assert (
        report.index("## Study `ablation`")
        < report.index("### Extrapolation: flat in k of n")
        < (report.index("## Plots"))
    )


def test_a_break_in_the_tail_is_not_diluted_by_the_whole_window() -> None:
    """ppl 4.0 at 512, 4.3 over whole windows of 4,096 (1.075 x: within the cutoff), but 4.9 on their
    positions past 512 (1.225 x): not flat."""
    runs = [ppl_run("nope", 0, {512: 4.0, 4096: 4.3}, tail={4096: 4.9})]
    rows = group_rows(runs)["ablation"]
    (count,) = flat_counts(rows)
    assert count.ratios["nope-0"] == RunRatio(pytest.approx(1.225), TAIL)
    assert (count.k, count.n, count.flat) == (0, 1, {"nope-0": False})
    assert "| nope | 512 → 4096 (8×) | tail | 0 of 1 |" in flat_section("ablation", rows)[4]
    assert flat_section("ablation", rows)[4].endswith("| 0 / 0 / 0 | 0: not 1.225 |")


def test_the_count_is_shown_at_each_sensitivity_cutoff() -> None:
    """Tail ratios 1.03, 1.08 and 1.15: flat in 1, 2 and 3 of 3 at 1.05, 1.10 and 1.20; k of n at 1.10."""
    tails = (5.15, 5.4, 5.75)  # over 5.0 at 512: 1.03, 1.08, 1.15
    runs = [ppl_run("nope", seed, {512: 5.0, 1024: 5.0}, tail={1024: t}) for seed, t in enumerate(tails)]
    rows = group_rows(runs)["ablation"]
    (count,) = flat_counts(rows)
    assert [count.k_at(cutoff) for cutoff in SENSITIVITY_RATIOS] == [1, 2, 3]
    assert (count.k, count.n) == (2, 3)
    low, high = wilson_interval(2, 3)
    assert (
        f"| nope | 512 → 1024 (2×) | tail | 2 of 3 | [{low:.2f}, {high:.2f}] | 1 / 2 / 3 "
        "| 0: flat 1.030, 1: flat 1.080, 2: not 1.150 |"
    ) in flat_section("ablation", rows)


def test_a_run_without_the_tail_is_judged_on_whole_windows_and_marked() -> None:
    """Seed 0 has its tail, seed 1 only whole windows (evaluated before the tail was measured): seed 1 is
    judged on ppl/L, and the row's basis and its per-seed table say so; a row of such runs alone is on
    whole windows."""
    runs = [
        ppl_run("alibi", 0, {512: 5.0, 1024: 5.0}, tail={1024: 5.0}),
        ppl_run("alibi", 1, {512: 5.0, 1024: 6.0}),
        ppl_run("rope", 0, {512: 5.0, 1024: 5.2}),
    ]
    rows = group_rows(runs)["ablation"]
    counts = {c.row.label: c for c in flat_counts(rows)}
    assert counts["alibi"].ratios == {"alibi-0": RunRatio(1.0, TAIL), "alibi-1": RunRatio(1.2, WHOLE)}
    assert counts["rope"].ratios == {"rope-0": RunRatio(pytest.approx(1.04), WHOLE)}
    section = flat_section("ablation", rows)
    assert "| alibi | 512 → 1024 (2×) | tail; whole windows: seed 1 | 1 of 2 |" in "\n".join(section)
    assert "| rope | 512 → 1024 (2×) | whole windows | 1 of 1 |" in "\n".join(section)
    per_seed = section.index("`alibi`: flat in 1 of 2 runs; each seed:")
    assert section[per_seed + 4 : per_seed + 6] == [
        "| 0 | 5.00 | 5.00 | yes | 1.000 |",
        "| 1 | 5.00 | 6.00 (whole) | no | 1.200 |",
    ]
    assert any("whole windows" in line and line.startswith("- basis:") for line in section)


def with_precision(run: RunRecord, precision: str, capability: str = "") -> RunRecord:
    return replace(run, info={**run.info, "precision": precision, "cpu_capability": capability})


def test_runs_of_different_precisions_never_share_a_row(tmp_path: Path) -> None:
    """alibi seed 0 in bf16 (AVX-512 bf16), seed 1 in fp32: two rows, labelled by precision, also when read
    back from runs.csv; a study of one precision keeps plain labels."""
    runs = [
        with_precision(ppl_run("alibi", 0, {512: 5.0}), "bf16", "AVX512"),
        with_precision(ppl_run("alibi", 1, {512: 5.1}), "fp32", "AVX2"),
        with_precision(ppl_run("rope", 0, {512: 4.9}), "bf16", "AVX512"),
        with_precision(ppl_run("alibi", 0, {512: 5.0}, "other"), "fp32"),
    ]
    runs[3] = replace(runs[3], name="alibi-0-other")
    table = group_rows(runs)
    expected = {"alibi, precision=bf16": ["alibi-0"], "alibi, precision=fp32": ["alibi-1"]}
    expected["rope, precision=bf16"] = ["rope-0"]
    assert {row.label: [r.name for r in row.runs] for row in table["ablation"]} == expected
    assert [row.label for row in table["other"]] == ["alibi"]
    write_csv(runs, tmp_path / "runs.csv")
    labels = pd.read_csv(tmp_path / "runs.csv", dtype=str)["label"].tolist()
    assert labels == ["alibi, precision=bf16", "alibi, precision=fp32", "rope, precision=bf16", "alibi"]
    back = group_rows(load_csv(tmp_path / "runs.csv"))
    assert {row.label: [r.name for r in row.runs] for row in back["ablation"]} == expected
    report = write_report(runs, tmp_path / "report").read_text()
    assert (
        "- CPU capability (torch's kernels): `AVX512` (2 runs); `AVX2` (1 runs); unknown (1 runs)" in report
    )


RESULTS = {
    "status": "finished",
    "encoding": "nope",
    "git_commit": "b" * 40,
    "git_dirty": False,
    "git_commit_start": "a" * 40,
    "git_dirty_start": True,
    "resumed_from_step": 400,
    "started_at": "2026-12-06T07:01:02Z",
    "claims_files_start": "results/study/claims/pending/part11.csv:0123456789ab",
    "git_untracked_start": "conf/experiment/mine.yaml",
    "precision": "bf16",
    "machine": {
        "cpu_capability": "AVX512",
        "math_isa": "ONEDNN_MAX_CPU_ISA=unset | MKL 2024.2 | oneDNN v3.12.0 | cpu: avx2",
        "versions": {"torch": "2.13.0+cpu", "numpy": "2.1.3", "wandb": ""},
    },
}


def test_the_provenance_columns_round_trip_through_runs_csv(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(json.dumps({"experiment": "s", "seed": 0, "encoding": {"name": "nope"}}))
    (run / "results.json").write_text(json.dumps(RESULTS))
    loaded = load_run(run)
    assert {k: loaded.info[k] for k in PROVENANCE_KEYS} == {
        "git_dirty": "false",
        "git_commit_start": "a" * 40,
        "git_dirty_start": "true",
        "resumed_from_step": "400",
        "cpu_capability": "AVX512",
        "math_isa": "ONEDNN_MAX_CPU_ISA=unset | MKL 2024.2 | oneDNN v3.12.0 | cpu: avx2",
        "versions": "torch=2.13.0+cpu numpy=2.1.3",  # an uninstalled package is left out
        "started_at": "2026-12-06T07:01:02Z",
        "claims_files_start": "results/study/claims/pending/part11.csv:0123456789ab",
        "git_untracked_start": "conf/experiment/mine.yaml",
    }
    write_csv([loaded], tmp_path / "runs.csv")
    (back,) = load_csv(tmp_path / "runs.csv")
    assert back.info == loaded.info
    older = pd.read_csv(tmp_path / "runs.csv", dtype=str, keep_default_na=False).drop(
        columns=list(PROVENANCE_KEYS)
    )
    older.to_csv(tmp_path / "older.csv", index=False)
    (old,) = load_csv(tmp_path / "older.csv")
    assert {k: old.info[k] for k in PROVENANCE_KEYS} == dict.fromkeys(PROVENANCE_KEYS, "")
    assert old.info["precision"] == "bf16"
    report = write_report([loaded, replace(old, name="old")], tmp_path / "report").read_text()
    assert "- Uncommitted changes: `no` (1 runs); unknown (1 runs)" in report
    assert "- Uncommitted changes at the start: `yes` (1 runs); unknown (1 runs)" in report
    assert f"- Git commit(s) at the start: `{'a' * 40}` (1 runs); unknown (1 runs)" in report
    assert "- Resumed from step: `400` (1 runs); unknown (1 runs)" in report
    assert "- Package versions: `torch=2.13.0+cpu numpy=2.1.3` (1 runs); unknown (1 runs)" in report


SYNTHETIC = {"vocab_size": 300, "train_docs": 3, "valid_docs": 3, "test_docs": 1}


def window_run(name: str, anchors: bool, folder: Path, starts: list[int], seed: int = 0) -> RunRecord:
    """A run of the tiny synthetic corpus with this anchors setting whose config is in `folder`/configs."""
    config = {
        "experiment": "s",
        "seed": seed,
        "encoding": {"name": "nope"},
        "train": {"seq_len": 64},
        "data": {"source": "synthetic", "anchors": anchors, "cache_dir": "cache", "synthetic": SYNTHETIC},
        "eval": {"split": "valid", "lengths": [64, 128]},
    }
    path = folder / "configs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(OmegaConf.to_yaml(config))
    losses = {"loss/64": [3.0] * len(starts)} if starts else {}
    run = finished_run(name, "nope", seed, "s", None, {"ppl/64": 20.0}, windows=losses, window_starts=starts)
    return replace(run, config=read_config(path), config_path=path)  # as a report folder holds it


def test_window_documents_are_added_to_a_report_folder_from_each_runs_own_stream(tmp_path: Path) -> None:
    """Anchors on and off give two token streams with different windows; each run gets the documents of its
    own, by the majority of each window's targets; every other cell of runs.csv stays as it was."""
    folder = tmp_path / "report"
    streams = {}
    for anchors in (True, False):
        data = DataConfig(
            anchors=anchors, cache_dir=str(tmp_path / "cache"), synthetic=SyntheticConfig(**SYNTHETIC)
        )
        streams[anchors] = prepare_data(data).streams["valid"]
    starts = {anchors: stream.fixed_windows(128, 6).tolist() for anchors, stream in streams.items()}
    assert starts[True] != starts[False]
    runs = [
        window_run("on-0", True, folder, starts[True]),
        window_run("off-0", False, folder, starts[False]),
        window_run("none", True, folder, [], seed=1),
    ]
    write_csv(runs, folder / "runs.csv")
    before = pd.read_csv(folder / "runs.csv", dtype=str, keep_default_na=False)
    assert backfill(folder, tmp_path) == (2, 2)
    after = pd.read_csv(folder / "runs.csv", dtype=str, keep_default_na=False)
    assert list(after.columns) == [*before.columns, "window_documents"]
    pd.testing.assert_frame_equal(after[before.columns], before)
    for run, anchors in zip(after.itertuples(), (True, False), strict=False):
        targets = streams[anchors].target_documents(np.array(starts[anchors]), 128)  # (N, 128)
        majority = [int(np.bincount(row).argmax()) for row in targets]
        assert json.loads(run.window_documents) == majority
        assert len(set(majority)) > 1  # the windows span several documents
    assert after["window_documents"].iloc[2] == ""
    runs[0] = replace(runs[0], window_starts=[s + 1 for s in starts[True]])
    write_csv(runs, folder / "runs.csv")
    written = (folder / "runs.csv").read_text()
    with pytest.raises(ReportError, match="on-0: its window_starts are not the 6 windows of 128 tokens"):
        backfill(folder, tmp_path)
    assert (folder / "runs.csv").read_text() == written
