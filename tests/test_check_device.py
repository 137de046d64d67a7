"""`posab check-device --device cpu`: every encoding's fp32 and bf16 results against the CPU in float64,
its table, its verdicts and exit codes, and its errors for a bad device, encoding or model."""

from __future__ import annotations

import contextlib
import copy
import csv
import io
import math
from pathlib import Path

import pytest
import torch

from conftest import ENCODINGS
from posab import cli
from posab.bench import check_device, device_checks
from posab.bench.device_checks import FAIL, PASS, SKIPPED, TOLERANCES, Row, judged
from posab.bench.device_numerics import scale_error
from posab.device import cpu_bf16_attention_error
from posab.model import DecoderLM
from tolerances import EPS32

FAST_ENCODINGS = ["alibi", "hierarchical"]  # a constant bias and the per-sample learned one
FAST_ARGS = ["--device", "cpu", "--seq-len", "16", "--repeats", "1"]  # logits at 16 and 64


def table_rows(stdout: str) -> dict[tuple[str, str], list[str]]:
    """The printed table's rows: (encoding, precision) -> the row's cells."""
    rows = {}
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == len(check_device.device_report.COLUMNS):
            rows[(cells[0], cells[1])] = cells
    rows.pop(("encoding", "precision"), None)
    return rows


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def cpu_check(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, Path]:
    """One run on two encodings at L = 16: (exit code, stdout, --out folder)."""
    out = tmp_path_factory.mktemp("check_device")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = check_device.main([*FAST_ARGS, "--encodings", ",".join(FAST_ENCODINGS), "--out", str(out)])
    return code, stdout.getvalue(), out


def test_cpu_fp32_and_bf16_match_float64(cpu_check: tuple[int, str, Path]) -> None:
    """Every row passes; bf16 is skipped, with torch's reason, only where this process's torch cannot run
    bf16 attention (ATEN_CPU_CAPABILITY lowered on an AMX machine), and then only bf16."""
    code, stdout, out = cpu_check
    assert code == 0, stdout
    rows = table_rows(stdout)
    assert set(rows) == {(name, p) for name in FAST_ENCODINGS for p in ("fp32", "bf16")}
    bf16_error = cpu_bf16_attention_error()
    expected = {"fp32": PASS, "bf16": PASS if bf16_error is None else SKIPPED}
    assert all(cells[6] == expected[precision] for (_, precision), cells in rows.items()), stdout
    assert "# posab check-device: cpu against the CPU in float64" in stdout
    summary = "pass: all 4 checks passed" if bf16_error is None else "pass: all 2 checks passed (2 skipped)"
    assert "torch " + torch.__version__ in stdout and summary in stdout
    if bf16_error is not None:
        assert f'kernel set ("{bf16_error}")' in stdout
    for record in read_csv(out / "check_device.csv"):
        if record["verdict"] == SKIPPED:
            continue
        errors = [float(record[key]) for key in ("err_L", "err_4L", "grad_err")]
        # fp32 on the CPU: measured ~2 EPS32 of the logits' scale; 1e-4 is the command's fp32 tolerance
        bound = 1e-4 if record["precision"] == "fp32" else TOLERANCES["bf16"]
        assert all(0 <= error < bound for error in errors), record
        assert record["verdict"] == PASS and record["finite"] == "True"
        assert float(record["ms_per_step"]) > 0 and float(record["tokens_per_s"]) > 0
        assert float(record["peak_mib"]) > 0 and record["length"] == "16"
    report = (out / "check_device.md").read_text()
    assert "| alibi | fp32 |" in report and "L = 16 (training length), 4L = 64" in report


def test_fp32_errors_are_rounding_not_zero(cpu_check: tuple[int, str, Path]) -> None:
    """The comparison compares something: fp32 differs from float64 by its rounding (a few EPS32), so an
    error of exactly 0 would mean both sides computed in one precision."""
    records = [r for r in read_csv(cpu_check[2] / "check_device.csv") if r["precision"] == "fp32"]
    assert all(0 < float(r["err_L"]) < 1e3 * EPS32 for r in records), records


def perturbed_copy(model: DecoderLM, device: torch.device) -> DecoderLM:
    """The device's copy with every weight moved by 10% of its own size: a device that computes wrongly."""
    broken = copy.deepcopy(model).to(device)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in broken.parameters():
            param.add_(0.1 * param.abs().mean() * torch.randn(param.shape, generator=generator))
    return broken


def test_a_device_that_computes_otherwise_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(device_checks, "device_copy", perturbed_copy)
    assert check_device.main([*FAST_ARGS, "--encodings", "rope"]) == 1
    stdout = capsys.readouterr().out
    rows = table_rows(stdout)
    if cpu_bf16_attention_error() is None:
        assert [cells[6] for cells in rows.values()] == [FAIL, FAIL], stdout
        assert "FAIL: 2 of 2 checks failed (rope fp32, rope bf16)" in stdout
    else:  # bf16 cannot run in this process (see test_cpu_fp32_and_bf16_match_float64): fp32 decides
        assert [cells[6] for cells in rows.values()] == [FAIL, SKIPPED], stdout
        assert "FAIL: 1 of 2 checks failed (rope fp32) (1 skipped)" in stdout
    assert "- rope fp32: err@L" in stdout and "> 1e-04" in stdout


def test_non_finite_results_fail() -> None:
    assert scale_error(torch.tensor([1.0, math.nan]), torch.tensor([1.0, 2.0])) == math.inf
    assert scale_error(torch.tensor([1.0, 2.1]), torch.tensor([1.0, -2.0])) == pytest.approx(4.1 / 2)
    row = judged(Row("rope", "fp32", err_l=0.0, err_4l=0.0, grad_err=0.0, finite=False))
    assert row.verdict == FAIL and row.notes == ["non-finite logits or gradient"]
    assert judged(Row("rope", "bf16", err_l=1e-2, err_4l=2e-2, grad_err=4e-2)).verdict == PASS


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert check_device.main(["--device", "cuda", "--encodings", "rope"]) == 2
    err = capsys.readouterr().err
    assert "error: --device cuda: CUDA is not available" in err and "valid here: cpu" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "tpu"], "--device 'tpu' is not a device name; valid here: cpu"),
        (["--device", "meta"], "--device meta: no such device on this machine; valid here: cpu"),
        (["--encodings", "rope,ropee"], "--encodings: unknown ['ropee']; valid: alibi, "),
        (
            ["--model", "huge"],
            "--model 'huge': no conf/model/huge.yaml; valid: ladder_10m, ladder_3m, medium, small, tiny",
        ),
    ],
)
def test_bad_arguments_are_named(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert check_device.main(args) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""


def test_check_device_is_a_posab_command() -> None:
    assert cli.COMMANDS["check-device"][0] == "posab.bench.check_device"


@pytest.mark.slow
def test_every_encoding_passes_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    """All of conf/encoding at L = 32 (logits at 32 and 128), fp32 and bf16."""
    assert check_device.main(["--device", "cpu", "--seq-len", "32", "--repeats", "1"]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert set(rows) == {(name, p) for name in ENCODINGS for p in ("fp32", "bf16")}
    assert all(cells[6] == PASS for cells in rows.values())
