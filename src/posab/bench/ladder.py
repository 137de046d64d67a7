"""`posab bench ladder`: the task suite's model-size ladder (issue 58, conf/experiment/tasks_ladder.yaml)
sized to the machine before it runs.

    posab bench ladder [--quick] [--out DIR] [--sizes small,ladder_3m,ladder_10m] [--tasks copy,mqar]
                       [--encodings nope,t5,alibi,rope,sinusoidal] [--budgets CSV] [--cap 8000]
                       [--seeds 3] [--repeats N] [--threads 1] [--no-progress]

For every model size and task, each encoding's training step is timed as a run takes it (`Trainer.step`:
the preset's batch of 64 task examples, its optimizer, schedule and autocast, the task's own stream),
interleaved with the other encodings' (median of `--repeats` after two untimed steps), at `--threads` (1:
the ladder runs two 1-thread jobs at a time on two cores). One task evaluation per (size, task) is timed
too, on NoPE, at a quarter of the preset's examples per length and scaled by four (decoding's cost is
linear in the examples at this batch size; the number says it is scaled).

Rows (ladder.csv, ladder.md in `--out`, default results/bench/task_ladder): size, task, encoding,
parameters, step_s, and tokens_per_s (the examples' padded tokens). The projection (projection.csv, and
ladder.md): per size and task, the budget the runs take (`--budgets`: `posab task-budgets`'s budgets.csv
for the size it was run at, `small`; a size with no pilot of its own takes the cap, an upper bound), and
the run-hours of the ladder's runs (encodings x `--seeds` x (step_s x budget + evaluation)) and of that
size's own pilot if it still needs one (NoPE and RoPE x two seeds x the whole budget ladder 1,000 ..
cap, an upper bound: the ladder stops at its first budget that teaches both). What it cannot say: the
wall time of runs that share the cores with other work, or a budget a size has not piloted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from posab.bench.measure import median_times
from posab.bench.output import FULL_OUT, QUICK_OUT, markdown_table, write_csv
from posab.bench.progress import Progress
from posab.bench.settings import CPU, Settings, dtype_name, positive, precision
from posab.build import build_model
from posab.config import Config
from posab.data import prepare_data
from posab.data.tasks import TaskTokenizer
from posab.encodings import encoding_optimizer
from posab.evaluate import EvalContext, run_evaluator
from posab.logging import NullLogger
from posab.report.budgets import decided_budgets, read_budgets
from posab.report.records import ReportError
from posab.run.wiring import train_sampler
from posab.training.trainer import Trainer

SIZES = ("small", "ladder_3m", "ladder_10m")  # conf/experiment/tasks_ladder.yaml's
TASKS = ("copy", "mqar")
ENCODINGS = ("nope", "t5", "alibi", "rope", "sinusoidal")  # the NoPE study's five
PILOT_SEEDS = 2  # tasks_pilot.yaml: NoPE and RoPE, seeds 100-101
PILOT_LADDER = (1000, 2000, 4000, 8000)  # tasks_pilot.yaml's train.steps (its cap the last)
PILOTED_SIZE = "small"  # the size budgets.csv was piloted at (tasks_pilot.yaml: the protocol's model)
EVAL_SHARE = 4  # evaluation is timed at 1/EVAL_SHARE of the preset's examples per length, then scaled
QUICK = {
    "sizes": ("tiny",),
    "tasks": ("copy",),
    "encodings": ("nope", "alibi"),
    "overrides": ("train.batch_size=4", "data.task.test_lengths=[1,4]", "eval.task.examples=8"),
}
FULL_OUT_LADDER, QUICK_OUT_LADDER = FULL_OUT / "task_ladder", QUICK_OUT / "task_ladder"


@dataclass(frozen=True)
class Plan:
    """What one benchmark measures: the sizes, tasks and encodings, extra overrides, repetitions."""

    sizes: tuple[str, ...]
    tasks: tuple[str, ...]
    encodings: tuple[str, ...]
    overrides: tuple[str, ...]
    repeats: int
    quick: bool

    def config(self, size: str, task: str, encoding: str) -> Config:
        """The ladder preset's run config at this size, task and encoding."""
        overrides = ["+experiment=tasks_ladder", f"model={size}", f"task={task}", f"encoding={encoding}"]
        return Settings(self.quick, self.repeats, 2, (*overrides, *self.overrides), 0, ()).config()


def task_trainer(cfg: Config) -> Trainer:
    """A Trainer as `posab.run` builds one for a task run (the task's own training stream and sampler),
    on the CPU, saving and logging nothing."""
    data = prepare_data(cfg.data)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, TaskTokenizer.vocab_size).train()
    return Trainer(
        model,
        train_sampler(cfg, data),
        data.streams["valid"],
        cfg.train,
        NullLogger(),
        CPU,
        lambda state, kind: None,
        encoding_optimizer(cfg.encoding),
    )


def evaluation_seconds(cfg: Config) -> float:
    """The task evaluation of one run (`eval.task`, cached greedy decoding at every test length), timed at
    1/EVAL_SHARE of its examples and scaled by EVAL_SHARE (module docstring)."""
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, TaskTokenizer.vocab_size).eval()  # untrained: decoding writes as many steps
    examples = max(1, cfg.eval.task.examples // EVAL_SHARE)
    settings = cfg.eval
    settings.task.examples = examples
    stream = prepare_data(cfg.data).streams["test"]
    ctx = EvalContext(
        model, TaskTokenizer(), stream, CPU, precision(cfg), cfg.train.seq_len, settings, "nope"
    )
    start = time.perf_counter()
    run_evaluator(ctx, "task")
    return (time.perf_counter() - start) * cfg.eval.task.examples / examples


def step_rows(plan: Plan, size: str, task: str) -> list[dict[str, Any]]:
    """One row per encoding: its parameters and its training step's median time, timed interleaved."""
    configs = [plan.config(size, task, name) for name in plan.encodings]
    trainers = [task_trainer(cfg) for cfg in configs]
    times = median_times([trainer.step for trainer in trainers], 2, plan.repeats)
    rows = []
    for name, cfg, trainer, seconds in zip(plan.encodings, configs, trainers, times, strict=True):
        tokens = cfg.train.batch_size * cfg.train.seq_len
        rows.append(
            {
                "size": size,
                "task": task,
                "encoding": name,
                "params": sum(p.numel() for p in trainer.model.parameters()),
                "precision": dtype_name(precision(cfg)),
                "step_s": seconds,
                "tokens_per_s": tokens / seconds,
            }
        )
    return rows


def projection(
    rows: list[dict[str, Any]],
    evaluation: dict[tuple[str, str], float],
    budgets: dict[str, int],
    cap: int,
    seeds: int,
) -> list[dict[str, Any]]:
    """Per (size, task): the budget its runs take, and the run-hours of its ladder runs and of its own pilot
    (module docstring)."""
    out = []
    for (size, task), eval_s in evaluation.items():
        steps = {r["encoding"]: r["step_s"] for r in rows if (r["size"], r["task"]) == (size, task)}
        piloted = size == PILOTED_SIZE and task in budgets
        budget = budgets[task] if piloted else cap
        runs_h = sum(seeds * (step * budget + eval_s) for step in steps.values()) / 3600
        reference = [steps[name] for name in ("nope", "rope") if name in steps] or list(steps.values())
        pilot_steps = sum(b for b in PILOT_LADDER if b <= cap)
        pilot_h = 0.0 if piloted else PILOT_SEEDS * sum(s * pilot_steps + eval_s for s in reference) / 3600
        out.append(
            {
                "size": size,
                "task": task,
                "budget": budget,
                "budget_from": "pilot (budgets.csv)"
                if piloted
                else f"cap {cap} (no budget at this size yet)",
                "eval_s": eval_s,
                "ladder_runs": len(steps) * seeds,
                "ladder_run_h": runs_h,
                "pilot_run_h": pilot_h,
            }
        )
    return out


def measure(plan: Plan, progress: Progress) -> tuple[list[dict[str, Any]], dict[tuple[str, str], float]]:
    """Every (size, task)'s step rows and its evaluation's seconds."""
    rows, evaluation = [], {}
    cells = [(size, task) for size in plan.sizes for task in plan.tasks]
    for size, task in progress.over(cells, "ladder cells"):
        rows += step_rows(plan, size, task)
        evaluation[(size, task)] = evaluation_seconds(plan.config(size, task, plan.encodings[0]))
    return rows, evaluation


def busy_share(seconds: float = 1.0) -> float | None:
    """The share of every CPU's time spent busy (not idle or waiting on I/O) over `seconds` before the
    benchmark starts (/proc/stat; None where there is none): what else was running."""
    stat = Path("/proc/stat")
    if not stat.is_file():
        return None

    def sample() -> tuple[int, int]:
        ticks = [int(t) for t in stat.read_text().splitlines()[0].split()[1:]]  # user nice system idle iowait
        return sum(ticks), ticks[3] + ticks[4]

    (total, idle), _ = sample(), time.sleep(seconds)
    total_after, idle_after = sample()
    return 1 - (idle_after - idle) / max(total_after - total, 1)


def report(
    rows: list[dict[str, Any]], projected: list[dict[str, Any]], threads: int, busy: float | None
) -> str:
    total = sum(r["ladder_run_h"] + r["pilot_run_h"] for r in projected)
    before = "not measured (no /proc/stat)" if busy is None else f"{busy:.0%} busy"
    return (
        "# The task ladder, sized to the machine (`posab bench ladder`)\n\n"
        f"Training steps timed at {threads} thread(s), interleaved, medians; evaluation timed at "
        f"1/{EVAL_SHARE} of its examples and scaled by {EVAL_SHARE}. The CPUs in the second before it "
        f"started: {before} ({os.cpu_count()} cores); timings are a run's cost only with nothing else "
        "running.\n\n"
        f"## Training step per size, task and encoding\n\n{markdown_table(rows)}\n\n"
        f"## Projected run-hours\n\n{markdown_table(projected)}\n\n"
        f"In all: {total:.1f} run-hours (ladder runs and the pilots still needed, each an upper bound where "
        "its budget is the cap).\n"
    )


def names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posab bench ladder", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="the tiny model, one task, two encodings (tests)"
    )
    parser.add_argument("--out", type=Path, help=f"output folder (default {FULL_OUT_LADDER})")
    parser.add_argument("--sizes", type=names, default=SIZES, help="model configs, e.g. small,ladder_3m")
    parser.add_argument("--tasks", type=names, default=TASKS, help="tasks, e.g. copy,mqar")
    parser.add_argument("--encodings", type=names, default=ENCODINGS, help="encodings, e.g. nope,rope")
    parser.add_argument("--budgets", type=Path, help="budgets.csv of `posab task-budgets` (size small)")
    parser.add_argument(
        "--cap", type=positive, default=PILOT_LADDER[-1], help="the budget of an unpiloted size"
    )
    parser.add_argument("--seeds", type=positive, default=3, help="seeds per ladder cell (the preset's 3)")
    parser.add_argument(
        "--repeats", type=positive, help="timed steps per encoding (default 5; 1 with --quick)"
    )
    parser.add_argument(
        "--threads", type=positive, default=1, help="torch threads (default 1, as the ladder)"
    )
    parser.add_argument(
        "--no-progress", dest="progress", action="store_false", default=Progress.default(), help="no bars"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:  # before the minutes of timing: a bad budgets file loses nothing
        budgets = decided_budgets(read_budgets(args.budgets)) if args.budgets else {}
    except ReportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    quick: dict[str, Any] = QUICK if args.quick else {}
    plan = Plan(
        quick.get("sizes", args.sizes),
        quick.get("tasks", args.tasks),
        quick.get("encodings", args.encodings),
        quick.get("overrides", ()),
        args.repeats or (1 if args.quick else 5),
        args.quick,
    )
    busy = busy_share()
    rows, evaluation = measure(plan, Progress(args.progress))
    projected = projection(rows, evaluation, budgets, args.cap, args.seeds)
    out = args.out or (QUICK_OUT_LADDER if args.quick else FULL_OUT_LADDER)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "ladder.csv", rows)
    write_csv(out / "projection.csv", projected)
    (out / "ladder.md").write_text(report(rows, projected, args.threads, busy), encoding="utf-8")
    print(f"wrote {out / 'ladder.md'}")
    return 0
