"""posab bench --quick as a user runs it, and the benchmark's reference computations."""

from __future__ import annotations

import csv
import importlib
import importlib.util
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import posab
from conftest import ENCODINGS, isolated_env, tiny_model
from posab.bench.bias import BIASED, skip_note
from posab.bench.chunks import CHUNK_ROWS, KERNEL_RUNS, OWN_CHUNKED, TOLERANCE
from posab.bench.inputs import document_structure
from posab.bench.kernels import kernel_facts
from posab.bench.measure import peak_memory
from posab.bench.output import FULL_OUT, QUICK_OUT, output_folder
from posab.bench.progress import Progress
from posab.bench.settings import Settings
from posab.bench.targets import GOALS, Goal, Target, evaluate
from posab.encodings import Positions
from posab.encodings.reference import all_pairs_reference
from posab.forms.chunked import Kernel
from tolerances import EPS32, assert_close_to_scale

QUICK_LENGTHS = [64, 128]
PHASES = ["build", "forward", "forward+backward"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`posab bench --quick` without --out, from an empty folder: (that folder, stdout)."""
    cwd = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [sys.executable, "-m", "posab", "bench", "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        env=isolated_env(),
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cwd, proc.stdout


@pytest.fixture(scope="module")
def bench_dir(quick_run: tuple[Path, str]) -> Path:
    return quick_run[0] / QUICK_OUT


@pytest.mark.e2e
def test_quick_run_writes_to_its_scratch_folder_not_results(quick_run: tuple[Path, str]) -> None:
    cwd, stdout = quick_run
    assert (cwd / "outputs/bench_quick/bench.md").is_file()
    assert not (cwd / "results").exists()  # the committed tables are a full run's only
    assert "quick run: writing to outputs/bench_quick/" in stdout
    assert "mode | quick" in (cwd / "outputs/bench_quick/bench.md").read_text()


def test_output_folder_defaults() -> None:
    assert output_folder(None, quick=True) == QUICK_OUT == Path("outputs/bench_quick")
    assert output_folder(None, quick=False) == FULL_OUT == Path("results/bench")
    assert output_folder(Path("elsewhere"), quick=True) == Path("elsewhere")


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.mark.e2e
def test_bias_section_compares_both_methods(bench_dir: Path) -> None:
    rows = read_csv(bench_dir / "section1_bias.csv")
    cells = {(r["encoding"], int(r["length"]), r["phase"]) for r in rows}
    assert cells == {(e, n, p) for e in ("multiscale", "hierarchical") for n in QUICK_LENGTHS for p in PHASES}
    for row in rows:
        assert float(row["time_ratio"]) > 0 and float(row["memory_ratio"]) > 0, row
        assert float(row["max_abs_diff"]) < 0.05, row  # the reference computes the same bias


@pytest.mark.e2e
def test_train_section_covers_every_encoding(bench_dir: Path) -> None:
    rows = {r["encoding"]: r for r in read_csv(bench_dir / "section2_train_step.csv")}
    assert sorted(rows) == ENCODINGS
    assert all(float(r["step_s"]) > 0 and float(r["tokens_per_s"]) > 0 for r in rows.values())
    assert float(rows["nope"]["ratio_to_nope"]) == 1.0


@pytest.mark.e2e
def test_eval_section_covers_every_encoding_and_length(bench_dir: Path) -> None:
    rows = read_csv(bench_dir / "section3_eval_forward.csv")
    assert sorted((r["encoding"], int(r["length"])) for r in rows) == [
        (e, n) for e in ENCODINGS for n in QUICK_LENGTHS
    ]
    assert all(float(r["forward_s"]) > 0 and float(r["peak_mib"]) > 0 for r in rows)


@pytest.mark.e2e
def test_profile_section_ranks_operators_and_writes_each_table(bench_dir: Path) -> None:
    rows = read_csv(bench_dir / "section6_profile.csv")
    cases = list(dict.fromkeys(r["case"] for r in rows))
    assert cases[:4] == ["nope", "rope", "alibi", "hierarchical"]
    for case in cases:
        shares = [float(r["share_pct"]) for r in rows if r["case"] == case]
        assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 100.001, case
        table = (bench_dir / f"profile_{case.replace(' ', '_')}.txt").read_text()
        assert "Self CPU" in table and rows[[r["case"] for r in rows].index(case)]["operator"] in table


@pytest.mark.e2e
def test_peer_section_runs_or_says_why_not(bench_dir: Path) -> None:
    if importlib.util.find_spec("x_transformers") is None:
        assert not (bench_dir / "section4_x_transformers.csv").exists()
        assert "x-transformers is not installed" in (bench_dir / "bench.md").read_text()
        return
    rows = read_csv(bench_dir / "section4_x_transformers.csv")
    assert [r["posab"] for r in rows] == ["rope", "alibi", "multiscale"]
    assert all(float(r["ratio"]) > 0 for r in rows)


@pytest.mark.e2e
def test_flops_section_and_report(bench_dir: Path) -> None:
    (row,) = read_csv(bench_dir / "section5_flops.csv")
    assert row["model"] == "tiny"  # the quick run's model; a full run measures small and medium
    assert float(row["share_pct"]) > 0 and float(row["peak_gflops_bf16"]) > 0
    report = (bench_dir / "bench.md").read_text()
    for heading in ("CPU", "torch", "threads", "bf16 matmul kernel", "## Method", "## Targets"):
        assert heading in report
    verdicts = [r["verdict"] for r in read_csv(bench_dir / "targets.csv")]
    assert verdicts and all(v == "met" or v.startswith("missed by") for v in verdicts)


@pytest.mark.e2e
def test_chunk_section_times_every_kernel_at_every_chunk(bench_dir: Path) -> None:
    rows = read_csv(bench_dir / "section7_chunks.csv")
    cells = {(r["kernel"], int(r["rows"])) for r in rows}
    assert cells == {(k.__name__, n) for k in [*KERNEL_RUNS, *OWN_CHUNKED] for n in CHUNK_ROWS}
    for kernel in [*KERNEL_RUNS, *OWN_CHUNKED]:
        ratios = [float(r["ratio_to_fastest"]) for r in rows if r["kernel"] == kernel.__name__]
        assert min(ratios) == 1.0 and all(ratio >= 1.0 for ratio in ratios), kernel


def kernels_in_posab() -> set[type[Kernel]]:
    """Every `Kernel` subclass that posab's own modules define (every module but the entry point imported
    first)."""
    for module in pkgutil.walk_packages(posab.__path__, "posab."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    found, todo = set(), [Kernel]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("posab."):
                found.add(sub)
    return found


def test_every_kernel_on_the_chunked_core_is_in_the_chunk_sweep() -> None:
    assert kernels_in_posab() == set(KERNEL_RUNS)


def test_every_kernels_chunk_obeys_the_committed_chunk_sweep() -> None:
    """The chunk rule (`posab.bench.chunks`): each kernel's declared chunk is within the tolerance of the
    fastest in the committed full run's section 7."""
    full = Path(__file__).parents[1] / FULL_OUT
    rows = [*read_csv(full / "chunks" / "section7_chunks.csv")]
    rows += read_csv(full / "path_chunks" / "section7_chunks.csv")  # PaTH's, timed on its own
    for kernel in [*KERNEL_RUNS, *OWN_CHUNKED]:
        ours = [r for r in rows if r["kernel"] == kernel.__name__]
        measured = {int(r["rows"]): float(r["ratio_to_fastest"]) for r in ours}
        assert set(measured) == set(CHUNK_ROWS), kernel
        assert measured[kernel.chunk] <= 1 + TOLERANCE, (kernel, kernel.chunk, measured)


CASES = [(name, []) for name in BIASED] + [("hierarchical", ["encoding.combine=sum"])]
CASES += [(name, ["encoding.clamp=8"]) for name in ("multiscale", "hierarchical")]  # clamped within 96


@pytest.mark.parametrize(("name", "overrides"), CASES)
def test_all_pairs_references_match_the_modules(name: str, overrides: list[str]) -> None:
    """The benchmark's all-pairs method is the design note's (`posab.encodings.reference`): the same bias
    as the distinct-distance method, in float64 (and in float32 within a few EPS32 of the bias's scale)."""
    length = 96
    sentence, paragraph = document_structure(2, length, torch.Generator().manual_seed(0))
    pos = Positions.build(length, "cpu", 0, sentence, paragraph)
    encoding = tiny_model(name, *overrides).encoding
    reference = all_pairs_reference(encoding)
    assert reference is not None
    assert_close_to_scale(encoding.dense_bias(pos), reference(pos), rel=64 * EPS32, msg="float32")
    encoding.double()
    assert reference(pos).dtype == torch.float64
    assert_close_to_scale(encoding.dense_bias(pos), reference(pos), rel=1e-12, msg="float64")


def test_peak_memory_sees_a_temporary_tensor() -> None:
    def make_and_drop() -> None:
        torch.zeros(2**18)  # 1 MiB of float32, freed at once

    assert 2**20 <= peak_memory(make_and_drop) < 2**20 + 2**12


def test_target_verdicts() -> None:
    assert Target("t", 1.05, 1.10, higher_is_better=False).verdict() == "met"
    assert Target("t", 1.30, 1.25, higher_is_better=False).verdict() == "missed by 0.05x"
    assert Target("t", 80.0, 100.0, higher_is_better=True).verdict() == "missed by 20x"
    assert Target("t", 12.5, 40.0, True, "%").verdict() == "missed by 27.5 percentage points"
    assert Target("t", None, 40.0, True, "%").verdict() == "not measured"


def test_all_pairs_run_is_skipped_when_it_would_not_fit() -> None:
    assert skip_note(None, 4096) == ""
    assert skip_note((2048, 1024.0), 4096) == ""
    assert skip_note((2048, 1e15), 4096).startswith("all-pairs skipped: predicted peak")


def test_goals_read_the_tables_generically() -> None:
    """A goal picks rows by their cells (`longest`: the largest length of those), one target per row."""
    table = [
        {"encoding": e, "phase": p, "length": n, "time_ratio": float(n)}
        for e in ("multiscale", "hierarchical")
        for p in ("build", "forward")
        for n in (64, 128)
    ]
    goal = Goal(
        "t", "encoding=multiscale phase=forward length=longest", "time_ratio >= 100", "{phase} L={length}"
    )
    (target,) = evaluate({"t": table}, [goal])
    assert (target.label, target.value, target.bound, target.higher_is_better) == (
        "forward L=128",
        128,
        100,
        True,
    )
    assert target.verdict() == "met"
    every = Goal("t", "encoding=hierarchical", "time_ratio <= 100", "{phase} {length}")
    assert [t.verdict() for t in every.targets(table)] == ["met", "missed by 28x"] * 2
    assert evaluate({"other": table}, [goal]) == []  # a section that did not run: no target


@pytest.mark.e2e
def test_every_goal_reads_a_column_of_the_quick_tables(bench_dir: Path) -> None:
    """Every goal reads a column the quick tables have, and picks rows of them, but the goals on a model
    that only a full run measures (section 5's model=medium)."""
    tables = {p.stem: read_csv(p) for p in bench_dir.glob("section*.csv")}
    full_only = {f"model={name}" for name in Settings.build(False, None).flops_models} - {"model=tiny"}
    for goal in GOALS:
        if goal.section in tables:
            column = goal.condition.split()[0]
            assert column in tables[goal.section][0], goal
            assert goal.picked(tables[goal.section]) or goal.rows in full_only, goal


@pytest.mark.parametrize("bad", [("encoding", "ratio >= 1"), ("", "ratio > 1"), ("", "ratio >= many")])
def test_malformed_goals_are_refused(bad: tuple[str, str]) -> None:
    with pytest.raises(ValueError):
        Goal("t", *bad, "label")


def test_progress_without_bars_logs_each_case(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress(bars=False)
    assert list(progress.over([("rope", 64), ("alibi", 128)], "section 3")) == [("rope", 64), ("alibi", 128)]
    assert capsys.readouterr().err.splitlines() == ["section 3: rope 64", "section 3: alibi 128"]
    assert list(Progress(bars=True).over([1, 2], "bars")) == [1, 2]


def test_kernel_facts_name_what_ran(capfd: pytest.CaptureFixture[str]) -> None:
    """The matmul kernels come from oneDNN's own log (or say that oneDNN ran none), and the log does not
    reach the terminal."""
    facts = kernel_facts()
    for dtype in ("fp32", "bf16"):
        kernel = facts[f"{dtype} matmul kernel"]
        assert kernel.startswith("oneDNN ") or kernel.endswith("(no oneDNN primitive)"), kernel
    assert facts["CPU capability (torch)"] == torch.backends.cpu.get_cpu_capability()
    assert "onednn_verbose" not in capfd.readouterr().out
