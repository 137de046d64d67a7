"""Power planned before a claims family is registered: whether its claims can reach α at the seed pairs it
plans, whatever the runs turn out to be.

A claim's p is the one-sided sign-flip test over its seed pairs (the paired designs, `same-weights` and
`seed-matched`, that claims are written for). Its least value at n pairs is 2^-n, every pair's difference
on the claimed side, while the test is exact: up to EXACT_SPLITS (16) pairs. Beyond, the test samples
PERMUTATIONS (20,000) random sign assignments, so its least p is 1/20,001 whatever n
(`least_one_sided_p`). A family's least adjusted p is Holm's first step, k × 2^-n for k claims, or the fixed
sequence's first claim, 2^-n (`claims.LEAST_ADJUSTED`); at or above α none of its claims can be `ordered`:
seven Holm claims at five pairs give 7/32 = 0.219.

`posab claims plan FILE ...` prints each family's floor before any run and refuses (exit 2) a family that
cannot reach α, naming the seeds that would; `posab claims STUDY_DIR` refuses a preregistered family whose
declared `seeds` cannot (`underpowered`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from posab.report.markdown import markdown_table
from posab.report.records import ReportError
from posab.report.resampling import EXACT_SPLITS, PERMUTATIONS, least_one_sided_p
from posab.report.stats import ALPHA, PAIRED_METRICS
from posab.studies.claims import LEAST_ADJUSTED, PREREGISTERED, PROCEDURES, Claim, read_claims_files

NOTE = (
    f"least p: the one-sided sign-flip test over N seed pairs, 2^-N, exact up to {EXACT_SPLITS} pairs; "
    f"beyond, it samples {PERMUTATIONS:,} random sign assignments, so at least 1/{PERMUTATIONS + 1} "
    "whatever N. Least adjusted p: holm, k claims × the least p; fixed-sequence, the first claim's least p."
)


@dataclass(frozen=True)
class FamilyPlan:
    """A family as planned: its number of claims, its procedure and the seed pairs each claim will have."""

    family: str
    claims: int
    procedure: str
    seeds: int

    @property
    def least_p(self) -> float:
        """Each claim's least one-sided p at `seeds` pairs."""
        return least_one_sided_p(self.seeds, self.seeds, paired=True)

    @property
    def least_adjusted_p(self) -> float:
        """The least p any claim of the family can have once adjusted by its procedure."""
        return LEAST_ADJUSTED[self.procedure]([self.least_p] * self.claims)

    def reaches(self, alpha: float) -> bool:
        return self.least_adjusted_p < alpha

    def fraction(self, adjusted: bool = True) -> str:
        """`7/32 = 0.219`: the least adjusted p (or, not `adjusted`, each claim's least p) as a fraction."""
        value = self.least_adjusted_p if adjusted else self.least_p
        return f"{round(value / self.least_p)}/{round(1 / self.least_p)} = {_decimal(value)}"


def _decimal(p: float) -> str:
    return f"{p:.3f}" if p >= 0.001 else f"{p:.2g}"


def seeds_needed(claims: int, procedure: str, alpha: float) -> int | None:
    """The fewest seed pairs at which `claims` claims under `procedure` can reach `alpha`; None when no number
    can (past EXACT_SPLITS + 1 pairs the least p no longer falls)."""
    for seeds in range(1, EXACT_SPLITS + 2):
        if FamilyPlan("", claims, procedure, seeds).reaches(alpha):
            return seeds
    return None


def family_plans(claims: Sequence[Claim], seeds: int | None = None) -> list[FamilyPlan]:
    """Each family's plan, in file order: `seeds` pairs if given, else its claims file's `seeds`; a family
    with neither is an error naming it."""
    families: dict[str, list[Claim]] = {}
    for claim in claims:
        families.setdefault(claim.family, []).append(claim)
    plans, missing = [], []
    for family, found in families.items():
        pairs = seeds or found[0].seeds
        if pairs is None:
            missing.append(family)
        else:
            plans.append(FamilyPlan(family, len(found), found[0].procedure, pairs))
    if missing:
        raise ReportError(
            f"family {', '.join(missing)}: no seed pairs planned; give a `seeds` column in its claims file "
            "or `--seeds N`"
        )
    return plans


def refusal(plan: FamilyPlan, alpha: float) -> str:
    """One line: why the family cannot reach `alpha`, and the seeds that would under each procedure."""
    return (
        f"family {plan.family}: {plan.claims} claims, {plan.procedure}, {plan.seeds} seeds: least adjusted p "
        f"{plan.fraction()} >= {alpha:g}; needs {' or '.join(_needs(plan, p, alpha) for p in PROCEDURES)}"
    )


def _needs(plan: FamilyPlan, procedure: str, alpha: float) -> str:
    seeds = seeds_needed(plan.claims, procedure, alpha)
    if seeds is None:
        return f"no number of seeds under {procedure} (its least p stops at 1/{PERMUTATIONS + 1})"
    reached = FamilyPlan(plan.family, plan.claims, procedure, seeds)
    return f"{seeds} seeds under {procedure} ({reached.fraction()})"


def underpowered(claims: Sequence[Claim], alpha: float = ALPHA) -> list[str]:
    """The refusals (`refusal`) of the families that have a preregistered claim, declare `seeds`, and cannot
    reach `alpha` at them; families without `seeds` (written before the column) are not checked."""
    preregistered = {c.family for c in claims if c.status == PREREGISTERED}
    declared = [c for c in claims if c.family in preregistered and c.seeds is not None]
    return [refusal(plan, alpha) for plan in family_plans(declared) if not plan.reaches(alpha)]


def plan_lines(plans: Sequence[FamilyPlan], alpha: float) -> list[str]:
    """The plans as a table, and a note on how the least p's are found."""
    header = ["family", "claims", "procedure", "seed pairs", "least p", "least adjusted p", f"< {alpha:g}"]
    rows = [
        [p.family, str(p.claims), p.procedure, str(p.seeds), p.fraction(adjusted=False), p.fraction()]
        + ["yes" if p.reaches(alpha) else "no"]
        for p in plans
    ]
    return [*markdown_table(header, rows), "", NOTE]


def positive_count(text: str) -> int:
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer (e.g. 8)")
    return int(text)


def alpha_level(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a level between 0 and 1 (e.g. 0.05)")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: `posab claims plan FILE [FILE ...] [--seeds N] [--alpha A]`; 0 when every family can reach α, 2
    when one cannot (a line each on stderr) or a file is bad."""
    parser = argparse.ArgumentParser(
        prog="posab claims plan",
        description="Before any run: each claims family's least one-sided p at its planned seed pairs and "
        "its least adjusted p; refuse (exit 2) a family that cannot reach α.",
    )
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE", help="claims files (e.g. pending/)")
    parser.add_argument(
        "--seeds", type=positive_count, help="seed pairs for every family (default: its `seeds`)"
    )
    parser.add_argument("--alpha", type=alpha_level, default=ALPHA, help=f"the level (default {ALPHA})")
    args = parser.parse_args(argv)
    try:
        plans = family_plans(read_claims_files(args.files, PAIRED_METRICS), args.seeds)
    except ReportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("\n".join(plan_lines(plans, args.alpha)))
    refused = [refusal(plan, args.alpha) for plan in plans if not plan.reaches(args.alpha)]
    for line in refused:
        print(f"error: {line}", file=sys.stderr)
    return 2 if refused else 0
