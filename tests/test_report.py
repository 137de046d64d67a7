"""posab report over a real tiny sweep (alibi, nope × seeds 0, 1) plus one failed job."""

from __future__ import annotations

import csv
import itertools
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from omegaconf import OmegaConf

from conftest import ROOT, run_train
from posab.paths import encoding_names
from posab.report import main
from posab.report.curves import plot_training_curves, trained_rows
from posab.report.document import copy_configs
from posab.report.grouping import Row, group_rows
from posab.report.markdown import study_table
from posab.report.records import ReportError, RunRecord
from posab.report.rundirs import load_run
from posab.report.runs_csv import load_csv, write_csv
from posab.report.stats import curve_band
from posab.report.styles import ENCODING_COLOURS, PALETTE, encoding_colours, line_styles, stable_colour

FAILED_RUN = "0_encoding=alibi,train.lr=-1"
FAILED_ERROR = "ConfigError: train.lr=-1.0 must be positive"


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runs/sweep: 4 finished runs; runs/failed: one job that the config validation rejects."""
    root = tmp_path_factory.mktemp("report")
    common = ["-m", "+experiment=tiny", "logger=jsonl", f"data.cache_dir={root / 'cache'}"]
    sweep = run_train([*common, "encoding=alibi,nope", "seed=0,1", f"hydra.sweep.dir={root / 'runs/sweep'}"])
    assert sweep.returncode == 0, sweep.stderr[-2000:]
    run_train([*common, "encoding=alibi", "train.lr=-1", f"hydra.sweep.dir={root / 'runs/failed'}"])
    failed = json.loads((root / "runs/failed" / FAILED_RUN / "results.json").read_text())
    assert failed["status"] == "failed"
    return root / "runs"


@pytest.fixture(scope="module")
def report_dir(runs_dir: Path) -> Path:
    """The report over every run, written by the script as a user runs it."""
    out = runs_dir.parent / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "posab", "report", str(runs_dir), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def finished_results(runs_dir: Path, encoding: str) -> list[dict]:
    results = [json.loads(p.read_text()) for p in sorted((runs_dir / "sweep").glob("*/results.json"))]
    return [r for r in results if r["encoding"] == encoding and r["status"] == "finished"]


def table(report_md: str, study: str) -> dict[str, dict[str, str]]:
    """The rows of one study's table: {label: {column header: cell}}."""
    lines = report_md.split(f"## Study `{study}`\n\n", 1)[1].splitlines()
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines[: lines.index("")]]
    header, body = rows[0], rows[2:]
    return {cells[0]: dict(zip(header, cells, strict=True)) for cells in body}


def mean_std(values: list[float], fmt: str) -> str:
    return f"{np.mean(values):{fmt}} ± {np.std(values, ddof=1):{fmt}}"


@pytest.mark.e2e
def test_table_has_one_row_per_encoding_with_two_seeds(report_dir: Path) -> None:
    rows = table((report_dir / "report.md").read_text(), "tiny")
    assert list(rows) == ["alibi", "nope"]
    assert [row["seeds n"] for row in rows.values()] == ["2", "2"]


@pytest.mark.e2e
def test_table_numbers_are_mean_and_std_over_the_seeds(runs_dir: Path, report_dir: Path) -> None:
    rows = table((report_dir / "report.md").read_text(), "tiny")
    for encoding in ("alibi", "nope"):
        results = finished_results(runs_dir, encoding)
        assert len(results) == 2
        row = rows[encoding]
        assert row["val loss"] == mean_std([r["val_loss"] for r in results], ".3f")
        for n in (128, 256):
            assert row[f"ppl@{n}"] == mean_std([r["eval"][f"ppl/{n}"] for r in results], ".2f")
        assert row["params"] == f"{results[0]['params']['total']:,}"
        assert row["wall s"] == mean_std([r["wall_time_s"] for r in results], ".0f")
        assert row["key logprob"] == mean_std([r["eval"]["needle/logprob"] for r in results], ".2f")
        kl = mean_std([r["eval"]["shift/offset64/kl"] for r in results], ".3g")
        assert row["KL offset 64"] == kl


@pytest.mark.e2e
def test_csv_has_one_row_per_run_including_the_failed_one(report_dir: Path) -> None:
    with (report_dir / "runs.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 5
    assert sorted(r["status"] for r in rows) == ["failed"] + ["finished"] * 4
    failed = next(r for r in rows if r["status"] == "failed")
    assert failed["run"] == FAILED_RUN and failed["error"] == FAILED_ERROR and failed["encoding"] == "alibi"
    finished = [r for r in rows if r["status"] == "finished"]
    for column in ("seed", "val_loss", "tokens_per_s", "params/total", "ppl/256", "needle/acc"):
        assert all(r[column] != "" for r in finished), column


@pytest.mark.e2e
def test_failed_run_and_its_error_are_listed(report_dir: Path) -> None:
    failed_section = (report_dir / "report.md").read_text().split("## Failed runs", 1)[1]
    assert f"| {FAILED_RUN} | failed | alibi | {FAILED_ERROR} |" in failed_section


@pytest.mark.e2e
def test_report_names_commit_and_machine(runs_dir: Path, report_dir: Path) -> None:
    report = (report_dir / "report.md").read_text()
    result = finished_results(runs_dir, "alibi")[0]
    assert f"Git commit(s): `{result['git_commit']}` (5 runs)" in report
    assert result["machine"]["platform"] in report
    every = [json.loads(p.read_text()) for p in runs_dir.glob("*/*/results.json")]
    hours = sum(r["wall_time_s"] for r in every) / 3600
    assert f"Wall time: {hours:.2f} h summed over {len(every)} runs" in report


@pytest.mark.e2e
def test_every_plot_is_a_png(report_dir: Path) -> None:
    names = ["training_curves", "ppl_vs_length", "position_loss", "shift", "needle_alibi", "needle_nope"]
    for name in names:
        data = (report_dir / f"{name}.png").read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000, name
        assert f"![{name}.png]({name}.png)" in (report_dir / "report.md").read_text()


@pytest.mark.e2e
def test_training_curves_are_each_runs_validation_loss_from_metrics_jsonl(
    runs_dir: Path, report_dir: Path
) -> None:
    """runs.csv keeps each run's (step, val/loss) pairs as metrics.jsonl has them (tiny: steps 4 and 8)."""
    with (report_dir / "runs.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    finished = [r for r in rows if r["status"] == "finished"]
    assert len(finished) == 4
    for row in finished:
        lines = (runs_dir / "sweep" / row["run"] / "metrics.jsonl").read_text().splitlines()
        logged = [[r["step"], r["val/loss"]] for r in map(json.loads, lines) if "val/loss" in r]
        assert [step for step, _ in logged] == [4, 8]
        assert json.loads(row["val_loss_curve"]) == logged


@pytest.mark.e2e
def test_a_runs_csv_without_curves_renders_without_the_training_curve_plot(
    report_dir: Path, tmp_path: Path
) -> None:
    """A runs.csv written before the curves were kept: the plot is left out, the rest is drawn."""
    old = tmp_path / "old"
    old.mkdir()
    write_csv([replace(r, val_curve=[]) for r in load_csv(report_dir / "runs.csv")], old / "runs.csv")
    assert "val_loss_curve" not in (old / "runs.csv").read_text()
    assert main([str(old), "--out", str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert "training_curves" not in report and not (tmp_path / "out" / "training_curves.png").exists()
    assert "![ppl_vs_length.png](ppl_vs_length.png)" in report


@pytest.mark.e2e
def test_configs_are_copied(runs_dir: Path, report_dir: Path) -> None:
    copies = sorted(p.name for p in (report_dir / "configs").glob("*.yaml"))
    sources = sorted(runs_dir.glob("*/*/config.yaml"))
    assert copies == sorted(f"{p.parent.name}.yaml" for p in sources)
    for source in sources:
        assert (report_dir / "configs" / f"{source.parent.name}.yaml").read_text() == source.read_text()


@pytest.mark.e2e
def test_rerendering_from_runs_csv_gives_the_same_report(report_dir: Path, tmp_path: Path) -> None:
    assert main([str(report_dir), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "report.md").read_text() == (report_dir / "report.md").read_text()
    assert (tmp_path / "runs.csv").read_text() == (report_dir / "runs.csv").read_text()
    assert len(list((tmp_path / "configs").glob("*.yaml"))) == 5


@pytest.mark.parametrize("sub", ["empty", "missing"])
def test_a_path_without_runs_is_a_clear_error(
    sub: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty" / "configs").mkdir(parents=True)
    path = tmp_path / sub
    assert main([str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(path) in err
    assert ("does not exist" if sub == "missing" else "no run directories") in err
    assert not (tmp_path / "out").exists()


def record(encoding: str, seed: int, metrics: dict[str, float], **config: str) -> RunRecord:
    return RunRecord(
        name=f"{encoding}-{seed}-{sorted(config.items())}",
        status="finished",
        error="",
        encoding=encoding,
        seed=seed,
        study="ablation",
        info={},
        config={"seed": str(seed), "data.cache_dir": f"/tmp/{seed}", **config},
        metrics=metrics,
        series={},
    )


def test_swept_values_make_rows_and_cells_follow_the_seeds() -> None:
    """Rows split by swept values (not by seed, paths or encoding-specific keys); n=1: no ±."""
    runs = [
        record("multiscale", 0, {"val_loss": 1.0}, **{"data.anchors": "true", "encoding.hidden": "64"}),
        record(
            "multiscale",
            1,
            {"val_loss": 2.0, "tokens_per_s": 99.6},
            **{"data.anchors": "true", "encoding.hidden": "64"},
        ),
        record("multiscale", 0, {"val_loss": 3.0}, **{"data.anchors": "false", "encoding.hidden": "64"}),
        record("rope", 0, {"val_loss": 4.0}, **{"data.anchors": "true", "encoding.base": "10000"}),
    ]
    rows = group_rows(runs)["ablation"]
    assert [r.label for r in rows] == [
        "multiscale, data.anchors=false",
        "multiscale, data.anchors=true",
        "rope",  # anchors are swept for multiscale only; rope ran with the value every other run has
    ]
    lines = study_table(rows)
    assert lines[0] == "| encoding, swept values | seeds n | params | tokens/s | wall s | val loss |"
    assert lines[2] == "| multiscale, data.anchors=false | 1 | — | — | — | 3.000 |"
    assert lines[3] == "| multiscale, data.anchors=true | 2 | — | 100 (n=1) | — | 1.500 ± 0.707 |"


def metric(row: Row, key: str) -> list[float]:
    """The value of one metric in each run of the row that has it."""
    return [r.metrics[key] for r in row.runs if key in r.metrics]


def test_rope_scalings_become_rows_of_their_own() -> None:
    run = RunRecord(
        name="rope-run",
        status="finished",
        error="",
        encoding="rope",
        seed=0,
        study="s",
        info={},
        config={"encoding.name": "rope", "train.seq_len": "64"},
        metrics={"ppl/64": 5.0, "ppl/128": 9.0, "ppl@pi/128": 7.0, "needle/acc@128": 0.5},
        series={"position_loss/128": [1.0], "position_loss@pi/128": [0.5]},
    )
    rows = {row.label: row for row in group_rows([run])["s"]}
    assert set(rows) == {"rope", "rope + pi"}
    assert metric(rows["rope"], "ppl/128") == [9.0] and metric(rows["rope + pi"], "ppl/128") == [7.0]
    assert metric(rows["rope + pi"], "ppl/64") == [5.0]  # within the training length: unscaled
    assert metric(rows["rope"], "needle/acc@128") == [0.5]
    assert metric(rows["rope + pi"], "needle/acc@128") == []  # not measured under pi: blank, not rope's
    assert rows["rope + pi"].runs[0].series["position_loss/128"] == [0.5]


def run_with_encoding(root: Path, name: str, encoding: dict[str, Any], **nodes: Any) -> RunRecord:
    """A finished run directory whose config has this encoding node (and `nodes`: seed, data, ...), read
    back as the report reads it."""
    run = root / name
    run.mkdir()
    config = {"experiment": "s", "seed": 0, "encoding": encoding, **nodes}
    (run / "config.yaml").write_text(json.dumps(config))
    (run / "results.json").write_text(json.dumps({"status": "finished", "encoding": encoding["name"]}))
    return load_run(run)


def yaml_node(encoding: str, **options: Any) -> dict[str, Any]:
    """The node a run composed today has: conf/encoding/<encoding>.yaml and `options`."""
    node = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "encoding" / f"{encoding}.yaml"))
    assert isinstance(node, dict)
    return {**node, **options}


def test_a_run_made_before_an_option_existed_gets_what_it_ran(tmp_path: Path) -> None:
    """A multiscale run from before `clamp` ran without one (`clamp: null`, not today's default `train`):
    it shares the row of the unclamped runs, today's default runs share the clamped row; an old rope run
    (its options unchanged since) shares its row with a new one."""
    old = {k: v for k, v in yaml_node("multiscale").items() if k != "clamp"}
    old_run = run_with_encoding(tmp_path, "multiscale-old", old)
    new_run = run_with_encoding(tmp_path, "multiscale-new", yaml_node("multiscale"))
    unclamped = run_with_encoding(tmp_path, "multiscale-unclamped", yaml_node("multiscale", clamp=None))
    assert old_run.config["encoding.clamp"] == unclamped.config["encoding.clamp"] == "null"
    assert new_run.config["encoding.clamp"] == "train"
    old_rope = run_with_encoding(tmp_path, "rope-old", {"name": "rope", "base": 10000.0})
    new_rope = run_with_encoding(tmp_path, "rope-new", yaml_node("rope"))
    rows = {
        row.label: sorted(r.name for r in row.runs)
        for row in group_rows([old_run, new_run, unclamped, old_rope, new_rope])["s"]
    }
    assert rows == {
        "multiscale, encoding.clamp=null": ["multiscale-old", "multiscale-unclamped"],
        "multiscale, encoding.clamp=train": ["multiscale-new"],
        "rope": ["rope-new", "rope-old"],
    }


def test_a_setting_fixed_per_encoding_but_different_between_them_stays_in_the_labels() -> None:
    runs = [record("alibi", 0, {"val_loss": 1.0}, **{"train.lr": "0.001"}),
            record("rope", 0, {"val_loss": 2.0}, **{"train.lr": "0.003"})]  # fmt: skip
    labels = [r.label for r in group_rows(runs)["ablation"]]
    assert labels == ["alibi, train.lr=0.001", "rope, train.lr=0.003"]


def test_curve_band_is_mean_min_and_max_over_the_seeds_at_each_step() -> None:
    band = curve_band([[(10, 2.0), (20, 1.0)], [(20, 3.0), (10, 4.0), (30, 0.5)]])
    assert band.index.tolist() == [10, 20, 30]
    assert band["mean"].tolist() == [3.0, 2.0, 0.5]  # step 30: the one run that logged it
    assert band["min"].tolist() == [2.0, 1.0, 0.5]
    assert band["max"].tolist() == [4.0, 3.0, 0.5]


def test_training_curves_plot_one_line_per_trained_row(tmp_path: Path) -> None:
    """A RoPE scaling view trained as its run did: no line of its own; no curve at all: no plot."""
    runs = [
        replace(
            record("rope", seed, {"ppl/64": 5.0, "ppl@pi/64": 4.0}), val_curve=[(4, 3.0 - seed), (8, 2.0)]
        )
        for seed in (0, 1)
    ]
    rows = {row.label: row for row in group_rows(runs)["ablation"]}
    assert set(rows) == {"rope", "rope + pi"} and set(trained_rows(rows)) == {"rope"}
    path = plot_training_curves(rows, tmp_path / "curves.png")
    assert path is not None and path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    untrained = {row.label: row for row in group_rows([record("rope", 0, {"ppl/64": 5.0})])["ablation"]}
    assert plot_training_curves(untrained, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_every_row_of_a_panel_has_its_colour_the_first_variant_its_encodings() -> None:
    runs = [
        record("multiscale", 0, {"ppl/64": 5.0}, **{"data.anchors": "false"}),
        record("multiscale", 0, {"ppl/64": 5.0}, **{"data.anchors": "true"}),
        record("rope", 0, {"ppl/64": 5.0, "ppl@pi/64": 4.0}, **{"data.anchors": "true"}),
        record("alibi", 0, {"ppl/64": 5.0}, **{"data.anchors": "true"}),
    ]
    rows = {row.label: row for row in group_rows(runs)["ablation"]}
    styles = line_styles(rows)
    assert len({styles[label]["color"] for label in rows}) == len(rows) == 5
    for one, other in (
        ("multiscale, data.anchors=false", "multiscale, data.anchors=true"),
        ("rope", "rope + pi"),
    ):
        assert styles[one]["linestyle"] != styles[other]["linestyle"], (one, other)
    own = line_styles({label: rows[label] for label in ("alibi", "multiscale, data.anchors=false", "rope")})
    for label, style in own.items():  # the first variant of an encoding: the encoding's colour
        assert styles[label]["color"] == style["color"], label
    assert styles["alibi"]["linestyle"] == styles["rope"]["linestyle"] == "-"  # no variant: solid
    alone = line_styles({"rope": rows["rope"]})  # an encoding keeps its colour in another report
    assert alone["rope"]["color"] == styles["rope"]["color"]


def test_a_label_names_a_task_and_leaves_out_the_lengths_it_sets_unless_one_task_varies_them() -> None:
    def task_run(task: str, seed: int, lengths: str, seq_len: str, lr: str = "0.001") -> RunRecord:
        keys = {"data.task.name": task, "data.task.train_lengths": lengths, "data.task.seq_len": seq_len}
        return record("nope", seed, {"val_loss": 1.0}, **keys, **{"train.seq_len": seq_len, "train.lr": lr})

    runs = [task_run("copy", 0, "[1, 20]", "42"), task_run("copy", 1, "[1, 20]", "42")]
    runs += [task_run("reverse", 0, "[1, 20]", "42"), task_run("parity", 0, "[1, 8]", "11", "0.003")]
    labels = [row.label for row in group_rows(runs)["ablation"]]
    assert labels == [
        "nope, data.task.name=copy, train.lr=0.001",
        "nope, data.task.name=parity, train.lr=0.003",  # a setting the task does not set stays
        "nope, data.task.name=reverse, train.lr=0.001",
    ]
    runs.append(task_run("copy", 0, "[1, 10]", "22"))  # copy at two training ranges: its lengths show
    labels = [row.label for row in group_rows(runs)["ablation"]]
    lengths = "data.task.seq_len=22, data.task.train_lengths=[1, 10], train.lr=0.001, train.seq_len=22"
    assert f"nope, data.task.name=copy, {lengths}" in labels and len(labels) == 4


def clashing_names(count: int) -> list[str]:
    """`count` names of no configured encoding whose hashes give them one palette colour."""
    by_colour: dict[tuple[float, ...], list[str]] = {}
    for i in itertools.count():
        names = by_colour.setdefault(stable_colour(f"new{i}"), [])
        names.append(f"new{i}")
        if len(names) == count:
            return names
    raise AssertionError("unreachable")


def test_an_encoding_s_colour_does_not_depend_on_which_other_encodings_exist() -> None:
    """Declared for the encodings conf/encoding/ had when the palette was set (each its own), hashed for
    any other; adding five encodings moves no declared encoding's colour, and an encoding alone has its
    own colour, wherever the report runs."""
    declared = sorted(ENCODING_COLOURS)
    assert len(set(ENCODING_COLOURS.values())) == len(declared)
    assert all(0 <= index < len(PALETTE) for index in ENCODING_COLOURS.values())
    alone = {name: encoding_colours([name])[name] for name in declared}
    added = [*encoding_names(), *declared, "halved_alibi", "p_rope", "fox_bias", "zz_new", "aa_new"]
    assert {name: encoding_colours(added)[name] for name in declared} == alone
    for name in encoding_names():
        assert encoding_colours([name])[name] == stable_colour(name)


def test_two_encodings_that_hash_to_one_colour_get_two_in_a_panel() -> None:
    """Hashes can meet: the later (by name) of two such encodings takes a spare, in a panel and in
    encoding_colours; each keeps its own colour where it is alone."""
    first, second = clashing_names(2)
    both = encoding_colours([second, first])
    assert both[first] == stable_colour(first) and both[second] != stable_colour(first)
    assert encoding_colours([second])[second] == stable_colour(second)
    rows = {
        row.label: row
        for row in group_rows([record(e, 0, {"ppl/64": 5.0}) for e in (first, second)])["ablation"]
    }
    styles = line_styles(rows)
    assert styles[first]["color"] == stable_colour(first)
    assert styles[second]["color"] != styles[first]["color"]


def test_an_option_every_encoding_has_is_compared_across_encodings() -> None:
    """lr_mult is fixed per encoding (10 for multiscale, 1.0 for alibi) but is one setting for all: it labels
    both rows, as train.lr would; an encoding-specific option fixed per encoding labels none."""
    runs = [
        record("alibi", 0, {"val_loss": 1.0}, **{"encoding.lr_mult": "1.0", "encoding.slopes": "geometric"}),
        record("multiscale", 0, {"val_loss": 2.0}, **{"encoding.lr_mult": "10", "encoding.hidden": "64"}),
    ]
    labels = [r.label for r in group_rows(runs)["ablation"]]
    assert labels == ["alibi, encoding.lr_mult=1.0", "multiscale, encoding.lr_mult=10"]


def test_measurement_switches_make_no_label_but_a_row_never_mixes_them(tmp_path: Path) -> None:
    """passkey.enabled and eval.needle.enabled change only what is measured after training; a row of runs
    with different values would average needle numbers of different models: refused, naming both."""
    staged = record("alibi", 0, {"val_loss": 1.0}, **{"passkey.enabled": "true"})
    plain = record("rope", 0, {"val_loss": 2.0}, **{"passkey.enabled": "false"})
    assert [r.label for r in group_rows([staged, plain])["ablation"]] == ["alibi", "rope"]
    other_seed = record("alibi", 1, {"val_loss": 1.5}, **{"passkey.enabled": "false"})
    with pytest.raises(ReportError, match=r"row 'alibi' .* passkey.enabled=false and true"):
        group_rows([staged, other_seed])
    write_csv([staged, plain], tmp_path / "runs.csv")  # kept, so that rows read back are checked too
    assert [r.config["passkey.enabled"] for r in load_csv(tmp_path / "runs.csv")] == ["true", "false"]


def test_a_run_without_needle_numbers_joins_a_row_of_staged_runs() -> None:
    """A later seed run as a language model only (no passkey stage, no needle grid) has no needle number
    to mix: it joins the row; its needle cells count only the staged runs."""
    staged = record("alibi", 0, {"val_loss": 1.0, "needle/acc@512": 1.0}, **{"passkey.enabled": "true"})
    lm_only = record(
        "alibi", 1, {"val_loss": 1.5}, **{"passkey.enabled": "false", "eval.needle.enabled": "false"}
    )
    (row,) = group_rows([staged, lm_only])["ablation"]
    assert [r.seed for r in row.runs] == [0, 1]
    measured_plain = record("alibi", 2, {"needle/acc@512": 0.1}, **{"passkey.enabled": "false"})
    with pytest.raises(ReportError, match="passkey.enabled=false and true"):
        group_rows([staged, lm_only, measured_plain])


def test_a_key_constant_in_a_report_folder_still_labels_the_runs_folded_into_it(tmp_path: Path) -> None:
    """runs.csv keeps only the keys its own runs sweep; read back, each run gets its whole config from
    configs/, so a later run with the other value of that key makes a row of its own, not a mixed one."""
    on = {"data": {"anchors": True}}
    kept = [
        run_with_encoding(tmp_path, f"on{seed}", {"name": "multiscale"}, seed=seed, **on) for seed in (0, 1)
    ]
    folder = tmp_path / "report"
    folder.mkdir()
    write_csv(kept, folder / "runs.csv")
    copy_configs(kept, folder / "configs")
    assert "config.data.anchors" not in (folder / "runs.csv").read_text()  # constant among these runs
    later = run_with_encoding(tmp_path, "off0", {"name": "multiscale"}, data={"anchors": False})
    folded = group_rows([*load_csv(folder / "runs.csv"), later])["s"]
    rows = {row.label: sorted(r.name for r in row.runs) for row in folded}
    assert rows == {
        "multiscale, data.anchors=false": ["off0"],
        "multiscale, data.anchors=true": ["on0", "on1"],
    }


def test_away_from_the_checkout_no_option_is_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without conf/ (a report rendered from runs.csv elsewhere) the shared options are none, not an error."""
    import posab.report.grouping as grouping

    def no_conf() -> list[str]:
        raise grouping.ConfigError("no posab config folder")

    monkeypatch.setattr(grouping, "encoding_names", no_conf)
    assert grouping.shared_encoding_options.__wrapped__() == frozenset()  # uncached: the cache stays true
