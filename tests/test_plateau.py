"""`posab plateau` (issue 56, part 13): the same encodings and seeds at B and at a longer budget,
hand-worked."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf
from report_runs import finished_run

from posab.report.records import RunRecord
from posab.report.runs_csv import write_csv
from posab.studies.plateau import main, orderings, pair_frame, pairs

ROPE_ARM = {"train.lr": "0.006", "encoding.name": "rope"}


def write_runs(runs: list[RunRecord], folder: Path) -> None:
    """A report folder: runs.csv and each run's resolved config (configs/, where train.steps lives when
    it is constant within the folder), as `posab report` writes them."""
    (folder / "configs").mkdir(parents=True)
    for r in runs:
        OmegaConf.save(
            OmegaConf.from_dotlist([f"{k}={v}" for k, v in r.config.items()]),
            folder / "configs" / f"{r.name}.yaml",
        )
    write_csv(runs, folder / "runs.csv")


def run(encoding: str, seed: int, steps: int, ppl: float, tail: float, **arm: str) -> RunRecord:
    """A run at `steps` with its perplexity at 512 and its tail perplexity at 1,024 on the split."""
    config = {"train.steps": str(steps), "train.seq_len": "512", "encoding.name": encoding, **arm}
    metrics = {"ppl/512": ppl, "ppl/1024": tail, "ppl_tail/1024": tail, "val_loss": 1.0 + ppl / 10}
    return finished_run(
        "-".join([encoding, str(seed), str(steps), *arm.values()]), encoding, seed, "study", config, metrics
    )


def at_b() -> list[RunRecord]:
    """NoPE above RoPE on both seeds; the multi-scale bias twice on seed 0: the note's form and the clamped
    form, which is the longer run's arm."""
    return [
        run("nope", 0, 1000, 10.6, 12.0),
        run("nope", 1, 1000, 11.0, 12.5),
        run("rope", 0, 1000, 4.6, 17.0, **ROPE_ARM),
        run("rope", 1, 1000, 4.7, 22.0, **ROPE_ARM),
        run("multiscale", 0, 1000, 4.7, 30.0, **{"encoding.clamp": "null"}),
        run("multiscale", 0, 1000, 4.68, 4.6, **{"encoding.clamp": "train"}),
    ]


def at_4b() -> list[RunRecord]:
    """NoPE drops below RoPE on seed 1 only; NoPE's seed 0 becomes flat."""
    return [
        run("nope", 0, 4000, 4.9, 5.3, **{"model.ssmax": "false"}),  # an option added since B's runs
        run("nope", 1, 4000, 4.3, 5.0),
        run("rope", 0, 4000, 4.4, 15.0, **ROPE_ARM),
        run("rope", 1, 4000, 4.5, 16.0, **ROPE_ARM),
        run("multiscale", 0, 4000, 4.3, 4.3, **{"encoding.clamp": "train"}),
        run("alibi", 0, 4000, 4.8, 4.8),  # no run at B: left out
    ]


def test_each_longer_run_meets_the_run_at_b_of_its_encoding_and_seed_whose_arm_differs_least() -> None:
    found = {(p.long.encoding, p.long.seed): p for p in pairs(at_b(), at_4b())}
    assert set(found) == {("nope", 0), ("nope", 1), ("rope", 0), ("rope", 1), ("multiscale", 0)}
    clamped = found[("multiscale", 0)]
    assert clamped.short.config["encoding.clamp"] == "train" and clamped.differs == ()
    assert found[("nope", 0)].differs == ()  # a setting only the newer run records is not a difference
    note_form = pairs(at_b()[4:5], at_4b()[4:5])[0]  # only the note's form at B: what differs is named
    assert note_form.differs == ("encoding.clamp: null -> train",)


def test_orderings_say_which_hold_on_every_seed_and_the_flat_verdicts_at_both_budgets() -> None:
    frame = pair_frame(pairs(at_b(), at_4b()), 512, None)
    nope = frame[frame["encoding"] == "nope"].set_index("seed")
    assert nope.loc[0, "ratio_b"] == pytest.approx(12.0 / 10.6) and nope.loc[
        0, "ratio_longer"
    ] == pytest.approx(5.3 / 4.9)
    order = orderings(frame, 512).set_index("pair")
    assert order.loc["nope vs rope", "lower_at_b"] == "rope, rope"
    assert order.loc["nope vs rope", "lower_longer"] == "rope, nope"
    assert order.loc["nope vs rope", "holds"] == 1 and order.loc["nope vs rope", "seeds"] == 2
    assert order.loc["multiscale vs rope", "seeds"] == 1  # seed 0 only: multiscale has no seed 1
    assert order.loc["multiscale vs rope", "holds"] == 0  # 4.68 > 4.6 at B, 4.3 < 4.4 at 4B
    assert order.loc["nope vs rope", "gap_b"] == pytest.approx((6.0 + 6.3) / 2)


def test_the_command_writes_the_table_and_names_the_orderings_that_do_not_hold(tmp_path: Path) -> None:
    write_runs(at_b(), tmp_path / "b")
    write_runs(at_4b(), tmp_path / "4b")
    out = tmp_path / "out"
    assert main(["--at-b", str(tmp_path / "b"), "--longer", str(tmp_path / "4b"), "--out", str(out)]) == 0
    text = (out / "plateau.md").read_text()
    assert "Orderings that do not hold on every seed: nope vs rope, multiscale vs rope." in text
    assert "not 1.132 → flat 1.082" in text  # NoPE seed 0: broken at B, flat at 4B
    assert "Flat verdicts that change with the budget: nope seed 0 (not → flat)." in text
    assert len((out / "plateau.csv").read_text().splitlines()) == 1 + 5


def test_runs_that_do_not_meet_are_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_runs(at_b()[:2], tmp_path / "b")
    write_runs(at_4b()[2:4], tmp_path / "4b")
    args = ["--at-b", str(tmp_path / "b"), "--longer", str(tmp_path / "4b"), "--out", str(tmp_path / "out")]
    assert main(args) == 2
    assert "no run at the longer budget has a run at B of its encoding and seed" in capsys.readouterr().err
    write_runs(at_4b()[:2], tmp_path / "4b-nope")
    assert main([*args[:3], str(tmp_path / "4b-nope"), *args[4:], "--length", "333"]) == 2
    assert "--length 333: no run at the longer budget has a perplexity there" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
