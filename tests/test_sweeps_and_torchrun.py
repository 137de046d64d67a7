"""Multirun sweeps, the grids sweeper, experiment presets, launcher configs and torchrun data parallelism."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf

from conftest import (
    CONF,
    ENCODINGS,
    ROOT,
    isolated_env,
    preset_grids,
    preset_jobs,
    run_train,
    tiny_model,
    typed_config,
)
from hydra_plugins.posab_grid_sweeper.grid_sweeper import expand_grids
from posab.sweep_lists import sweep_order


def losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["train/loss"] for r in rows if "train/loss" in r]


def logged_lines(run: Path) -> list[tuple[int, list[str]]]:
    """(step, sorted keys) of each line of metrics.jsonl, in order."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], sorted(r)) for r in rows]


@pytest.mark.e2e
def test_torchrun_two_processes_match_one_process(tmp_path: Path) -> None:
    """gloo, 2 CPU processes, the same global batch: the same loss curve, one set of outputs."""
    common = ["+experiment=tiny", "logger=jsonl", f"data.cache_dir={tmp_path / 'cache'}",
              "train.precision=fp32", "train.steps=6", "train.log_every=1", "train.batch_size=4"]  # fmt: skip
    single = run_train([*common, f"hydra.run.dir={tmp_path / 'single'}"])
    assert single.returncode == 0, single.stderr[-2000:]
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [str(torchrun), "--nproc_per_node=2", "--standalone", str(ROOT / "train.py"), *common,
           f"hydra.run.dir={tmp_path / 'ddp'}"]  # fmt: skip
    ddp = subprocess.run(cmd, cwd=ROOT, env=isolated_env(), capture_output=True, text=True, timeout=300)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert losses(tmp_path / "ddp") == pytest.approx(losses(tmp_path / "single"), rel=1e-4)
    results = json.loads((tmp_path / "ddp" / "results.json").read_text())
    assert results["status"] == "finished" and results["world_size"] == 2
    # rank 0 alone logged: the lines (step and keys) one process writes, each once, no rank's echo
    assert logged_lines(tmp_path / "ddp") == logged_lines(tmp_path / "single")
    assert len(losses(tmp_path / "ddp")) == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "ddp", "single"]


@pytest.mark.e2e
def test_torchrun_world_size_must_divide_the_batch(tmp_path: Path) -> None:
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [str(torchrun), "--nproc_per_node=2", "--standalone", str(ROOT / "train.py"), "+experiment=tiny",
           "logger=jsonl", "train.batch_size=3", f"hydra.run.dir={tmp_path / 'run'}",
           f"data.cache_dir={tmp_path / 'cache'}"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=isolated_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "train.batch_size=3 is not divisible by the torchrun world size 2" in proc.stderr


@pytest.mark.e2e
def test_multirun_gives_one_directory_and_result_per_job_and_keeps_going_after_a_failure(
    tmp_path: Path,
) -> None:
    sweep = tmp_path / "sweep"
    proc = run_train(["-m", "+experiment=tiny", "logger=jsonl", "encoding=nope,alibi", "train.lr=-1,0.003",
                      f"hydra.sweep.dir={sweep}", f"data.cache_dir={tmp_path / 'cache'}"])  # fmt: skip
    assert proc.returncode != 0  # Hydra reports the failed jobs at the end
    runs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(runs) == 4
    statuses = {p.name: json.loads((p / "results.json").read_text())["status"] for p in runs}
    assert sorted(statuses.values()) == ["failed", "failed", "finished", "finished"]
    for name, status in statuses.items():
        assert (status == "failed") == ("train.lr=-1" in name)


def swept_encodings(name: str) -> list[str]:
    """The encodings an experiment preset sweeps: its `hydra.sweeper.params`, or the union of its grids."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"+experiment={name}"], return_hydra_config=True)
    sweeper = cfg.hydra.sweeper
    grids = sweeper.grids if "grids" in sweeper else [sweeper.get("params") or {}]
    return [e for grid in grids if "encoding" in grid for e in str(grid["encoding"]).split(",")]


EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
STUDY_CORE = {"nope", "sinusoidal", "alibi", "rope", "multiscale", "hierarchical"}  # issue 17's six
# the ten encodings of the reference study's tuning and main grid (DAPE came later: study_dape.yaml)
STUDY_TEN = sorted(STUDY_CORE | {"learned", "t5", "fire", "kerple"})
EVERY_ENCODING = re.compile(r"\b(every|all|each) encodings?\b", re.IGNORECASE)


def claims_every_encoding(name: str) -> bool:
    """The preset's header comment says it covers every (all, each) encoding."""
    lines = (CONF / "experiment" / f"{name}.yaml").read_text().splitlines()
    header = " ".join(line.lstrip("# ") for line in lines if line.startswith("#"))
    return EVERY_ENCODING.search(header) is not None


def test_every_experiment_grid_is_a_sweep_over_existing_options() -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for name in ("encodings", "anchors", "tiny_grid"):
            cfg = compose("config", overrides=[f"+experiment={name}"], return_hydra_config=True)
            params = cfg.hydra.sweeper.params
            assert "seed" in params
    for name in EXPERIMENTS:
        for encoding in swept_encodings(name):
            assert (CONF / "encoding" / f"{encoding}.yaml").is_file(), (name, encoding)


def test_the_comment_test_finds_the_presets_that_claim_every_encoding() -> None:
    assert {n for n in EXPERIMENTS if claims_every_encoding(n)} >= {"encodings", "tiny_grid", "tune_lr"}
    assert not claims_every_encoding("anchors") and not claims_every_encoding("needle")


@pytest.mark.parametrize("name", [n for n in EXPERIMENTS if claims_every_encoding(n)])
def test_a_preset_that_says_every_encoding_sweeps_every_encoding_file(name: str) -> None:
    """Such a preset sweeps `${posab_encodings:}` (posab.sweep_lists): every conf/encoding/*.yaml, the
    ones the presets once listed by hand first, in that order (their jobs keep their numbers), then any
    later one by name."""
    jobs = preset_jobs(name)
    swept = list(dict.fromkeys(o.split("=", 1)[1] for job in jobs for o in job if o.startswith("encoding=")))
    assert sorted(swept) == ENCODINGS, f"{name} misses {sorted(set(ENCODINGS) - set(swept))}"
    assert swept == sweep_order(ENCODINGS)


@pytest.mark.parametrize(
    ("launcher", "target"), [("local_parallel", "JoblibLauncher"), ("slurm", "SlurmLauncher")]
)
def test_launchers_compose(launcher: str, target: str) -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith(target)
    if launcher == "slurm":
        assert cfg.hydra.launcher.gpus_per_node == 1 and cfg.hydra.launcher.timeout_min > 0
    else:
        assert cfg.hydra.launcher.n_jobs == 2


def test_the_pg_books_study_covers_every_encoding_x_3_seeds_and_its_ablations() -> None:
    jobs = preset_jobs("pg_books_cpu", ["data.path=books"])
    every_encoding = set(STUDY_TEN)  # the ten encodings of its time
    main = [job for job in jobs if not any(o.startswith(("data.anchors=", "encoding.")) for o in job)]
    ablation = [job for job in jobs if "data.anchors=False" in job]
    forms = [job for job in jobs if any(o.startswith("encoding.form=") for o in job)]
    assert len(jobs) == len(main) + len(ablation) + len(forms) == 3 * len(every_encoding) + 6 + 6
    assert {o for job in forms for o in job if o.startswith("encoding")} == {
        "encoding=sinusoidal", "encoding.form=paper", "encoding.form=unscaled"}  # fmt: skip
    assert {o.split("=")[1] for job in main for o in job if o.startswith("encoding=")} == every_encoding
    assert {o for job in ablation for o in job if o.startswith("encoding=")} == {
        "encoding=multiscale", "encoding=hierarchical"}  # fmt: skip
    assert all("data.path=books" in job for job in jobs)
    assert [o for o in jobs[0] if o.startswith("seed=")] == ["seed=0"]  # seed outermost: whole seeds first


def test_tune_lr_gives_every_encoding_the_same_lr_grid_and_lr_mult_where_it_has_parameters() -> None:
    jobs = preset_jobs("tune_lr")
    settings: dict[str, set[tuple[str, str]]] = {}  # encoding -> {(train.lr, encoding.lr_mult)}
    for job in jobs:
        values = dict(o.split("=", 1) for o in job)
        setting = (values["train.lr"], values.get("encoding.lr_mult", "1"))
        settings.setdefault(values["encoding"], set()).add(setting)
    assert set(settings) == set(ENCODINGS)
    lrs = {lr for grid in settings.values() for lr, _ in grid}
    assert len(lrs) >= 3 and all({lr for lr, _ in grid} == lrs for grid in settings.values())  # equal effort
    mults = {m for grid in settings.values() for _, m in grid}
    has_parameters = {n for n in ENCODINGS if sum(p.numel() for p in tiny_model(n).encoding.parameters()) > 0}
    assert {n for n, grid in settings.items() if len(grid) > len(lrs)} == has_parameters
    for name in has_parameters:  # the full product: every lr_mult at every lr
        assert settings[name] == {(lr, m) for lr in lrs for m in mults}
    assert (
        len(jobs)
        == len({tuple(sorted(job)) for job in jobs})
        == len(lrs) * (len(ENCODINGS) + (len(mults) - 1) * len(has_parameters))
    )


def test_grid_sweeper_drops_a_job_an_earlier_grid_has() -> None:
    jobs = preset_jobs("pg_books_cpu", ["data.anchors=false"])
    assert len(jobs) == 36 and len({tuple(sorted(job)) for job in jobs}) == 36


def test_a_command_line_value_of_a_key_a_grid_sets_selects_among_its_values() -> None:
    """`encoding=t5,fire seed=0` keeps those two grids of study_main at seed 0, each at its own lr and
    lr_mult; a key no grid sets applies to every job; a value no grid has is an error naming it."""
    parser = OverridesParser.create()
    grids = preset_grids("study_main")
    command_line = parser.parse_overrides(["encoding=t5,fire", "seed=0", "train.steps=5"])
    jobs = [dict(o.split("=", 1) for o in job) for job in expand_grids(grids, command_line, parser)]
    assert [job["encoding"] for job in jobs] == ["t5", "fire"]
    own = {grid["encoding"]: str(grid["train.lr"]) for grid in grids}
    assert all(job["train.lr"] == own[job["encoding"]] and job["seed"] == "0" for job in jobs)
    assert all(job["train.steps"] == "5" for job in jobs)
    same_lr = expand_grids(grids, parser.parse_overrides(["train.lr=3e-3", "seed=2"]), parser)  # == 0.003
    assert {dict(o.split("=", 1) for o in job)["encoding"] for job in same_lr} == {
        grid["encoding"] for grid in grids if float(grid["train.lr"]) == 3e-3
    }
    with pytest.raises(HydraException, match=r"matches the command line: train.lr=0.01"):
        preset_jobs("study_tune", ["train.lr=0.01"])


@pytest.mark.e2e
def test_grid_sweeper_runs_the_union_of_its_grids(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    grids = "[{encoding: 'nope,alibi', seed: 0}, {encoding: alibi, seed: '0,1'}]"
    proc = run_train(["-m", "+experiment=tiny", "logger=jsonl", "hydra/sweeper=grids",
                      f"hydra.sweeper.grids={grids}", "train.steps=3", f"hydra.sweep.dir={sweep}",
                      f"data.cache_dir={tmp_path / 'cache'}"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name.split("_", 1)[1] for p in runs] == [
        "encoding=nope,seed=0,train.steps=3", "encoding=alibi,seed=0,train.steps=3",
        "encoding=alibi,seed=1,train.steps=3"]  # fmt: skip
    for run in runs:
        results = json.loads((run / "results.json").read_text())
        assert results["status"] == "finished" and OmegaConf.load(run / "config.yaml").train.steps == 3


@pytest.mark.e2e
def test_grid_sweeper_without_grids_says_what_it_needs(tmp_path: Path) -> None:
    proc = run_train(["-m", "+experiment=tiny", "logger=jsonl", "hydra/sweeper=grids",
                      f"hydra.sweep.dir={tmp_path / 'sweep'}"])  # fmt: skip
    assert proc.returncode != 0
    assert "hydra.sweeper.grids" in proc.stderr


def test_the_main_study_runs_every_encoding_x_5_seeds_at_its_tuned_picks() -> None:
    """study_main's grids are part 2's picks (results/study/tuning/picks.csv), every encoding x seeds 0-4,
    the passkey stage and needle grid for the six core encodings only; each job is a valid config."""
    with (ROOT / "results" / "study" / "tuning" / "picks.csv").open() as file:
        picks = {row["encoding"]: row for row in csv.DictReader(file)}
    parser = OverridesParser.create()
    grids = preset_grids("study_main")
    jobs = [dict(o.split("=", 1) for o in job) for job in expand_grids(grids, [], parser)]
    assert sorted({job["encoding"] for job in jobs}) == sorted(picks) == STUDY_TEN
    assert set(STUDY_TEN) <= set(ENCODINGS)
    for job in jobs:
        pick = picks[job["encoding"]]
        assert float(job["train.lr"]) == float(pick["lr"])
        assert float(job.get("encoding.lr_mult", 1)) == float(pick["lr_mult"])
        staged = job["encoding"] in STUDY_CORE
        assert job.get("passkey.enabled", "False") == job.get("eval.needle.enabled", "False") == str(staged)
    assert sorted(job["seed"] for job in jobs) == sorted(["0", "1", "2", "3", "4"] * len(STUDY_TEN))
    one_seed = preset_jobs("study_main", ["seed=1"])
    assert len(one_seed) == len(STUDY_TEN)  # `seed=N` on the command line: one seed per sweep
    for job in one_seed:
        cfg = typed_config(["+experiment=study_main", *job])
        assert cfg.train.steps == 1000 and cfg.eval.split == "test" and cfg.seed == 1


def main_grid_jobs() -> dict[str, dict[str, str]]:
    """study_main's seed-0 job of each encoding, as {key: value}."""
    jobs = preset_jobs("study_main", ["seed=0"])
    return {job["encoding"]: job for job in (dict(o.split("=", 1) for o in j) for j in jobs)}


def test_the_structure_ablation_completes_the_main_grids_arms_at_their_picks() -> None:
    """Part 5: hierarchical levels x anchors and multiscale anchors off, seeds 0 and 1, each at the main
    grid's picks for its encoding; with the main grid's own runs (all levels, anchors on) the arms are
    complete, and the runs join the main study, so they are paired with those runs."""
    jobs = [dict(o.split("=", 1) for o in j) for j in preset_jobs("study_structure")]
    main = main_grid_jobs()
    arms = {(j["encoding"], j.get("encoding.levels", ""), j["data.anchors"]) for j in jobs}
    levels = ("[token]", "[token,sentence]", "[token,sentence,paragraph]")
    expected = {("hierarchical", lv, a) for lv in levels for a in ("True", "False")}
    expected |= {("multiscale", "", "False"), ("multiscale", "", "True")}
    assert arms | {("hierarchical", levels[2], "True"), ("multiscale", "", "True")} == expected
    assert len(arms) == len(expected) - 2  # the main grid's arms are not run again
    assert sorted(j["seed"] for j in jobs) == sorted(["0", "1"] * len(arms))
    for job in jobs:
        for key in ("train.lr", "encoding.lr_mult"):
            assert float(job[key]) == float(main[job["encoding"]][key])
    cfg = typed_config(["+experiment=study_structure", *(f"{k}={v}" for k, v in jobs[0].items())])
    assert (cfg.logger.group, cfg.experiment, cfg.train.steps, cfg.eval.split) == (
        "study_main",
        "study_structure",
        1000,
        "test",
    )
    assert cfg.encoding["levels"] == ["token"] and cfg.data.anchors is True


def test_the_extrapolation_ablation_varies_one_option_of_the_main_grids_multiscale_row() -> None:
    """Issue 28, part 2: five arms x seeds 0-4, each the main grid's multiscale job with one option changed,
    joining the main study so that each is paired with the main grid's multiscale and ALiBi runs; and the
    clamp on the hierarchical bias's token level, seeds 0-2, at the main grid's hierarchical picks."""
    every = [dict(o.split("=", 1) for o in j) for j in preset_jobs("study_extrapolation")]
    jobs = [j for j in every if j["encoding"] == "multiscale"]
    hierarchical = [j for j in every if j["encoding"] == "hierarchical"]
    assert sorted(j["seed"] for j in hierarchical) == ["0", "1", "2"]
    for job in hierarchical:
        picks = main_grid_jobs()["hierarchical"]
        assert job["encoding.clamp"] == "train" and job["train.lr"] == picks["train.lr"]
        assert job["encoding.lr_mult"] == picks["encoding.lr_mult"]
    main = main_grid_jobs()["multiscale"]  # the note's form: clamp null (the default clamps since part 8)
    assert main["encoding.clamp"] == "null"
    kept = {k: v for k, v in main.items() if k not in ("seed", "passkey.enabled", "eval.needle.enabled")}
    arms = sorted(
        {tuple(sorted((k, v) for k, v in j.items() if k != "seed" and kept.get(k) != v)) for j in jobs}
    )
    assert arms == [
        (("encoding.clamp", "train"),),
        (("encoding.input", "fire"),),
        (("encoding.input", "log"),),
        (("encoding.max_dist", "512"),),
        (("train.precision", "fp32"),),
    ]
    assert sorted(j["seed"] for j in jobs) == sorted([str(s) for s in range(5)] * len(arms))
    for job in jobs:  # the main grid's job with one option changed, the language model only
        changed = {k for k in job if k != "seed" and kept.get(k) != job[k]}
        assert len(changed) == 1 and all(job.get(k) == v for k, v in kept.items() if k not in changed), job
    cfg = typed_config(["+experiment=study_extrapolation", *(f"{k}={v}" for k, v in jobs[-1].items())])
    assert (cfg.logger.group, cfg.train.steps, cfg.eval.split, cfg.eval.extrapolation.enabled) == (
        "study_main",
        1000,
        "test",
        True,
    )
    assert cfg.encoding["clamp"] == "train" and not cfg.passkey.enabled


def test_the_dape_rows_run_at_their_bases_picks_and_join_the_main_study() -> None:
    """Issue 28, part 3: DAPE on ALiBi and on the multi-scale bias, seeds 0-2, each at its base's main-grid
    rate and lr_mult (DAPE was not tuned), paired with the main grid's runs (logger.group study_main)."""
    jobs = [dict(o.split("=", 1) for o in j) for j in preset_jobs("study_dape")]
    main = main_grid_jobs()
    assert sorted((j["encoding"], j["seed"]) for j in jobs) == [
        (e, s) for e in ("dape_alibi", "dape_multiscale") for s in "012"
    ]
    for job in jobs:
        base = main[job["encoding"].removeprefix("dape_")]
        assert float(job["train.lr"]) == float(base["train.lr"])
        assert float(job["encoding.lr_mult"]) == float(base.get("encoding.lr_mult", 1.0))
    cfg = typed_config(["+experiment=study_dape", *(f"{k}={v}" for k, v in jobs[-1].items())])
    assert (cfg.logger.group, cfg.train.steps, cfg.eval.split, cfg.eval.extrapolation.enabled) == (
        "study_main",
        1000,
        "test",
        True,
    )
    assert cfg.encoding["base"]["max_dist"] == 4096 and not cfg.passkey.enabled


def test_the_subword_arm_runs_the_core_encodings_with_bpe_at_their_picks() -> None:
    jobs = [dict(o.split("=", 1) for o in j) for j in preset_jobs("study_bpe")]
    main = main_grid_jobs()
    assert sorted(j["encoding"] for j in jobs) == sorted(STUDY_CORE) and {j["seed"] for j in jobs} == {"0"}
    for job in jobs:
        assert float(job["train.lr"]) == float(main[job["encoding"]]["train.lr"])
        assert float(job.get("encoding.lr_mult", 1)) == float(
            main[job["encoding"]].get("encoding.lr_mult", 1)
        )
        cfg = typed_config(["+experiment=study_bpe", *(f"{k}={v}" for k, v in job.items())])
        assert (cfg.data.tokenizer, cfg.data.vocab_size, cfg.train.steps, cfg.eval.split) == (
            "bpe",
            4096,
            1000,
            "test",
        )
        assert not cfg.passkey.enabled


def test_the_frontier_part_runs_each_encoding_at_its_committed_picks_beside_the_three_references() -> None:
    """Issue 43, part 10: the frontier encodings at results/study/tuning_frontier/picks.csv, RoPE and ALiBi at
    their part-2 picks and the clamped multi-scale bias at the multi-scale bias's, seeds 0-4, under one
    experiment (the claims' selectors), randomized positions scored sampled as they were tuned."""
    jobs = [dict(o.split("=", 1) for o in j) for j in preset_jobs("study_frontier")]
    path = ROOT / "results" / "study" / "tuning_frontier" / "picks.csv"
    picks = {row["encoding"]: row for row in csv.DictReader(path.open())}
    main = main_grid_jobs()
    references = {"rope", "alibi", "multiscale"}
    assert sorted((j["encoding"], j["seed"]) for j in jobs) == sorted(
        (e, str(s)) for e in {*picks, *references} for s in range(5)
    )
    for job in jobs:
        pick = picks.get(job["encoding"]) or main[job["encoding"]]
        assert float(job["train.lr"]) == float(pick.get("lr", pick.get("train.lr")))
        assert float(job.get("encoding.lr_mult", 1.0)) == float(
            pick.get("lr_mult", pick.get("encoding.lr_mult", 1.0))
        )
        assert (job.get("encoding.eval_positions") == "sampled") == job["encoding"].startswith("randomized_")
        assert (job.get("encoding.clamp") == "train") == (job["encoding"] == "multiscale")
    cfg = typed_config(["+experiment=study_frontier", *(f"{k}={v}" for k, v in jobs[-1].items())])
    assert (cfg.experiment, cfg.train.steps, cfg.eval.split, cfg.eval.extrapolation.enabled) == (
        "study_frontier", 1000, "test", True
    )  # fmt: skip
    assert [c.name for c in cfg.eval.corpora] == ["wikitext2", "pgbooks_test"] and not cfg.passkey.enabled


TUNED = ("results/study/tuning/picks.csv", "results/study/tuning_frontier/picks.csv")


@pytest.mark.parametrize(
    ("experiment", "seeds", "encodings", "steps"),
    [
        (
            "study_decisive",
            range(10, 16),
            {"rope", "alibi", "multiscale", "fox", "xpos", "swan", "rnope_swa", "stickbreaking"},
            1000,
        ),
        ("study_clamp_confirm", range(20, 28), {"multiscale"}, 1000),
        ("study_plateau", range(2), {"nope", "sinusoidal", "learned", "alibi", "rope", "multiscale"}, 4000),
    ],
)
def test_the_issue_56_parts_run_fresh_seeds_at_the_committed_picks_and_score_pg_books_test(
    experiment: str, seeds: range, encodings: set[str], steps: int
) -> None:
    """Parts 11-13 (issue 56): every row at its committed tuning pick, on the seeds the plan names (fresh
    ones for the claims), scored on pg-books-test two windows per book; the clamp confirmation trains the
    note's form, every other multi-scale row is clamped."""
    jobs = [dict(o.split("=", 1) for o in j) for j in preset_jobs(experiment)]
    picks = {row["encoding"]: row for path in TUNED for row in csv.DictReader((ROOT / path).open())}
    assert sorted((j["encoding"], j["seed"]) for j in jobs) == sorted(
        (e, str(s)) for e in encodings for s in seeds
    )
    for job in jobs:
        assert float(job["train.lr"]) == float(picks[job["encoding"]]["lr"])
        assert float(job.get("encoding.lr_mult", 1.0)) == float(picks[job["encoding"]]["lr_mult"])
    clamps = {j.get("encoding.clamp") for j in jobs if j["encoding"] == "multiscale"}
    assert clamps == ({"null"} if experiment == "study_clamp_confirm" else {"train"})
    cfg = typed_config([f"+experiment={experiment}", *(f"{k}={v}" for k, v in jobs[-1].items())])
    assert (cfg.experiment, cfg.train.steps, cfg.eval.split) == (experiment, steps, "test")
    books = cfg.eval.corpora[-1]
    assert (books.name, books.windows_per_document) == ("pgbooks_test", 2) and not cfg.passkey.enabled
