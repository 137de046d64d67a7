"""`python train.py ...` end to end, as a user runs it (e2e); what posab.run.wiring.main says
about bad input, each case in-process, and how train.py prints it, a few cases end to end."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import MissingConfigException

from conftest import ENCODINGS, ROOT, compose_config, run_main, run_train
from posab import cli
from posab.data.synthetic import SyntheticSpec, generate_corpus, write_text_folder
from posab.errors import ConfigError


def tiny_args(tmp_path: Path, *more: str) -> list[str]:
    return [
        "+experiment=tiny",
        f"hydra.run.dir={tmp_path / 'run'}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *more,
    ]


@pytest.mark.e2e
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
    assert results["git_commit_start"] == results["git_commit"] and results["resumed_from_step"] is None
    assert isinstance(results["git_dirty"], bool) or results["git_commit"] == "unknown"
    assert results["machine"]["versions"]["torch"] == results["machine"]["torch"]
    assert results["machine"]["cpu_capability"]
    assert (run / "checkpoint.pt").stat().st_size > 0
    assert f"name: {encoding}" in (run / "config.yaml").read_text()
    assert any('"val/loss"' in line for line in (run / "metrics.jsonl").read_text().splitlines())
    table = proc.stdout[proc.stdout.index("posab: ") :].splitlines()  # the end-of-run table, last
    assert table[0].startswith(f"posab: {encoding}, finished, seed 0")
    row = next(line for line in table if line.startswith("ppl ")).removeprefix("ppl ").split()
    expected = [results["eval"][f"ppl/{n}"] for n in (128, 256)]
    assert [float(cell) for cell in row] == pytest.approx(expected, abs=0.05)
    # no passkey stage: the needle's numbers stay in results.json, the table says how to get retrieval
    assert "needle/gain@128" in results["eval"] and not any(line.startswith("needle ") for line in table)
    assert any(line.startswith("needle: no passkey stage") for line in table)
    assert f"run directory: {run}" in table and any("posab report" in line for line in table)


def test_train_on_a_text_folder(tmp_path: Path) -> None:
    corpus = generate_corpus(SyntheticSpec(seed=3, vocab_size=200, train_docs=4, valid_docs=2, test_docs=1))
    folder = write_text_folder(corpus, tmp_path / "books")
    args = ["+experiment=tiny", f"data.cache_dir={tmp_path / 'cache'}", "data=text", f"data.path={folder}"]
    run_main([*args, "encoding=alibi"], tmp_path / "run")
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["status"] == "finished"
    assert results["data"]["tokens"]["valid"] > 0


def error_line(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def config_error(tmp_path: Path, *more: str) -> str:
    """The ConfigError posab.run.wiring.main raises for these overrides (train.py prints it as `error: ...`
    on one line, exit code 2, no traceback): its message, one line, also recorded in results.json."""
    with pytest.raises(ConfigError) as info:
        run_main(["+experiment=tiny", f"data.cache_dir={tmp_path / 'cache'}", *more], tmp_path / "run")
    message = str(info.value)
    assert "\n" not in message, message
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["status"] == "failed" and results["error"] == f"ConfigError: {message}"
    return message


def test_unknown_encoding_lists_the_available_ones() -> None:
    with pytest.raises(MissingConfigException) as info:
        compose_config(["+experiment=tiny", "encoding=absolute"])
    assert "encoding/absolute" in str(info.value)
    available = str(info.value).split("Available options in 'encoding':", 1)[1].split("Config search path")[0]
    assert available.split() == ENCODINGS


BAD_INPUT = [
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
]


@pytest.mark.parametrize(("args", "expected"), BAD_INPUT)
def test_bad_input_is_a_config_error_that_names_it(tmp_path: Path, args: list[str], expected: str) -> None:
    assert expected in config_error(tmp_path, *args)


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("args", "expected"), [BAD_INPUT[0], BAD_INPUT[6], BAD_INPUT[7]], ids=["data", "lr", "key"]
)
def test_bad_input_gives_one_clear_line(tmp_path: Path, args: list[str], expected: str) -> None:
    """train.py turns a ConfigError into one `error:` line and exit code 2: one from the data, after the
    (default, W&B) logger has started, one from a section's validation, one from the strict merge."""
    proc = run_train(tiny_args(tmp_path, *args))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert expected in error_line(proc)
    assert error_line(proc).startswith("error: ")
    assert "Traceback" not in proc.stderr


def scalar_eval(results: dict) -> dict:
    return {k: v for k, v in results.items() if isinstance(v, int | float) and not k.startswith("time/")}


@pytest.mark.e2e
def test_reevaluating_a_checkpoint_gives_the_numbers_of_the_run(tmp_path: Path) -> None:
    proc = run_train(tiny_args(tmp_path, "encoding=hierarchical"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = tmp_path / "run"
    trained = json.loads((run / "results.json").read_text())["eval"]
    assert {"ppl/128", "needle/acc", "shift/offset64/kl", "shift/prefix16/dloss"} <= set(trained)
    assert (run / "needle_heatmap.png").stat().st_size > 0
    script = ["-m", "posab", "evaluate", str(run), "--out", str(tmp_path / "again")]
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


@pytest.mark.parametrize("content", [b"", bytes(range(256)) * 8], ids=["empty", "binary"])
def test_empty_or_binary_text_is_named(tmp_path: Path, content: bytes) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(content)
    message = config_error(tmp_path, "data=text", f"data.path={bad}")
    assert str(bad) in message and ("only empty files" in message or "not UTF-8 text" in message)


def test_eval_length_longer_than_the_validation_split(tmp_path: Path) -> None:
    message = config_error(tmp_path, "eval.lengths=[128,10000000]")
    assert "[10000000]" in message and "valid split" in message and "tokens" in message
    assert not (tmp_path / "run" / "checkpoint.pt").exists()  # failed before any training


def test_posab_lists_its_commands_and_names_an_unknown_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2 and "evaluate" in capsys.readouterr().out
    assert cli.main(["--help"]) == 0 and "report" in capsys.readouterr().out
    assert cli.main(["reprot"]) == 2
    assert "no command 'reprot'; commands: evaluate, report" in capsys.readouterr().err
    for module, _ in cli.COMMANDS.values():
        assert callable(importlib.import_module(module).main), module


@pytest.mark.parametrize("script", sorted((ROOT / "scripts").glob("*.py")), ids=lambda p: p.name)
def test_every_script_is_a_posab_command(script: Path) -> None:
    """scripts/NAME.py (the commands in committed reports) runs `posab NAME` (underscores as hyphens)."""
    command = script.stem.replace("_", "-")
    assert command in cli.COMMANDS
    assert f'main(["{command}", *sys.argv[1:]])' in script.read_text()
