"""The benchmark's targets, as data, and how the sections' tables are held to them.

Each `Goal` names a section's table, the rows it reads and a condition on one column; it becomes one
`Target` per row read, labelled from that row's cells. A section that did not run, or has no such row,
yields no target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

LONGEST = "longest"  # a cell value in `Goal.rows`: keep the rows where that column is largest
SIGNS = {">=": True, "<=": False}  # at least / at most
BIAS, STEP, PEER, FLOPS = "section1_bias", "section2_train_step", "section4_x_transformers", "section5_flops"
EVAL = "section3_eval_forward"
TIME = "multiscale {phase} L={length}: all-pairs / distinct time"
MEMORY = "multiscale {phase} L={length}: all-pairs / distinct peak memory"
STEP_RATIO = "{encoding} step time / nope"
PEER_RATIO = "{posab} / x-transformers {x_transformers} step time"
FLOPS_SHARE = "model={model} FLOP/s / {dtype} matmul peak"
EVAL_MEMORY = "{encoding} evaluation L={length}: peak memory / alibi's"


@dataclass(frozen=True)
class Goal:
    """`condition`, "COLUMN >= BOUND" or "COLUMN <= BOUND", on the rows of table `section` that `rows`
    picks: "column=value ..." cells they must have ("" picks every row; the value `longest` keeps the rows
    where that column is largest among the others picked). `label` is formatted with each row's cells;
    `unit` follows the value and the bound."""

    section: str
    rows: str
    condition: str
    label: str
    unit: str = "x"

    def __post_init__(self) -> None:
        parts = self.condition.split()
        if len(parts) != 3 or parts[1] not in SIGNS or any("=" not in cell for cell in self.rows.split()):
            raise ValueError(f"malformed goal: rows {self.rows!r}, condition {self.condition!r}")
        float(parts[2])  # the bound: a number, or a ValueError

    @property
    def cells(self) -> dict[str, str]:
        return dict(cell.split("=", 1) for cell in self.rows.split())

    def picked(self, table: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rows of `table` that `rows` picks, in table order."""
        wanted = self.cells
        rows = [row for row in table if all(str(row.get(c)) == v for c, v in wanted.items() if v != LONGEST)]
        for column in (c for c, v in wanted.items() if v == LONGEST):
            top = max(row[column] for row in rows) if rows else None
            rows = [row for row in rows if row[column] == top]
        return rows

    def targets(self, table: Sequence[dict[str, Any]]) -> list[Target]:
        column, sign, bound = self.condition.split()
        return [
            Target(self.label.format(**row), row[column], float(bound), SIGNS[sign], self.unit)
            for row in self.picked(table)
        ]


GOALS: tuple[Goal, ...] = (
    # the distinct-distance multi-scale bias against the all-pairs method, at the longest length measured
    Goal(BIAS, "encoding=multiscale phase=build length=longest", "time_ratio >= 100", TIME),
    Goal(BIAS, "encoding=multiscale phase=build length=longest", "memory_ratio >= 30", MEMORY),
    Goal(BIAS, "encoding=multiscale phase=forward length=longest", "time_ratio >= 100", TIME),
    Goal(BIAS, "encoding=multiscale phase=forward length=longest", "memory_ratio >= 30", MEMORY),
    Goal(BIAS, "encoding=multiscale phase=forward+backward length=longest", "time_ratio >= 100", TIME),
    Goal(BIAS, "encoding=multiscale phase=forward+backward length=longest", "memory_ratio >= 30", MEMORY),
    # the training step against NoPE's
    Goal(STEP, "encoding=sinusoidal", "ratio_to_nope <= 1.10", STEP_RATIO),
    Goal(STEP, "encoding=alibi", "ratio_to_nope <= 1.10", STEP_RATIO),
    Goal(STEP, "encoding=rope", "ratio_to_nope <= 1.10", STEP_RATIO),
    Goal(STEP, "encoding=multiscale", "ratio_to_nope <= 1.25", STEP_RATIO),
    Goal(STEP, "encoding=hierarchical", "ratio_to_nope <= 1.25", STEP_RATIO),
    # DAPE (issue 28, part 3): a training step within 2x of NoPE's, and a 4,096-token evaluation within the
    # memory an additive bias's evaluation needs (ALiBi's: its (1, H, L, L) mask)
    Goal(STEP, "encoding=dape_alibi", "ratio_to_nope <= 2", STEP_RATIO),
    Goal(STEP, "encoding=dape_multiscale", "ratio_to_nope <= 2", STEP_RATIO),
    Goal(EVAL, "encoding=dape_alibi length=longest", "peak_ratio_to_alibi <= 1.5", EVAL_MEMORY),
    Goal(EVAL, "encoding=dape_multiscale length=longest", "peak_ratio_to_alibi <= 1.5", EVAL_MEMORY),
    # the frontier encodings (issue 43), each bound from its structure (docs/encodings.md). FoX and xPos:
    # a rank-2 gate bias / a second elementwise scale of q and k, so near NoPE (the 1.25x). The
    # window hybrids: RoPE on 3 layers of 4 and a band mask, so at most RoPE's cost. Stick-breaking: a
    # log-sigmoid, a reverse cumulative sum and an explicit probability per pair in a chunked kernel with
    # no fused softmax (2x), but no (1, H, L, L) mask at evaluation (a quarter of ALiBi's). CoPE: a second
    # matmul for the position logits, a sigmoid and a scan per pair, two gathers and an explicit softmax (3x)
    Goal(STEP, "encoding=fox", "ratio_to_nope <= 1.25", STEP_RATIO),
    Goal(STEP, "encoding=xpos", "ratio_to_nope <= 1.25", STEP_RATIO),
    Goal(STEP, "encoding=swan", "ratio_to_nope <= 1.10", STEP_RATIO),
    Goal(STEP, "encoding=rnope_swa", "ratio_to_nope <= 1.10", STEP_RATIO),
    Goal(STEP, "encoding=stickbreaking", "ratio_to_nope <= 2", STEP_RATIO),
    Goal(STEP, "encoding=cope", "ratio_to_nope <= 3", STEP_RATIO),
    Goal(EVAL, "encoding=fox length=longest", "peak_ratio_to_alibi <= 1", EVAL_MEMORY),
    Goal(EVAL, "encoding=cope length=longest", "peak_ratio_to_alibi <= 1", EVAL_MEMORY),
    Goal(EVAL, "encoding=swan length=longest", "peak_ratio_to_alibi <= 1", EVAL_MEMORY),
    Goal(EVAL, "encoding=rnope_swa length=longest", "peak_ratio_to_alibi <= 1", EVAL_MEMORY),
    Goal(EVAL, "encoding=stickbreaking length=longest", "peak_ratio_to_alibi <= 0.25", EVAL_MEMORY),
    # PaTH and PaTH-FoX (issue 59): the UT transform per chunk and a state of carried keys updated per chunk
    # beside an explicit softmax (3x), and no (L, L) tensor at evaluation (at most ALiBi's mask)
    Goal(STEP, "encoding=path", "ratio_to_nope <= 3", STEP_RATIO),
    Goal(STEP, "encoding=path_fox", "ratio_to_nope <= 3", STEP_RATIO),
    Goal(EVAL, "encoding=path length=longest", "peak_ratio_to_alibi <= 1", EVAL_MEMORY),
    Goal(EVAL, "encoding=path_fox length=longest", "peak_ratio_to_alibi <= 1", EVAL_MEMORY),
    # the training step against x-transformers' with the same sizes
    Goal(PEER, "posab=rope", "ratio <= 0.6", PEER_RATIO),
    Goal(PEER, "posab=alibi", "ratio <= 0.6", PEER_RATIO),
    Goal(PEER, "posab=multiscale", "ratio <= 0.6", PEER_RATIO),
    # achieved model FLOP/s as a share of the matmul peak, for the model large enough to be compute-bound
    Goal(FLOPS, "model=medium", "share_pct >= 40", FLOPS_SHARE, unit="%"),
)


@dataclass(frozen=True)
class Target:
    """A goal applied to one row; `value` None (or NaN) when it was not measured."""

    label: str
    value: float | None
    bound: float
    higher_is_better: bool
    unit: str = "x"

    @property
    def measured(self) -> bool:
        return self.value is not None and not math.isnan(self.value)

    def verdict(self) -> str:
        if self.value is None or not self.measured:
            return "not measured"
        gap = self.bound - self.value if self.higher_is_better else self.value - self.bound
        if gap <= 0:
            return "met"
        return f"missed by {gap:.1f} percentage points" if self.unit == "%" else f"missed by {gap:.3g}x"

    def row(self) -> dict[str, Any]:
        """The line of targets.csv and of the report's Targets table."""
        sign = ">=" if self.higher_is_better else "<="
        value = f"{self.value:.4g}{self.unit}" if self.value is not None and self.measured else "n/a"
        target = f"{self.label} {sign} {self.bound:g}{self.unit}"
        return {"target": target, "value": value, "verdict": self.verdict()}


def evaluate(tables: dict[str, list[dict[str, Any]]], goals: Sequence[Goal] = GOALS) -> list[Target]:
    """Every goal against the tables that were measured (section key -> rows), in the goals' order."""
    return [
        target for goal in goals if goal.section in tables for target in goal.targets(tables[goal.section])
    ]
