"""Evaluators: callables `(EvalContext) -> dict` with slash keys (`ppl/2048`, `needle/acc@4096`, ...)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from posab.evaluate.attention_analysis import analysis_eval
from posab.evaluate.context import EvalContext
from posab.evaluate.needle import needle_eval
from posab.evaluate.perplexity import perplexity_eval
from posab.evaluate.shift import shift_eval

__all__ = ["EvalContext", "evaluators", "run_evaluations"]

Evaluator = Callable[[EvalContext], dict[str, Any]]


def evaluators(ctx: EvalContext) -> dict[str, Evaluator]:
    """The evaluators switched on in the config, in the order they run."""
    switched = {
        "perplexity": (ctx.cfg.perplexity.enabled, perplexity_eval),
        "needle": (ctx.cfg.needle.enabled, needle_eval),
        "shift": (ctx.cfg.shift.enabled, shift_eval),
        "analysis": (ctx.cfg.analysis.enabled, analysis_eval),
    }
    return {name: fn for name, (enabled, fn) in switched.items() if enabled}


def run_evaluations(ctx: EvalContext) -> dict[str, Any]:
    """Run every enabled evaluator; wall time of each under `time/<name>_s`."""
    results: dict[str, Any] = {}
    for name, evaluate in evaluators(ctx).items():
        started = time.perf_counter()
        results.update(evaluate(ctx))
        results[f"time/{name}_s"] = round(time.perf_counter() - started, 3)
    return results
