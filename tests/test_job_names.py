"""A multirun job's directory name stays within a file name's 255 bytes, readable and unique."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from conftest import ROOT
from posab.job_names import NAME_MAX, job_subdir

LONG = (
    "encoding=alibi,eval.corpora=[{name:wikitext2,path:/very/long/absolute/path/to/shared/data/wikitext-2-raw/"
    "wiki.test.raw,format:wikitext}],seed=1,train.lr=0.003,train.steps=1000,encoding.lr_mult=10,"
    "eval.lengths=[512,1024,2048,4096],model.n_layers=6,eval.needle.trials=20"
)


def test_a_name_that_fits_is_kept_whole() -> None:
    assert job_subdir(3, "encoding=alibi,seed=1") == "3_encoding=alibi,seed=1"
    assert job_subdir(0, "") == "0"


def test_a_long_name_keeps_a_readable_prefix_and_a_hash_of_the_whole() -> None:
    name = job_subdir(12, LONG)
    assert len(f"12_{LONG}".encode()) > NAME_MAX and len(name.encode()) == NAME_MAX
    assert name.startswith("12_encoding=alibi,eval.corpora=[{name:wikitext2,")
    other = job_subdir(12, LONG.replace("trials=20", "trials=30"))  # differs only past the cut
    assert other != name and other[:200] == name[:200]
    assert job_subdir(12, LONG) == name  # the same overrides, the same name


def test_a_multibyte_character_is_never_cut_in_half() -> None:
    name = job_subdir(1, "data.path=" + "é" * 200)
    assert len(name.encode()) <= NAME_MAX
    name.encode().decode()  # valid UTF-8


def test_the_config_names_multirun_jobs_through_the_resolver() -> None:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.job.num = 7
        cfg.hydra.job.override_dirname = LONG
    subdir = OmegaConf.select(cfg, "hydra.sweep.subdir")
    assert subdir == job_subdir(7, LONG) and len(subdir.encode()) <= NAME_MAX


@pytest.mark.parametrize("limit", [40, 100])
def test_any_limit_is_kept(limit: int) -> None:
    assert len(job_subdir(5, LONG, limit).encode()) == limit
