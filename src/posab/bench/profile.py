"""Section 6: where a training step's time goes. `torch.profiler` over `Trainer.step` (after warm-up)
for nope, rope, alibi and hierarchical, and for x-transformers' rotary model when it is installed: the
operators by self CPU time per step. The table keeps each case's top operators; every case's whole
table is written next to it as profile_<case>.txt."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.profiler import ProfilerActivity, profile

from posab.bench.inputs import posab_model
from posab.bench.measure import quiet_stderr
from posab.bench.output import Result
from posab.bench.peer import TokensOnly, peer_available, peer_model
from posab.bench.progress import Progress
from posab.bench.settings import Settings
from posab.bench.steps import training_step

ENCODINGS = ("nope", "rope", "alibi", "hierarchical")
PEER = ("rope", "rotary_pos_emb")  # posab encoding, x-transformers option
STEPS = 3  # profiled steps per case
TOP = 8  # operators per case in bench.md's table
FULL_TABLE = 40  # operators in each profile_<case>.txt


def section(settings: Settings, progress: Progress) -> Result:
    result = Result("section6_profile", "6. Where a training step goes: operators by self CPU time")
    cases = {name: lambda name=name: posab_step(name, settings) for name in ENCODINGS}
    if peer_available():
        cases[f"x-transformers {PEER[1]}"] = lambda: peer_step(settings)
    for case in progress.over(list(cases), "section 6"):
        rows, table = profile_step(cases[case](), settings)
        result.files[f"profile_{case.replace(' ', '_')}.txt"] = table + "\n"
        result.rows += [{"case": case, **row} for row in rows[:TOP]]
    return result


def posab_step(name: str, settings: Settings) -> Callable[[], object]:
    cfg = settings.config(name)
    return training_step(posab_model(cfg), cfg)


def peer_step(settings: Settings) -> Callable[[], object]:
    cfg = settings.config(PEER[0])
    return training_step(TokensOnly(peer_model(PEER[1], cfg)), cfg)


def profile_step(step: Callable[[], object], settings: Settings) -> tuple[list[dict[str, Any]], str]:
    """Rows (operator, self ms per step, share of the step's self time) by self CPU time, and the
    profiler's own table of the top FULL_TABLE operators."""
    for _ in range(settings.warmup):
        step()
    steps = 1 if settings.quick else STEPS
    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    averages = prof.key_averages()
    total = sum(event.self_cpu_time_total for event in averages)
    ranked = sorted(averages, key=lambda event: event.self_cpu_time_total, reverse=True)
    rows = [
        {
            "operator": event.key,
            "self_ms_per_step": event.self_cpu_time_total / 1e3 / steps,
            "share_pct": 100 * event.self_cpu_time_total / total,
            "calls_per_step": event.count / steps,
        }
        for event in ranked
    ]
    return rows, averages.table(sort_by="self_cpu_time_total", row_limit=FULL_TABLE, max_name_column_width=80)
