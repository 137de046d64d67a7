"""The evaluator interface: one class per evaluator, in one file with its config section.

An evaluator returns an `EvalOutput` (scalars, data, tables, curves and figures as objects) and declares
the report columns it contributes; the run writes the files, the loggers log the output and the report
reads the declared columns. A module under `posab/evaluate/` that defines an `Evaluator` subclass is
found by `posab.evaluate.evaluator_classes`; its config section `eval.<name>` is its `config` dataclass
(add the section's defaults to `conf/eval/default.yaml`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

from posab.evaluate.context import EvalContext, EvalSettings
from posab.outputs import EvalOutput


@dataclass
class SectionConfig:
    """An evaluator's own settings, `eval.<name>`; every section can be switched off."""

    enabled: bool = True

    def validate(self, settings: EvalSettings) -> None:
        """Raise a ConfigError naming a bad value (`settings`: the shared `eval` settings)."""


SectionT = TypeVar("SectionT", bound=SectionConfig)


class Evaluator(ABC, Generic[SectionT]):
    """One measurement on a trained model."""

    name: ClassVar[str]  # its config section `eval.<name>` and its wall time `time/<name>_s`
    config: ClassVar[type[SectionConfig]]  # the section's dataclass
    order: ClassVar[int]  # evaluators run in increasing order
    after_stage: ClassVar[bool] = False  # with a passkey stage, runs on the model after it (else before)
    per_corpus: ClassVar[bool] = False  # also runs on each of `eval.corpora` (it reads only their text)

    def __init__(self, cfg: SectionT) -> None:
        self.cfg = cfg

    @abstractmethod
    def evaluate(self, ctx: EvalContext) -> EvalOutput:
        """Run the measurement; scalar keys are slash keys under the evaluator's prefix."""

    def window_lengths(self, settings: EvalSettings) -> list[int]:
        """The window lengths it reads from the validation split (checked before training)."""
        return []

    def positions(self, settings: EvalSettings, train_len: int) -> int:
        """One more than the largest token position it feeds the model (sizes learned position tables)."""
        return max([0, *self.window_lengths(settings)]) + 1
