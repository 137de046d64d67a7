"""Randomized positions (Ruoss et al., 2023, "Randomized Positional Encodings Boost Length Generalization of
Transformers", ACL, arXiv:2305.16843): a wrapper over a position-indexed encoding (`base`) whose positions,
in a forward pass, are a sorted sample without replacement of the sequence's length from [0, L_max)
instead of first .. first + T - 1, so that training visits the positions of sequences up to L_max long.

The reference code (github.com/google-deepmind/randomized_positional_encodings,
models/positional_encodings.py, `noisy_fixed_positional_encodings`: `jrandom.choice` over
`arange(noise_max_length)` with `replace=False`, then `sort`; models/transformer.py's NOISY_* encodings)
draws a new sample at every call, in training and at evaluation alike (experiments/range_evaluation.py
passes a fresh key of `hk.PRNGSequence(1)` to every evaluation batch), with noise_max_length = 2048 for
training lengths up to 40 (experiments/example.py).

- L_max = `max_length_factor` x the training length: 8, the longest evaluation length of the study's grid
  (eval.lengths 1x .. 8x), fixed from the training length so that a tuning run (eval.lengths [512]) trains
  the same model as a main-grid run (`Dims.max_positions`, the run's largest position + 1, is 513 in the
  one and 4,609 with the shift evaluator's offsets in the other).
- Training (`self.training`): a new sample per forward pass, from a generator seeded with the run's seed
  (`Dims.seed`) and advanced per pass, kept in the module's state (checkpoints: a resumed run continues the
  same draws). Same seed, same draws, same training.
- Evaluation, `eval_positions`: `contiguous` (default) gives the base the true positions, so the model is
  a plain `base` model there: deterministic, offsets honoured, cached decoding exact. `sampled` draws per
  forward pass as the reference does, from a generator re-seeded (from the run's seed) whenever the model
  goes from training to evaluation mode, so that an evaluation (the same evaluators, lengths and windows,
  in the same order) draws the same positions every time it is run, after training or from a checkpoint
  (reproducible); offsets are ignored (the sample replaces the positions). A sorted sample spans the whole
  sequence, unknown while decoding, so a cached step is refused outside a plan: `planned_positions(total)`
  draws one sample of the whole sequence up front (posab.decoding's `generate` and `step_by_step_full` do,
  and the task evaluator per batch, for its decoding and its teacher-forced pass alike). A window of L_max
  tokens draws every position: at the longest evaluation length the two agree exactly.
  The study scores `sampled` (the method as published: evaluation positions distributed as in training at
  every length; contiguous windows shorter than L_max have gaps of 1 where training saw gaps of ~L_max / T)
  and may re-score a finished run under `contiguous` with `posab evaluate` (`same_in_training`). The
  default stays `contiguous` so that every model decodes with a cache (tests/test_cache_equivalence.py).
- Bases: an encoding acting through `embed` and `rotate` (sinusoidal, learned, RoPE, xPos; a learned table
  gets at least L_max rows), or one whose only form is an additive bias of i - j from a per-distance table
  (ALiBi, T5, KERPLE, the multi-scale bias with form=additive): with sampled positions that bias is taken
  from the base's `distance_bias` at the sampled differences p_i - p_j (a dense (1, H, c, n) bias; the
  base's Toeplitz form assumes contiguous positions). The reference's noisy ALiBi samples the distances
  instead (a Toeplitz table of sorted sampled distances, for non-causal attention); here every base sees
  positions, as the issue asks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from posab.encodings.base import POSITION_INDEXED, Dims, Encoding, Kind, Positions, Wrapping, distances
from posab.errors import ConfigError
from posab.forms import Additive, Form

EVAL_POSITIONS = ("contiguous", "sampled")
TRAIN_SEED_OFFSET = 20_000  # the training draws' generator seed = run seed + this (learned's table: 10,000)
EVAL_SEED_OFFSET = 30_000  # the evaluation draws' generator seed = run seed + this


def sorted_sample(count: int, limit: int, generator: torch.Generator) -> Tensor:
    """`count` distinct integers of [0, limit), uniformly drawn and sorted: (count,) int64 on the host."""
    return torch.randperm(limit, generator=generator)[:count].sort().values


def indexing(base: Encoding) -> str | None:
    """How sampled positions reach a base, from its declared kind: `positions` for one acting through
    embed/rotate alone (its form causal attention), `distance` for one acting only through an additive bias
    of i - j from a per-distance table fixed by the length, None for any other (not position-indexed)."""
    if base.kind in POSITION_INDEXED:
        return "positions"
    return "distance" if base.kind is Kind.DISTANCE_BIAS and base.static_form else None


class Randomized(Wrapping):
    variants = ()  # the base's context extensions (RoPE's) assume contiguous positions: none offered
    variant = Encoding.variant

    def __init__(
        self,
        dims: Dims,
        base: dict[str, Any],
        max_length_factor: int = 8,
        eval_positions: str = "contiguous",
    ) -> None:
        from posab.encodings import build_encoding  # the package builds encodings; it imports this module

        if eval_positions not in EVAL_POSITIONS:
            raise ConfigError(
                f"randomized eval_positions={eval_positions!r}: use one of {list(EVAL_POSITIONS)}"
            )
        if max_length_factor < 1:
            raise ConfigError(
                f"randomized max_length_factor={max_length_factor}: use an integer >= 1 (positions are drawn "
                "from [0, max_length_factor x train.seq_len); the study's grid: 8)"
            )
        if "_target_" not in base:
            raise ConfigError(
                f"randomized base={base!r}: name the base encoding's _target_ (RoPE, Sinusoidal)"
            )
        rows = max(dims.max_positions, max_length_factor * dims.train_len)  # a learned table covers L_max
        built = build_encoding(base, dataclasses.replace(dims, max_positions=rows))
        if isinstance(built, Randomized):
            raise ConfigError(f"randomized base {base['_target_']!r} draws its positions already")
        if indexing(built) is None:
            raise ConfigError(
                f"randomized base {base['_target_']!r} is not position-indexed: a {built.kind} encoding acts "
                f"{built.kind.acts}; use one acting through embeddings or rotations (sinusoidal, learned, "
                "rope, xpos, nope) or through a bias of i - j alone (alibi, t5, kerple, multiscale with "
                "form=additive and input raw or log)"
            )
        super().__init__(dims, built)
        self.factor, self.max_length = max_length_factor, max_length_factor * dims.train_len  # L_max
        self.indexing = indexing(built)
        self.eval_positions = eval_positions
        self.train_draws = torch.Generator().manual_seed(dims.seed + TRAIN_SEED_OFFSET)
        self.eval_draws = torch.Generator().manual_seed(dims.seed + EVAL_SEED_OFFSET)
        self._drawn: tuple[Positions, Positions] | None = None  # this pass's positions and their sample
        self._plan: Tensor | None = None  # (total,) a whole decoded sequence's sample (`planned_positions`)

    @property
    def relative_only(self) -> bool:  # type: ignore[override]  # sampled positions replace the offsets
        return self.base.relative_only and self.eval_positions == "contiguous"

    @property
    def sampling(self) -> bool:
        """Whether forward passes draw their positions now (training, or evaluation with `sampled`)."""
        return self.training or self.eval_positions == "sampled"

    @property
    def static_form(self) -> bool:  # type: ignore[override]  # the model may cache a form only when fixed
        return self.base.static_form and not self.sampling

    def train(self, mode: bool = True) -> Randomized:
        """Entering evaluation mode from training re-seeds the evaluation draws, so every evaluation draws
        alike; `eval()` on a model already evaluating (the evaluators call it before every pass) does not,
        so that successive passes draw anew, as the reference's do."""
        if self.training and not mode:
            self.eval_draws.manual_seed(self.dims.seed + EVAL_SEED_OFFSET)
        self._drawn = None  # a new mode never reuses the last pass's sample
        return super().train(mode)

    @contextmanager
    def planned_positions(self, total: int) -> Iterator[None]:
        """Evaluating `sampled`: one sorted sample of `total` positions from [0, L_max), drawn up front, for
        every pass until exit (a prompt, each cached step, a teacher-forced pass over the same sequence):
        token t gets position sample[t]. The reference draws a sample per evaluation batch; a decoder that
        writes its answer token by token needs it fixed before the first token. Inside a plan already
        long enough, or not sampling: nothing changes."""
        if (
            self.training
            or self.eval_positions != "sampled"
            or (self._plan is not None and total <= len(self._plan))
        ):
            yield
            return
        self._plan, self._drawn = self._draw(Positions.build(total)).token.cpu(), None  # (total,)
        try:
            yield
        finally:
            self._plan, self._drawn = None, None

    def positions(self, pos: Positions) -> Positions:
        """The positions the base sees in this pass: `pos` itself, or a sorted sample of [0, L_max) of its
        length, drawn once per pass (the model hands `embed`, `attention_form` and every layer's `rotate`
        the same `pos`), or within a plan (`planned_positions`) the plan's positions of `pos`."""
        if not self.sampling:
            return pos
        if self._drawn is None or self._drawn[0] is not pos:
            self._drawn = pos, self._draw(pos) if self._plan is None else self.planned(pos)
        return self._drawn[1]

    def planned(self, pos: Positions) -> Positions:
        """The plan's positions of `pos` (true positions, which index the plan)."""
        if pos.last >= len(self._plan):
            raise ConfigError(
                f"randomized positions: position {pos.last} is past the {len(self._plan)} planned; plan the "
                "whole sequence (prompt and every token written)"
            )
        token = self._plan.to(pos.token.device)[pos.token]  # (T,)
        first, largest = int(self._plan[pos.first]), int(self._plan[pos.last])
        return Positions(token, first, pos.sentence, pos.paragraph, largest=largest)

    def _draw(self, pos: Positions) -> Positions:
        if pos.length > self.max_length:
            raise ConfigError(
                f"randomized positions: a sequence of {pos.length} tokens cannot take distinct positions "
                f"from [0, {self.max_length}); raise encoding.max_length_factor (now {self.factor}) "
                "or evaluate with encoding.eval_positions=contiguous"
            )
        generator = self.train_draws if self.training else self.eval_draws
        sample = sorted_sample(pos.length, self.max_length, generator)  # (T,) on the host
        first, largest = int(sample[0]), int(sample[-1])  # host reads of a host tensor
        token = sample.to(pos.token.device)
        return Positions(token, first, pos.sentence, pos.paragraph, largest=largest)

    def embed(self, x: Tensor, pos: Positions) -> Tensor:
        return self.base.embed(x, self.positions(pos))

    def rotate(self, q: Tensor, k: Tensor, pos: Positions, layer: int = 0) -> tuple[Tensor, Tensor]:
        return self.base.rotate(q, k, self.positions(pos), layer)

    def attention_form(self, pos: Positions, queries: int, dtype: torch.dtype) -> Form:
        if self.sampling and queries < pos.length and self._plan is None:
            raise ConfigError(
                "randomized positions with eval_positions=sampled decode with a cache only within a plan of "
                "the whole sequence (`Encoding.planned_positions`, which posab.decoding's generate draws); "
                "or use encoding.eval_positions=contiguous"
            )
        seen = self.positions(pos)
        if seen is pos or self.indexing == "positions":
            return self.base.attention_form(seen, queries, dtype)
        return Additive(self.sampled_bias(seen, queries)[None], dtype, window=self.dims.window)

    def sampled_bias(self, pos: Positions, queries: int) -> Tensor:
        """The base's bias at the differences of the (non-contiguous) positions: (H, c, n) for the last
        `queries` of them, from its table over the distances -(P - 1) .. P - 1, P = the largest + 1."""
        reach = pos.last + 1
        table = self.base.distance_bias(distances(reach, pos.token.device))  # (H, 2P - 1)
        index = pos.token[-queries:, None] - pos.token[None, :] + (reach - 1)  # (c, n) table columns
        return table[:, index]  # (H, c, n)

    @classmethod
    def same_in_training(cls, setting: str, before: Any, after: Any, train_len: int) -> bool:
        """`eval_positions` acts only in evaluation mode: the weights train alike under either (the
        validation losses logged during training are measured under it, though)."""
        return setting == "eval_positions"

    def get_extra_state(self) -> Tensor:
        """The training draws' generator state (a uint8 tensor), so that a resumed run draws on."""
        return self.train_draws.get_state()

    def set_extra_state(self, state: Tensor) -> None:
        self.train_draws.set_state(state)

    def summary(self) -> dict[str, float]:
        """The base's numbers; a learned table's rows reached in training are all those below L_max."""
        numbers = self.base.summary()
        if "learned/rows_trained" in numbers:
            numbers["learned/rows_trained"] = min(self.max_length, numbers["learned/rows_allocated"])
        return numbers
