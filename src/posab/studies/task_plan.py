"""Power planned before a task claims family is registered (issue 58, as `posab claims plan` for the study):
whether each family of a task claims file can reach α with the grid it plans, and how many pairs the fit
rule may drop before it cannot.

A task claim's pairs are its (task, seed) cells (`posab.studies.tasks`): a claim on one task has `seeds`
pairs, a claim on the `mean` has `tasks × seeds`. The one-sided sign-flip test's least p at n pairs is 2^-n
while it is exact (up to 16 pairs), then 1/20,001; a family is tested by Holm, whose least adjusted p is
k × the least p for k claims. A claim that states `fit` keeps only the pairs where both runs fit, so the
plan also gives the pairs each family can lose and still reach α.

    posab task-plan results/tasks/claims_learned.csv --tasks 8 --seeds 3 [--alpha 0.05]

Prints the plan; exits 2, naming the family and the pairs it would need, when one cannot reach α.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from posab.data.tasks import TASKS
from posab.report.markdown import markdown_table
from posab.report.records import ReportError
from posab.report.resampling import EXACT_SPLITS
from posab.report.stats import ALPHA
from posab.studies.power import FamilyPlan, alpha_level, positive_count, seeds_needed
from posab.studies.tasks import MEAN, TaskClaim, read_task_claims

HOLM = "holm"  # the task suite's families are Holm-adjusted (`claim_verdicts`)


def task_family_plans(claims: Sequence[TaskClaim], tasks: int, seeds: int) -> list[FamilyPlan]:
    """Each family's plan in file order, at the pairs its least-covered claim plans (a `mean` claim covers
    `tasks` × `seeds` pairs, a one-task claim `seeds`)."""
    families: dict[str, list[TaskClaim]] = {}
    for claim in claims:
        families.setdefault(claim.family, []).append(claim)
    return [
        FamilyPlan(family, len(found), HOLM, min(pairs(c, tasks, seeds) for c in found))
        for family, found in families.items()
    ]


def pairs(claim: TaskClaim, tasks: int, seeds: int) -> int:
    """The (task, seed) pairs a claim covers in a grid of `tasks` tasks at `seeds` seeds."""
    return tasks * seeds if claim.task == MEAN else seeds


def plan_lines(plans: Sequence[FamilyPlan], alpha: float) -> list[str]:
    """The plans as a table: pairs planned, least p's, and the pairs a family may lose to the fit rule."""
    header = ["family", "claims", "pairs planned", "least p", "least Holm p", f"< {alpha:g}", "may lose"]
    rows = []
    for plan in plans:
        needed = seeds_needed(plan.claims, plan.procedure, alpha)
        spare = "–" if needed is None or needed > plan.seeds else str(plan.seeds - needed)
        rows.append(
            [plan.family, str(plan.claims), str(plan.seeds), plan.fraction(adjusted=False), plan.fraction()]
            + ["yes" if plan.reaches(alpha) else "no", spare]
        )
    return [
        *markdown_table(header, rows),
        "",
        f"least p: the one-sided sign-flip test over N (task, seed) pairs, 2^-N, exact up to {EXACT_SPLITS} "
        "pairs. may lose: the pairs the fit rule can drop (both runs must fit) with the family still able "
        "to reach α.",
    ]


def refusal(plan: FamilyPlan, alpha: float) -> str:
    needed = seeds_needed(plan.claims, plan.procedure, alpha)
    need = f"{needed} pairs" if needed is not None else "fewer claims (its least p stops at 1/20,001)"
    return (
        f"family {plan.family}: {plan.claims} claims at {plan.seeds} pairs: least Holm p {plan.fraction()} "
        f">= {alpha:g}; needs {need}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="posab task-plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path, help="a task claims file (columns as `posab tasks --claims`)")
    parser.add_argument("--tasks", type=positive_count, required=True, help="tasks a `mean` claim will cover")
    parser.add_argument("--seeds", type=positive_count, required=True, help="seeds of the grid")
    parser.add_argument("--alpha", type=alpha_level, default=ALPHA, help=f"the level (default {ALPHA})")
    args = parser.parse_args(argv)
    try:
        claims = read_task_claims(args.file, sorted(TASKS))
    except (ReportError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    plans = task_family_plans(claims, args.tasks, args.seeds)
    print("\n".join(plan_lines(plans, args.alpha)))
    refused = [refusal(plan, args.alpha) for plan in plans if not plan.reaches(args.alpha)]
    for line in refused:
        print(f"error: {line}", file=sys.stderr)
    return 2 if refused else 0
