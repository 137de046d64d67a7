"""Train and evaluate one positional-encoding configuration: `python train.py encoding=alibi`."""

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from posab.distributed import init_from_env
from posab.errors import ConfigError, Preempted, TrainingError
from posab.run.wiring import JobInfo, main

EXIT_CODES = {ConfigError: 2, TrainingError: 1, Preempted: Preempted.exit_code}


def job_info() -> JobInfo:
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    return JobInfo(
        multirun=multirun,
        override_dirname=hc.job.override_dirname,
        sweep_name=Path(hc.sweep.dir).name if multirun else None,
        parallel_jobs=parallel_jobs(int(hc.launcher.get("n_jobs") or 1)) if multirun else 1,
    )


def parallel_jobs(n_jobs: int) -> int:
    """joblib's n_jobs: a positive count, or -1 for all cores, -2 for all but one, ..."""
    return n_jobs if n_jobs > 0 else max(1, (os.cpu_count() or 1) + 1 + n_jobs)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def entry(cfg: DictConfig) -> None:
    init_from_env()  # SLURM tasks of one job (submitit) join here; torchrun ranks already have
    job = job_info()
    try:
        main(cfg, Path(HydraConfig.get().runtime.output_dir), job)
    except (ConfigError, TrainingError, Preempted) as err:
        if job.multirun and not isinstance(err, Preempted):  # Hydra records the failure; the sweep goes on
            raise
        # a pre-empted sweep stops as a whole: the same command with hydra.sweep.dir=<its folder>
        # keeps the finished jobs, resumes this one from its checkpoint and runs the rest
        print(f"error: {err}", file=sys.stderr)
        sys.exit(EXIT_CODES[type(err)])


if __name__ == "__main__":
    init_from_env()  # joins the process group under torchrun (a no-op otherwise)
    entry()
