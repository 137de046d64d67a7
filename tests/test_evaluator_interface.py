"""Adding an evaluator is two files: a copy of the package with one new module under posab/evaluate/ (the
measurement) and one under posab/catalog/ (its report columns, torch-free) trains, evaluates, writes,
logs and reports the new measurement, with no other file touched."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, isolated_env, typed_config
from posab.catalog import catalog_modules
from posab.evaluate import EvalConfig, enabled_evaluators, evaluator_classes
from posab.report.columns import study_columns

PLUGIN = '''
"""A made-up measurement: the validation windows of the training length, with a table and a figure."""

from dataclasses import dataclass

from posab.evaluate.base import Evaluator, SectionConfig
from posab.evaluate.context import EvalContext
from posab.outputs import EvalOutput, Table
from posab.plots import new_figure


@dataclass
class WindowCountConfig(SectionConfig):
    factor: int = 1


class WindowCount(Evaluator[WindowCountConfig]):
    name = "window_count"
    config = WindowCountConfig
    order = 50

    def evaluate(self, ctx: EvalContext) -> EvalOutput:
        count = ctx.valid.windows_available(ctx.train_len) * self.cfg.factor
        figure = new_figure(2.0, 2.0)
        figure.add_subplot().bar([0], [count])
        return EvalOutput(
            scalars={"count/windows": float(count)},
            tables={"window_count": Table(["windows"], [[count]])},
            figures={"window_count_plot": figure},
        )
'''
COLUMNS = '''
"""The made-up measurement's report column."""

from collections.abc import Collection

from posab.outputs import Column

ORDER = 50


def report_columns(keys: Collection[str]) -> list[Column]:
    return [Column("windows", "count/windows", ".0f", "made-up")] if "count/windows" in keys else []
'''


@pytest.mark.e2e
def test_one_new_file_is_a_new_evaluator(tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(ROOT / "src", source, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    (source / "posab" / "evaluate" / "window_count.py").write_text(PLUGIN)
    (source / "posab" / "catalog" / "window_count.py").write_text(COLUMNS)
    env = {**isolated_env(), "PYTHONPATH": str(source)}
    run = tmp_path / "run"
    args = ["+experiment=tiny", "encoding=alibi", "logger=jsonl", f"hydra.run.dir={run}"]
    args += [
        f"data.cache_dir={tmp_path / 'cache'}",
        "+eval.window_count.factor=3",
    ]  # no conf/ section: + adds the key
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (ROOT / "src/posab/evaluate/window_count.py").exists()  # only the copy has it
    results = json.loads((run / "results.json").read_text())
    windows = results["eval"]["count/windows"]
    assert windows > 0 and windows % 3 == 0
    # timed like the built-in evaluators: one `time/<name>_s` each, within the run's wall time
    timed = {key for key in results["eval"] if key.startswith("time/") and "@" not in key}
    enabled = enabled_evaluators(typed_config(["+experiment=tiny"]).eval)
    assert timed == {f"time/{e.name}_s" for e in enabled} | {"time/window_count_s"}
    assert results["eval"]["time/window_count_s"] <= results["wall_time_s"]
    assert (run / "window_count.csv").read_text().splitlines() == ["windows", str(int(windows))]
    assert (run / "window_count_plot.png").read_bytes()[:4] == b"\x89PNG"
    assert (run / "needle_heatmap.png").is_file() and (run / "needle.csv").is_file()
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["count/windows"] == windows
    report = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "report.py"), str(run), "--out", str(tmp_path / "report")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr[-3000:]
    header = next(
        line for line in (tmp_path / "report" / "report.md").read_text().splitlines() if "| ppl@" in line
    )
    assert header.rstrip(" |").endswith("| windows")  # the declared column, after the built-in ones


def test_every_evaluator_has_a_config_section_and_a_report_declaration() -> None:
    names = [cls.name for cls in evaluator_classes()]
    assert names == ["task", "perplexity", "needle", "extrapolation", "shift", "analysis"]
    defaults = EvalConfig()
    assert list(catalog_modules()) == names  # each its columns' module, in the same order
    for cls in evaluator_classes():
        assert isinstance(getattr(defaults, cls.name), cls.config)
        assert cls.order == catalog_modules()[cls.name].ORDER
        assert catalog_modules()[cls.name].report_columns(set()) == []  # nothing to show without its keys
    assert [c.header for c in study_columns([])] == ["tokens/s", "wall s", "val loss"]
