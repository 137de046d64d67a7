"""Data-parallel training under `torchrun` (DDP): gloo on CPU, NCCL on GPU.

`torchrun --nproc_per_node=N train.py ...` starts N processes with RANK / WORLD_SIZE in the environment.
Every rank draws the same global batch of windows and takes its own shard, DDP averages the gradients,
and only rank 0 logs, writes files and shows progress bars. Without torchrun everything here is a no-op
(world size 1).
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from tqdm import tqdm

RUN_STAMP = "POSAB_RUN_STAMP"  # read by conf/config.yaml's hydra.run.dir, so that all ranks share one dir
T = TypeVar("T")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def world() -> World:
    """This process's place, from torchrun's environment, or SLURM's for a job of several tasks (rank 0
    of 1 without either)."""
    env = os.environ
    if "RANK" not in env and int(env.get("SLURM_NTASKS", 1)) > 1:
        return World(int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", 0)))
    return World(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0)))


def progress_bar(items: Iterable[T] | None, desc: str, enabled: bool, **options: Any) -> tqdm[T]:
    """A tqdm bar over `items` (None: updated by hand, `total` in `options`), on stderr, shown only when
    `enabled` (a `progress` setting) and only on rank 0; it never changes what is computed. `leave=False`
    for an inner bar, cleared when done."""
    disable = not (enabled and world().is_main)
    return tqdm(items, desc=desc, disable=disable, dynamic_ncols=True, **options)


def export_slurm_rank(w: World) -> None:
    """The variables `init_process_group` reads, for SLURM tasks (single node unless MASTER_ADDR is set)."""
    os.environ.setdefault("RANK", str(w.rank))
    os.environ.setdefault("WORLD_SIZE", str(w.size))
    os.environ.setdefault("LOCAL_RANK", str(w.local_rank))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(20000 + int(os.environ.get("SLURM_JOB_ID", 0)) % 20000))


def init_from_env() -> World:
    """Join the process group when started by torchrun, and agree on one run-directory time stamp."""
    w = world()
    if not w.distributed or dist.is_initialized():
        return w
    export_slurm_rank(w)
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend)
    atexit.register(dist.destroy_process_group)
    if torch.cuda.is_available():
        torch.cuda.set_device(w.local_rank)
    stamp = [os.environ.get(RUN_STAMP) or time.strftime("%Y-%m-%d_%H-%M-%S")]
    dist.broadcast_object_list(stamp, src=0)
    os.environ[RUN_STAMP] = stamp[0]
    return w


def mean_across_ranks(value: float) -> float:
    """The mean of a scalar over all ranks (the value itself without torchrun)."""
    if not dist.is_initialized():
        return value
    tensor = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(tensor)
    return float(tensor) / dist.get_world_size()


def sum_across_ranks(*values: float) -> tuple[float, ...]:
    """Element-wise sums over all ranks, in one reduction."""
    if not dist.is_initialized():
        return values
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor)
    return tuple(float(v) for v in tensor)


def any_rank(flag: bool) -> bool:
    """True on every rank when `flag` is true on any rank."""
    if not dist.is_initialized():
        return flag
    tensor = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
