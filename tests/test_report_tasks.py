"""The task suite's report (`posab tasks`): the accuracy tables, the NoPE study's mean reciprocal rank with
ties at their mean rank, the paired seed-level orderings of a claims file, and the files it writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from report_runs import finished_run

from conftest import ROOT
from posab.report.cli import collect_runs
from posab.report.records import ReportError, RunRecord
from posab.report.runs_csv import write_csv
from posab.report.styles import PALETTE, encoding_colours, shared_colour_styles
from posab.studies.tasks import (
    TASK_BEGIN,
    TASK_END,
    TaskClaim,
    TaskRun,
    accuracy_figure,
    claim_verdicts,
    claims_block,
    frame_of,
    main,
    mrr,
    mrr_lines,
    read_task_claims,
    task_runs,
)

SUITE = ROOT / "results" / "tasks"
GRID, CLAIMS = SUITE / "grid", SUITE / "claims.csv"
TRAIN = {"copy": (1, 4), "parity": (1, 2)}
TEST = {"copy": 8, "parity": 4}


def task_run(encoding: str, task: str, seed: int, unseen: list[float], seen: float = 1.0) -> RunRecord:
    """A finished run of `task` whose unseen lengths score `unseen` (in order) and seen ones `seen`."""
    low, high = TRAIN[task]
    lengths = range(low, TEST[task] + 1)
    by_length = {n: seen if n <= high else unseen[n - high - 1] for n in lengths}
    metrics = {f"task/exact@{n}": v for n, v in by_length.items()}
    metrics |= {"task/exact_seen": seen, "task/exact_unseen": float(np.mean(unseen))}
    config = {"data.task.name": task, "data.task.train_lengths": f"[{low}, {high}]"}
    return finished_run(f"{encoding}-{task}-{seed}", encoding, seed, "tasks", config, metrics)


def suite() -> list[RunRecord]:
    """nope beats rope at every seed on both tasks (by 0.1 to 0.3 a length); alibi ties rope at 0 on
    parity; sinusoidal scores 0 everywhere."""
    runs = []
    for seed in (0, 1, 2):
        lift = 0.1 * (seed + 1)
        runs += [
            task_run("nope", "copy", seed, [0.5 + lift, 0.4 + lift, 0.3 + lift, 0.2 + lift]),
            task_run("rope", "copy", seed, [0.5, 0.4, 0.3, 0.2]),
            task_run("alibi", "copy", seed, [0.6, 0.1, 0.0, 0.0]),
            task_run("sinusoidal", "copy", seed, [0.0] * 4),
            task_run("nope", "parity", seed, [0.5, 0.3]),
            task_run("rope", "parity", seed, [0.0, 0.0]),
            task_run("alibi", "parity", seed, [0.0, 0.0]),
            task_run("sinusoidal", "parity", seed, [0.0, 0.0]),
        ]
    return runs


def test_coupled_runs_are_rows_of_their_own() -> None:
    """A run with coupled positions (issue 58) is its task's `@coupled` row, beside the sequential one."""
    coupled = task_run("rope", "copy", 0, [0.9] * 4)
    coupled.config["data.task.positions"] = "coupled"
    frame = frame_of(task_runs([task_run("rope", "copy", 0, [0.5] * 4), coupled]))
    assert sorted(frame["task"]) == ["copy", "copy@coupled"]


def test_the_frame_has_one_line_per_run_and_refuses_duplicates() -> None:
    frame = frame_of(task_runs(suite()))
    assert len(frame) == 24 and set(frame.columns) == {
        "encoding",
        "task",
        "seed",
        "exact_unseen",
        "exact_seen",
    }
    with pytest.raises(ReportError, match="two runs of one encoding, task and seed"):
        frame_of(task_runs([*suite(), task_run("nope", "copy", 0, [0.0] * 4)]))
    with pytest.raises(ReportError, match="no finished task run"):
        task_runs([finished_run("lm", "nope", 0, "study", {}, {"ppl/512": 3.0})])


def test_mean_reciprocal_rank_by_hand_with_ties_at_their_mean_rank() -> None:
    """copy (every seed): nope > rope (0.35) > alibi (0.175) > sinusoidal: ranks 1, 2, 3, 4. parity: nope
    1st, the other three tie at 0: rank (2 + 3 + 4) / 3 = 3. MRR over the 6 (task, seed)s: nope 1, rope
    (1/2 + 1/3) / 2, alibi (1/3 + 1/3) / 2, sinusoidal (1/4 + 1/3) / 2."""
    found = mrr(frame_of(task_runs(suite())), ["nope", "rope", "alibi", "sinusoidal"])
    assert found.to_dict() == pytest.approx(
        {"nope": 1.0, "rope": (1 / 2 + 1 / 3) / 2, "alibi": 1 / 3, "sinusoidal": (1 / 4 + 1 / 3) / 2}
    )
    assert list(found.index) == ["nope", "rope", "alibi", "sinusoidal"]


def claim(row: str, reference: str, task: str, direction: str = "greater") -> TaskClaim:
    return TaskClaim("nope_study", row, reference, task, direction, "preregistered", "abc123", "a sentence")


def test_an_ordering_is_tested_on_its_task_and_seed_pairs() -> None:
    """nope - rope on copy: +0.1, +0.2, +0.3 at seeds 0-2 (every length): 3 pairs, all positive, sign-flip
    p 1/8. Over the mean of both tasks the parity pairs (+0.4 every seed) join: 6 pairs, p 1/64; per seed
    (0.1 + 0.4) / 2, ... rope vs sinusoidal on parity: 0 every seed, p 1. Holm over the family of 3:
    3/64 for the mean, 2/8 for copy. Both intervals are above 0: the mean is ordered, copy suggestive
    (its 3 pairs cannot go below 1/8)."""
    claims = [
        claim("nope", "rope", "copy"),
        claim("nope", "rope", "mean"),
        claim("rope", "sinusoidal", "parity"),
    ]
    verdicts = claim_verdicts(task_runs(suite()), claims)
    first, second, third = verdicts.itertuples()
    assert first.per_seed == "+0.100 / +0.200 / +0.300" and first.difference == pytest.approx(0.2)
    assert second.per_seed == "+0.250 / +0.300 / +0.350"
    assert (first.pairs, second.pairs) == (3, 6)
    assert (first.p, second.p) == pytest.approx((1 / 8, 1 / 64))
    assert (first.p_holm, second.p_holm) == pytest.approx((2 / 8, 3 / 64))
    assert 0 < first.low < first.high and first.verdict == "suggestive"
    assert 0 < second.low < second.high and second.verdict == "ordered"
    assert third.difference == 0 and third.verdict == "indistinguishable" and third.p == 1.0
    opposite = claim_verdicts(task_runs(suite()), [claim("nope", "rope", "copy", "less")])
    assert opposite["verdict"].tolist() == ["opposite"]
    after_the_runs = TaskClaim("f", "nope", "rope", "mean", "greater", "post-hoc", "abc123", "a sentence")
    assert claim_verdicts(task_runs(suite()), [after_the_runs])["verdict"].tolist() == ["suggestive"]


def test_a_claim_with_a_fit_rule_counts_only_the_pairs_where_both_runs_fit() -> None:
    """`fit` 0.9: rope's copy run of seed 1 fits only to 0.5 at the training lengths, so the (copy, 1) pair
    is lost; the mean over both tasks keeps 5 of its 6 pairs, per seed the mean of what is left (seed 1:
    parity's +0.4 alone), and the table names the loss. Without the rule the claim reads as before."""
    runs = [
        r
        for r in suite()
        if not (r.encoding == "rope" and r.config["data.task.name"] == "copy" and r.seed == 1)
    ]
    runs.append(task_run("rope", "copy", 1, [0.5, 0.4, 0.3, 0.2], seen=0.5))
    fitted = TaskClaim("nope_study", "nope", "rope", "mean", "greater", "preregistered", "abc", "s", fit=0.9)
    line = claim_verdicts(task_runs(runs), [fitted]).iloc[0]
    assert (line["pairs"], line["pairs_lost"], line["fit"]) == (5, 1, 0.9)
    assert line["per_seed"] == "+0.250 / +0.400 / +0.350"
    assert line["difference"] == pytest.approx((0.1 + 0.4 + 0.4 + 0.3 + 0.4) / 5)
    assert line["p"] == pytest.approx(1 / 32)
    table = "\n".join(claims_block(claim_verdicts(task_runs(runs), [fitted])))
    assert "| pairs lost |" in table and "| 1 (fit 0.9) |" in table
    plain = claim_verdicts(task_runs(runs), [claim("nope", "rope", "mean")]).iloc[0]
    assert (plain["pairs"], plain["pairs_lost"]) == (6, 0)
    assert "pairs lost" not in "\n".join(
        claims_block(claim_verdicts(task_runs(runs), [claim("nope", "rope", "mean")]))
    )


def test_a_claim_without_two_common_seeds_is_named() -> None:
    runs = [r for r in suite() if not (r.encoding == "rope" and r.seed > 0)]
    with pytest.raises(ReportError, match="fewer than 2 seeds"):
        claim_verdicts(task_runs(runs), [claim("nope", "rope", "copy")])


def test_bad_claims_files_are_named(tmp_path: Path) -> None:
    path = tmp_path / "claims.csv"
    pd.DataFrame([vars(claim("nope", "rope", "divide"))]).to_csv(path, index=False)
    with pytest.raises(ReportError, match="task 'divide'; valid: copy, parity, mean"):
        read_task_claims(path, ["copy", "parity"])
    unknown_status = vars(claim("nope", "rope", "copy")) | {"status": "hoped"}
    pd.DataFrame([unknown_status]).to_csv(path, index=False)
    with pytest.raises(ReportError, match="status 'hoped'; valid: preregistered, post-hoc"):
        read_task_claims(path, ["copy"])
    pd.DataFrame([{"family": "x"}]).to_csv(path, index=False)
    with pytest.raises(ReportError, match="no column"):
        read_task_claims(path, ["copy"])


def suite_on_disk(folder: Path) -> Path:
    """`suite()` as FOLDER/runs.csv and a claims file of one ordering (nope > rope on the mean): its path."""
    write_csv(suite(), folder / "runs.csv")
    claims = folder / "claims.csv"
    pd.DataFrame([vars(claim("nope", "rope", "mean"))]).to_csv(claims, index=False)
    return claims


def test_the_command_writes_the_report_from_a_runs_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claims = suite_on_disk(tmp_path)
    out = tmp_path / "out"
    assert main([str(tmp_path), "--out", str(out), "--claims", str(claims)]) == 0  # a folder with a runs.csv
    text = (out / "tasks.md").read_text()
    assert "| nope | 0.550 (0.45 / 0.55 / 0.65) | 0.400 (0.40 / 0.40 / 0.40) |" in text
    assert "| nope | 1.000 | 0.687 |" in text  # beside the NoPE study's value
    assert "| nope > rope | mean | +0.300 | +0.250 / +0.300 / +0.350 | 6 |" in text
    assert "Family `nope_study`: 1 claim(s); the least Holm p its pairs allow: 1 × 1/64 = 0.0156." in text
    assert (out / "tasks.png").read_bytes().startswith(b"\x89PNG")
    assert len(pd.read_csv(out / "runs.csv")) == 24 and len(pd.read_csv(out / "tasks.csv")) == 24
    assert main([str(tmp_path / "nothing"), "--out", str(out)]) == 2


def test_write_rewrites_each_reading_s_claims_block_and_a_file_without_one_loses_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claims = suite_on_disk(tmp_path)
    reading, plain = tmp_path / "README.md", tmp_path / "plain.md"
    reading.write_text(f"intro\n{TASK_BEGIN}\nstale\n{TASK_END}\noutro\n")
    plain.write_text("no block here\n")
    out = tmp_path / "out"
    command = [str(tmp_path), "--out", str(out), "--claims", str(claims)]
    assert main([*command, "--write", str(reading), str(plain)]) == 2
    assert "plain.md: no claims block" in capsys.readouterr().err
    assert "stale" in reading.read_text() and plain.read_text() == "no block here\n"
    assert not out.exists()  # nothing written
    assert main([*command, "--write", str(reading)]) == 0
    text = reading.read_text()
    verdicts = pd.read_csv(out / "claims_verdicts.csv")
    block = text.split(TASK_BEGIN, 1)[1].split(TASK_END, 1)[0].strip("\n")
    assert text.startswith("intro\n") and text.endswith("outro\n") and "stale" not in text
    assert (
        "| nope > rope | mean | +0.300 |" in block
        and "Family `nope_study` (preregistered; registered: abc123)." in block
    )
    assert (
        verdicts["verdict"].tolist() == ["ordered"] and "**ordered**" not in block and "| ordered |" in block
    )
    assert main([str(tmp_path), "--out", str(out), "--write", str(reading)]) == 2  # no claims to write


def test_the_suite_s_claims_file_reads_and_names_encodings_and_tasks_that_exist() -> None:
    from conftest import CONF, ENCODINGS

    tasks = sorted(p.stem for p in (CONF / "task").glob("*.yaml"))
    claims = read_task_claims(CLAIMS, tasks)
    assert len(claims) == 7 and {c.family for c in claims} == {"nope_study"}
    assert all(
        c.row in ENCODINGS and c.reference in ENCODINGS and c.status == "preregistered" for c in claims
    )


def test_the_figure_draws_each_encoding_once_in_its_legend_and_tells_them_apart() -> None:
    """Every configured encoding on two tasks, one encoding on the second task only: the legend has each
    encoding once, even one absent from the first panel, and no two share both colour and line style
    (the palette repeats past its colours)."""
    from conftest import ENCODINGS

    more = [f"extra{i}" for i in range(len(PALETTE) - len(ENCODINGS) + 2)]  # past the palette's colours
    runs = [task_run(e, "copy", 0, [0.5, 0.1, 0.0, 0.0]) for e in [*ENCODINGS, *more]]
    runs += [task_run(e, "parity", 0, [0.2, 0.0]) for e in [*ENCODINGS, *more, "only_on_parity"]]
    figure = accuracy_figure(task_runs(runs))
    (legend,) = figure.legends
    names = [text.get_text() for text in legend.get_texts()]
    assert sorted(names) == sorted([*ENCODINGS, *more, "only_on_parity"])
    colours = encoding_colours(names)
    styles = shared_colour_styles(colours)
    looks = {(tuple(colours[n]), str(styles[n])) for n in names}
    assert len(looks) == len(names) and len(set(map(tuple, colours.values()))) < len(names)


# The committed grid (results/tasks/grid), held to its runs.csv and its claims file.


@pytest.fixture(scope="module")
def committed_runs() -> list[TaskRun]:
    return task_runs(collect_runs([GRID]))


def committed_task_verdicts() -> pd.DataFrame:
    return pd.read_csv(GRID / "claims_verdicts.csv", dtype={"per_seed": str}, keep_default_na=False)


def test_the_committed_grid_report_recomputes_from_its_runs_csv(committed_runs: list[TaskRun]) -> None:
    """tasks.csv (each run's accuracy) and mrr.csv (the aggregate) are what the runs.csv gives."""
    frame = frame_of(committed_runs)
    pd.testing.assert_frame_equal(frame, pd.read_csv(GRID / "tasks.csv"), check_dtype=False, rtol=1e-12)
    _, table = mrr_lines(frame)
    committed = pd.read_csv(GRID / "mrr.csv", index_col="encoding")
    pd.testing.assert_frame_equal(table, committed, check_names=False, rtol=1e-12)


def test_the_committed_task_verdicts_recompute_from_the_claims_file_and_the_runs(
    committed_runs: list[TaskRun],
) -> None:
    tasks = sorted({r.task for r in committed_runs})
    recomputed = claim_verdicts(committed_runs, read_task_claims(CLAIMS, tasks))
    committed = committed_task_verdicts()
    assert recomputed["verdict"].tolist() == committed["verdict"].tolist()
    assert recomputed["per_seed"].tolist() == committed["per_seed"].tolist()
    for column in ("difference", "p", "p_holm", "low", "high"):
        assert recomputed[column].to_numpy() == pytest.approx(committed[column].to_numpy(), rel=1e-9)


LEARNED = SUITE / "learned"  # issue 58's grid, in parts (partN/: runs.csv and configs)
NAMES = {
    "NoPE": "nope", "T5's bias": "t5", "ALiBi": "alibi", "RoPE": "rope", "sinusoidal": "sinusoidal",
    "FIRE": "fire", "DAPE on ALiBi": "dape_alibi", "KERPLE": "kerple",
    "randomized sinusoidal": "randomized_sinusoidal",
}  # fmt: skip


def test_the_learned_grid_s_tables_recompute_from_its_parts_and_its_reading_quotes_them() -> None:
    """results/tasks/learned: tasks.csv and mrr.csv are what the parts' runs.csv give, and each row of a
    part's table in its README (one table a part, its tasks read from its header: seen and unseen exact
    match, mean ± sample std, and the seeds that fit at 0.9) is what tasks.csv gives."""
    frame = frame_of(task_runs(collect_runs(sorted(LEARNED.glob("part*")))))
    pd.testing.assert_frame_equal(frame, pd.read_csv(LEARNED / "tasks.csv"), check_dtype=False, rtol=1e-12)
    _, table = mrr_lines(frame)
    committed = pd.read_csv(LEARNED / "mrr.csv", index_col="encoding")
    pd.testing.assert_frame_equal(table, committed, check_names=False, rtol=1e-12)
    tables = part_tables((LEARNED / "README.md").read_text())
    assert len(tables) == len(sorted(LEARNED.glob("part*")))
    for tasks, rows in tables:
        assert sorted(name for name, _ in rows) == sorted(NAMES)
        cells = [(name, task, row[3 * i : 3 * i + 3]) for name, row in rows for i, task in enumerate(tasks)]
        for name, task, (seen, unseen, fit) in cells:
            runs = frame[(frame["encoding"] == NAMES[name]) & (frame["task"] == task)]
            for text, column in ((seen, "exact_seen"), (unseen, "exact_unseen")):
                assert text == f"{runs[column].mean():.3f} ± {runs[column].std():.3f}", (name, task, column)
            assert fit == f"{int((runs['exact_seen'] >= 0.9).sum())}/{len(runs)}", (name, task)


def part_tables(readme: str) -> list[tuple[list[str], list[tuple[str, list[str]]]]]:
    """Each part's table in the grid's README: its tasks (a header `| encoding | TASK, seen | TASK, unseen
    | fit | ...`) and its rows (the encoding's display name, its cells)."""
    tables: list[tuple[list[str], list[tuple[str, list[str]]]]] = []
    for line in readme.splitlines():
        cells = line.strip("| ").split(" | ")
        if line.startswith("| encoding |") and cells[1].endswith(", seen"):
            tables.append(([c.removesuffix(", seen") for c in cells[1:] if c.endswith(", seen")], []))
        elif tables and line.startswith("| ") and cells[0] in NAMES:
            tables[-1][1].append((cells[0], cells[1:]))
    return tables


@pytest.mark.parametrize(
    "reading", [ROOT / "results" / "README.md", SUITE / "README.md"], ids=["results", "tasks"]
)
def test_each_reading_s_task_claims_block_is_what_the_committed_verdicts_give(reading: Path) -> None:
    text = reading.read_text(encoding="utf-8")
    block = text.split(TASK_BEGIN, 1)[1].split(TASK_END, 1)[0].strip("\n")
    assert block == "\n".join(claims_block(committed_task_verdicts()))
