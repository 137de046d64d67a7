"""`posab COMMAND ...`: the tools around training, one command (`[project.scripts]`, or `python -m posab`).
Training itself is `python train.py` (Hydra). Each command's module parses its own arguments
(`posab COMMAND --help`); the module is imported only when its command runs, so `posab report` needs no torch.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# command -> (module with `main(argv) -> int`, what it does)
COMMANDS: dict[str, tuple[str, str]] = {
    "evaluate": ("posab.run.reevaluation", "re-evaluate a finished run without retraining"),
    "report": ("posab.report.cli", "tables, statistics and plots over runs, sweeps or a runs.csv"),
    "claims": (
        "posab.studies.readings",
        "test every claim of a study once; write its verdicts and readings (`claims plan`: seeds to plan)",
    ),
    "needle-report": ("posab.studies.needle", "retrieval by length and stage curves of passkey-stage runs"),
    "tuning": ("posab.studies.tuning", "the learning-rate pilot's picks"),
    "tasks": (
        "posab.studies.tasks",
        "the algorithmic task suite: accuracy, the NoPE study's ranking, orderings",
    ),
    "budget": ("posab.studies.budget", "the training budget's validation curves"),
    "plateau": (
        "posab.studies.plateau",
        "the same encodings and seeds at B and at a longer budget, side by side",
    ),
    "task-plan": (
        "posab.studies.task_plan",
        "before a task grid: can each claims family reach α, and how many pairs may the fit rule drop",
    ),
    "task-budgets": (
        "posab.studies.task_budgets",
        "each task's budget from the pilot: learned before measured",
    ),
    "size-trend": (
        "posab.studies.size_trend",
        "claims across model sizes (the task ladder): a trend test over every run, planned before",
    ),
    "window-documents": ("posab.studies.window_documents", "add each window's document to runs.csv"),
    "audit-backfill": ("posab.run.audit_backfill", "the audit's pull and input novelty for older runs"),
    "compare-runs": ("posab.run.compare", "hold two folders of runs to each other: every number identical"),
    "generate": ("posab.run.generate", "continue a prompt with a finished run's model (cached decoding)"),
    "bench": ("posab.bench.cli", "the performance benchmark"),
    "check-device": ("posab.bench.check_device", "every encoding on a device against the CPU in float64"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    return "usage: posab COMMAND [ARGS ...]   (posab COMMAND --help)\n\ncommands:\n" + "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"error: posab has no command {name!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    command = importlib.import_module(COMMANDS[name][0])
    return int(command.main(rest) or 0)
