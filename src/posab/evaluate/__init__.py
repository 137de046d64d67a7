"""Evaluators, found by module: every `Evaluator` subclass defined under `posab/evaluate/`.

`EvalConfig` is the shared `EvalSettings` plus one section per evaluator (`eval.perplexity`,
`eval.needle`, ...), built from the evaluators found, so a new evaluator needs no edit here.
"""

from __future__ import annotations

import importlib
import pkgutil
import time
from dataclasses import field, make_dataclass, replace
from functools import cache

from posab.evaluate.base import Evaluator, SectionConfig
from posab.evaluate.context import EvalContext, EvalCorpus, EvalSettings
from posab.outputs import EvalOutput, for_corpus

__all__ = [
    "EvalConfig",
    "EvalContext",
    "EvalCorpus",
    "EvalSettings",
    "Evaluator",
    "enabled_evaluators",
    "evaluator_classes",
    "run_evaluations",
    "run_evaluator",
]


@cache
def evaluator_classes() -> tuple[type[Evaluator], ...]:
    """Every evaluator class defined in a module of this package, in their `order`."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    found = [cls for cls in _subclasses(Evaluator) if cls.__module__.startswith(__name__ + ".")]
    names = [cls.name for cls in found]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise TypeError(f"two evaluators share the name(s) {clashes}")
    return tuple(sorted(found, key=lambda cls: (cls.order, cls.name)))


def _subclasses(cls: type) -> list[type]:
    direct = cls.__subclasses__()
    return [sub for c in direct for sub in [c, *_subclasses(c)] if "name" in sub.__dict__]


def _validate(cfg: EvalSettings) -> None:
    """The shared settings, then every evaluator's section."""
    cfg.validate_settings()
    for cls in evaluator_classes():
        section: SectionConfig = getattr(cfg, cls.name)
        section.validate(cfg)


EvalConfig = make_dataclass(
    "EvalConfig",
    [(cls.name, cls.config, field(default_factory=cls.config)) for cls in evaluator_classes()],
    bases=(EvalSettings,),
    namespace={"validate": _validate, "__doc__": "The `eval` config group: shared settings and sections."},
)
EvalConfig.__module__ = __name__


def enabled_evaluators(cfg: EvalSettings) -> list[Evaluator]:
    """The evaluators switched on in `cfg` (an EvalConfig), in the order they run, with their sections."""
    sections = [(cls, getattr(cfg, cls.name)) for cls in evaluator_classes()]
    return [cls(section) for cls, section in sections if section.enabled]


def run_evaluator(ctx: EvalContext, name: str) -> EvalOutput:
    """Run one evaluator by name with its section of `ctx.cfg`, enabled or not (tests, scripts)."""
    classes = {cls.name: cls for cls in evaluator_classes()}
    if name not in classes:
        raise KeyError(f"no evaluator {name!r}; evaluators: {', '.join(classes)}")
    return classes[name](getattr(ctx.cfg, name)).evaluate(ctx)


def run_evaluations(ctx: EvalContext, after_stage: bool | None = None) -> EvalOutput:
    """Run every enabled evaluator (or those whose `after_stage` is the given value) on the run's split,
    then each `per_corpus` one on every corpus of `ctx.corpora` (keys `NAME:...`, `for_corpus`); the wall
    time of each under `time/<name>_s`."""
    chosen = [e for e in enabled_evaluators(ctx.cfg) if after_stage is None or e.after_stage == after_stage]
    output = _timed(ctx, chosen)
    for name, stream in ctx.corpora.items():
        on_corpus = replace(ctx, valid=stream, corpora={})
        output.update(for_corpus(_timed(on_corpus, [e for e in chosen if e.per_corpus]), name))
    return output


def _timed(ctx: EvalContext, evaluators: list[Evaluator]) -> EvalOutput:
    output = EvalOutput()
    for evaluator in evaluators:
        started = time.perf_counter()
        output.update(evaluator.evaluate(ctx))
        output.scalars[f"time/{evaluator.name}_s"] = round(time.perf_counter() - started, 3)
    return output
