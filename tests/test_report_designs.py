"""One test per design (same weights, matched by seed, unpaired), named on every line; what differs between
the compared runs, marked; and one comparison, one verdict, in whichever report it appears."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from report_runs import finished_run

from posab.report.grouping import group_rows
from posab.report.matching import comparison_id, unmatched
from posab.report.records import RunRecord
from posab.report.resampling import bootstrap_interval, least_one_sided_p, permutation_p, sign_flip_p
from posab.report.same_weights import same_weights_section
from posab.report.stats import (
    EXPLORATORY,
    ORDERED,
    SAME_WEIGHTS,
    SEED_MATCHED,
    SUGGESTIVE,
    UNPAIRED,
    paired_differences,
    pairing,
)

STARTS = [0, 4096, 8192, 12288]
DOCUMENTS = [0, 0, 1, 1]


def test_five_same_way_pairs_give_the_exact_sign_flip_p() -> None:
    differences = [-0.3, -0.01, -0.2, -0.05, -0.1]
    assert sign_flip_p(differences, "less") == pytest.approx(1 / 32)
    assert sign_flip_p(differences) == pytest.approx(1 / 16)  # two-sided: twice the smaller side
    assert sign_flip_p(differences, "greater") == pytest.approx(1.0)


def test_the_sign_flip_p_counts_assignments_by_hand() -> None:
    # differences -1, -2, +3: the 8 sign assignments' sums are 0, -6, 4, -2, 2, -4, 6, 0; the observed
    # sum 0 is matched or passed below by 5 of 8 (0, -6, -2, -4, 0), and above by 5 of 8
    assert sign_flip_p([-1.0, -2.0, 3.0], "less") == pytest.approx(5 / 8)
    assert sign_flip_p([-1.0, -2.0, 3.0]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="alternative 'lower'; valid: two-sided, less, greater"):
        sign_flip_p([1.0], "lower")


@pytest.mark.parametrize("seeds", [(3, 3), (5, 5), (2, 4)])
def test_the_least_p_of_a_design_is_what_its_test_gives_at_the_extreme(seeds: tuple[int, int]) -> None:
    arm, reference = np.arange(seeds[0]) - 10.0, np.arange(seeds[1]) + 10.0
    assert least_one_sided_p(*seeds, paired=False) == pytest.approx(permutation_p(arm, reference, "less"))
    pairs = -np.arange(1.0, seeds[0] + 1)
    assert least_one_sided_p(seeds[0], seeds[0], paired=True) == pytest.approx(sign_flip_p(pairs, "less"))


def run(
    encoding: str,
    seed: int,
    losses: list[float],
    training: tuple[float, float] | None = None,
    config: dict[str, str] | None = None,
    **info: str,
) -> RunRecord:
    """A finished run of study `s` over the four windows, with its training and validation loss."""
    train_loss, val_loss = training or (2.0 + 0.01 * seed + 0.001 * len(encoding), 2.1 + 0.01 * seed)
    metrics = {"train_loss": train_loss, "val_loss": val_loss}
    fields = {"windows": {"loss/512": losses}, "window_starts": STARTS, "window_documents": DOCUMENTS}
    record = finished_run(f"{encoding}-{seed}", encoding, seed, "s", config, metrics, **fields)
    record.info.update(info)
    return record


def base_losses(seed: int) -> list[float]:
    return [3.0 + 0.1 * seed + 0.05 * w for w in range(4)]


def test_rows_that_share_their_training_losses_to_the_bit_are_the_same_weights() -> None:
    reference = [run("multiscale", s, base_losses(s), (2.0 + s, 2.5 + s)) for s in range(5)]
    clamped = [
        run("clamped", s, [v - 0.02 * (s + 1) for v in base_losses(s)], (2.0 + s, 2.5 + s)) for s in range(5)
    ]
    assert pairing(clamped, reference).design == SAME_WEIGHTS
    frame = paired_differences(group_rows(reference + clamped), references=["multiscale"]).frame
    line = frame[frame["row"] == "clamped"].iloc[0]
    assert (line["design"], line["test"]) == (SAME_WEIGHTS, "sign-flip")
    assert line["p_seeds"] == pytest.approx(1 / 16)  # every difference negative, two-sided
    assert line["family"] == EXPLORATORY and line["verdict"] == SUGGESTIVE  # never ordered unclaimed


def test_runs_of_one_seed_under_one_protocol_are_seed_matched_and_fewer_than_two_are_unpaired() -> None:
    reference = [run("alibi", s, base_losses(s)) for s in range(5)]
    arm = [run("rope", s, base_losses(s)) for s in range(3)]
    found = pairing(arm, reference)
    assert found.design == SEED_MATCHED and [r.seed for r in found.reference] == [0, 1, 2]
    assert pairing(arm[:1], reference).design == UNPAIRED
    longer = [run("rope", s, base_losses(s), config={"train.steps": "2000"}) for s in range(3)]
    assert pairing(longer, reference).design == UNPAIRED  # another training protocol: no pairs


def test_an_unpaired_pair_gives_the_unpaired_tests_numbers() -> None:
    rng = np.random.default_rng(0)
    arm_losses = 3.0 + rng.normal(0, 0.05, size=(3, 4))  # (seeds, W)
    reference_losses = 3.1 + rng.normal(0, 0.05, size=(3, 4))
    arm = [run("rope", s, arm_losses[s].tolist()) for s in (0, 1, 2)]
    reference = [run("alibi", s, reference_losses[i].tolist()) for i, s in enumerate((5, 6, 7))]
    line = paired_differences(group_rows(arm + reference), references=["alibi"]).frame.iloc[0]
    assert (line["design"], line["test"]) == (UNPAIRED, "permutation")
    assert line["p_seeds"] == pytest.approx(permutation_p(arm_losses.mean(1), reference_losses.mean(1)))
    interval = bootstrap_interval(arm_losses, reference_losses, np.array(DOCUMENTS))
    assert (line["low"], line["high"]) == pytest.approx((interval.low, interval.high))


def test_unmatched_names_what_differs_and_marks_what_is_unknown() -> None:
    bf16 = [run("a", s, base_losses(s), precision="bf16", cpu_capability="AVX512") for s in range(2)]
    fp32 = [run("b", s, base_losses(s), precision="fp32", cpu_capability="AVX2") for s in range(2)]
    assert unmatched(bf16, fp32, paired=True) == "precision, cpu?, kernels, commit?"
    same = [run("c", s, base_losses(s), precision="bf16", cpu_capability="AVX512") for s in range(2)]
    for r in bf16 + same:
        r.info.update(git_commit="abc", machine="Linux, x86_64, AMD EPYC, 2 CPUs, torch 2.13.0+cpu")
    assert unmatched(bf16, same, paired=True) == ""


def test_one_comparison_has_one_verdict_whichever_rows_share_its_report() -> None:
    reference = [run("alibi", s, base_losses(s)) for s in range(5)]
    arm = [run("rope", s, [v - 0.05 for v in base_losses(s)]) for s in range(5)]
    others = [run(f"e{i}", s, [v + 0.01 * i for v in base_losses(s)]) for i in range(6) for s in range(5)]
    small = paired_differences(group_rows(reference + arm), references=["alibi"]).frame
    large = paired_differences(group_rows(reference + arm + others), references=["alibi"]).frame
    one, two = (f[f["row"] == "rope"].iloc[0] for f in (small, large))
    assert one["comparison"] == two["comparison"] == comparison_id(arm, reference, "loss", 512, "")
    assert (one["p_seeds"], one["verdict"]) == (two["p_seeds"], two["verdict"])
    assert ORDERED not in set(large["verdict"])  # exploratory: never ordered


def test_a_claimed_comparison_takes_its_claims_verdict_in_the_report(tmp_path: Path) -> None:
    reference = [run("alibi", s, base_losses(s)) for s in range(5)]
    arm = [run("rope", s, [v - 0.05 for v in base_losses(s)]) for s in range(5)]
    cid = comparison_id(arm, reference, "loss", 512, "")
    claimed = {cid: {"family": "p1", "claim": "p1.1", "p_holm": 0.031, "verdict": ORDERED}}
    frame = paired_differences(group_rows(reference + arm), references=["alibi"], claimed=claimed).frame
    line = frame.iloc[0]
    assert (line["family"], line["claim"], line["verdict"]) == ("p1", "p1.1", ORDERED)


def ppl_pair(seed: int, tail_before: float, tail_after: float) -> tuple[RunRecord, RunRecord]:
    """One model read without and with the clamp: the same losses in training, its perplexity past 512."""
    training = (2.0 + seed, 2.5 + seed)
    pair = []
    for clamp, tail in (("null", tail_before), ("train", tail_after)):
        record = run(
            "multiscale", seed, base_losses(seed), training, {"encoding.clamp": clamp, "train.seq_len": "512"}
        )
        record.name += f"-{clamp}"
        pull = 0.9 if clamp == "null" else 0.0
        record.metrics |= {
            "ppl/512": 4.0,
            "ppl/1024": tail,
            "ppl_tail/1024": tail,
            "audit/bias_pull@1024": pull,
        }
        pair.append(record)
    return pair[0], pair[1]


def test_same_weights_rows_get_a_line_per_model_and_the_count_of_runs_that_change_kind() -> None:
    pairs = [ppl_pair(0, 6.0, 4.1), ppl_pair(1, 4.1, 4.0), ppl_pair(2, 4.2, 4.1)]
    rows = group_rows([r for pair in pairs for r in pair])["s"]
    section = "\n".join(same_weights_section("s", rows))
    assert "`multiscale, encoding.clamp=null` → `multiscale, encoding.clamp=train`" in section
    assert (
        "broken → flat in 1, flat → broken in 0, flat both ways in 2, broken both ways in 0, of 3" in section
    )
    assert "| 0 | 4.00 → 4.00 | 6.00 → 4.10 | 0.900 → 0.000 | broken 1.500 → flat 1.025 |" in section
