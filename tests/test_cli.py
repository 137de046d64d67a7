"""`python train.py ...` end to end, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ENCODINGS, ROOT, run_train
from posab.data.synthetic import SyntheticSpec, generate_corpus, write_text_folder


def tiny_args(tmp_path: Path, *more: str) -> list[str]:
    return [
        "+experiment=tiny",
        f"hydra.run.dir={tmp_path / 'run'}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *more,
    ]


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_train_every_encoding(encoding: str, tmp_path: Path) -> None:
    proc = run_train(tiny_args(tmp_path, f"encoding={encoding}"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = tmp_path / "run"
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "finished"
    assert results["encoding"] == encoding
    assert results["val_loss"] > 0 and results["tokens_per_s"] > 0
    assert results["params"]["total"] > 0 and results["wall_time_s"] > 0
    assert len(results["git_commit"]) in (40, len("unknown"))
    assert (run / "checkpoint.pt").stat().st_size > 0
    assert f"name: {encoding}" in (run / "config.yaml").read_text()
    assert any('"val/loss"' in line for line in (run / "metrics.jsonl").read_text().splitlines())
    table = proc.stdout[proc.stdout.index("posab: ") :].splitlines()  # the end-of-run table, last
    assert table[0].startswith(f"posab: {encoding}, finished, seed 0")
    for label, key in (("ppl ", "ppl/{}"), ("needle gain", "needle/gain@{}")):
        row = next(line for line in table if line.startswith(label)).removeprefix(label).split()
        expected = [results["eval"][key.format(n)] for n in (128, 256)]
        assert [float(cell) for cell in row] == pytest.approx(expected, abs=0.05)
    assert f"run directory: {run}" in table and any("scripts/report.py" in line for line in table)


def test_train_on_a_text_folder(tmp_path: Path) -> None:
    corpus = generate_corpus(SyntheticSpec(seed=3, vocab_size=200, train_docs=4, valid_docs=2, test_docs=1))
    folder = write_text_folder(corpus, tmp_path / "books")
    proc = run_train(tiny_args(tmp_path, "data=text", f"data.path={folder}", "encoding=alibi"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["status"] == "finished"
    assert results["data"]["tokens"]["valid"] > 0


def error_line(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def test_unknown_encoding_lists_the_available_ones(tmp_path: Path) -> None:
    proc = run_train(tiny_args(tmp_path, "encoding=absolute"))
    assert proc.returncode != 0
    assert "absolute" in proc.stderr
    for name in ENCODINGS:
        assert name in proc.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["data=text", "data.path=/no/such/folder"], "data.path='/no/such/folder' does not exist"),
        (["train.seq_len=100000"], "too few for one window of 100000 tokens"),
        (["train.steps=0"], "train.steps=0 must be a positive integer"),
        (["model.d_model=30", "model.n_heads=4"], "model.d_model=30 is not divisible by model.n_heads=4"),
        (["encoding=rope", "model.d_model=6", "model.n_heads=2"], "head_dim=3"),
        (["data.needle_rate=2"], "data.needle_rate=2.0 must be in [0, 1]"),
        (["train.lr=0"], "train.lr=0.0 must be positive"),
        (["+train.lrr=1"], "invalid config key 'train.lrr'"),
        (["train.steps=many"], "invalid config key 'train.steps'"),
        (["encoding=fire", "encoding.hidden=abc"], "encoding 'fire': hidden='abc' is not a valid int"),
        (["encoding=rope", "encoding.base=[1]"], "encoding 'rope': base=[1] is not a valid float"),
        (["encoding=rope", "encoding.rotary_dim=2.5"], "rotary_dim=2.5 is not a valid int or None"),
        (["encoding=sinusoidal", "encoding.learn_scale=3"], "learn_scale=3 is not a valid bool"),
        (["encoding=hierarchical", "encoding.levels=token"], "levels='token' is not a valid list of str"),
    ],
)
def test_bad_input_gives_one_clear_line(tmp_path: Path, args: list[str], expected: str) -> None:
    proc = run_train(tiny_args(tmp_path, *args))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert expected in error_line(proc)
    assert error_line(proc).startswith("error: ")
    assert "Traceback" not in proc.stderr


def scalar_eval(results: dict) -> dict:
    return {k: v for k, v in results.items() if isinstance(v, int | float) and not k.startswith("time/")}


def test_reevaluating_a_checkpoint_gives_the_numbers_of_the_run(tmp_path: Path) -> None:
    proc = run_train(tiny_args(tmp_path, "encoding=hierarchical"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = tmp_path / "run"
    trained = json.loads((run / "results.json").read_text())["eval"]
    assert {"ppl/128", "needle/acc", "shift/offset64/kl", "shift/prefix16/dloss"} <= set(trained)
    assert (run / "needle_heatmap.png").stat().st_size > 0
    script = [str(ROOT / "scripts" / "evaluate.py"), str(run), "--out", str(tmp_path / "again")]
    again = subprocess.run([sys.executable, *script], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    reevaluated = json.loads((tmp_path / "again" / "results.json").read_text())["eval"]
    assert scalar_eval(reevaluated) == pytest.approx(scalar_eval(trained), rel=1e-6, abs=1e-9)
    longer = subprocess.run(
        [sys.executable, *script, "eval.lengths=[128,512]"], capture_output=True, text=True
    )
    assert longer.returncode == 0, longer.stderr[-2000:]
    longer_eval = json.loads((tmp_path / "again" / "results.json").read_text())["eval"]
    table = longer.stdout.splitlines()  # the end-of-run table, for the re-evaluation
    assert next(line for line in table if line.startswith("length")).split()[1:] == ["128", "512"]
    ppl = next(line for line in table if line.startswith("ppl "))
    assert float(ppl.split()[2]) == pytest.approx(longer_eval["ppl/512"], abs=0.005)


@pytest.mark.parametrize("content", [b"", bytes(range(256)) * 8])
def test_empty_or_binary_text_is_named(tmp_path: Path, content: bytes) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(content)
    proc = run_train(tiny_args(tmp_path, "data=text", f"data.path={bad}"))
    assert proc.returncode == 2
    line = error_line(proc)
    assert str(bad) in line and ("only empty files" in line or "not UTF-8 text" in line)


def test_eval_length_longer_than_the_validation_split(tmp_path: Path) -> None:
    proc = run_train(tiny_args(tmp_path, "eval.lengths=[128,10000000]"))
    assert proc.returncode == 2
    line = error_line(proc)
    assert "[10000000]" in line and "valid split" in line and "tokens" in line
    assert not (tmp_path / "run" / "checkpoint.pt").exists()  # failed before any training
