"""The loop core both trainings run (`posab.training.loop`): cadence, a clean stop on a signal, resuming."""

from __future__ import annotations

import os
import signal

import pytest

from posab.errors import Preempted
from posab.training.loop import Cadence, LoopState, run_steps, warmup_cosine


def test_the_loop_checkpoints_at_its_cadence_stops_on_a_signal_and_resumes() -> None:
    state, saved, seen = LoopState(), [], []
    cadence = Cadence(total=10, log_every=3, checkpoint_every=4, name="toy", show_progress=False)

    def step() -> float:
        if state.step == 5:  # SIGTERM during step 6: it ends, is checkpointed, then the loop stops
            os.kill(os.getpid(), signal.SIGTERM)
        return float(state.step)

    def after_step(seconds: float, bar: object) -> None:
        assert seconds >= 0
        seen.append(state.step)

    def checkpoint() -> None:
        saved.append(state.step)

    with pytest.raises(Preempted, match="signal 15 at toy step 6: checkpoint saved"):
        run_steps(state, cadence, step, after_step, checkpoint)
    assert saved == [4, 6] and seen == [1, 2, 3, 4, 5, 6]
    assert state.step == 6 and state.recent_losses == [3.0, 4.0, 5.0] and state.time_s > 0
    run_steps(state, cadence, lambda: float(state.step), after_step, checkpoint)  # the rerun resumes
    assert saved == [4, 6, 8, 10] and seen[6:] == [7, 8, 9, 10] and state.recent_losses == [7.0, 8.0, 9.0]


@pytest.mark.parametrize("another_rank_stops", [True, False])
def test_a_signal_on_any_rank_stops_every_rank(another_rank_stops: bool) -> None:
    """`stop_everywhere` (the trainer's `any_rank`) decides: another rank's signal stops this one too, at the
    same step, after its checkpoint."""
    state, saved = LoopState(), []
    cadence = Cadence(total=5, log_every=1, checkpoint_every=100, name="train", show_progress=False)

    def stop_everywhere(signal_here: bool) -> bool:
        return signal_here or another_rank_stops

    def run() -> None:
        run_steps(
            state, cadence, lambda: 0.0, lambda s, b: None, lambda: saved.append(state.step), stop_everywhere
        )

    if another_rank_stops:
        with pytest.raises(Preempted, match="at train step 1"):
            run()
        assert saved == [1]
    else:
        run()
        assert saved == [5]  # no signal anywhere: only the last step's checkpoint


def test_warmup_cosine() -> None:
    assert [warmup_cosine(s, 4, 20, 0.1) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert warmup_cosine(12, 4, 20, 0.1) == pytest.approx(0.55)  # halfway through the decay
    assert warmup_cosine(20, 4, 20, 0.1) == pytest.approx(0.1) and warmup_cosine(99, 4, 20, 0.1) == 0.1
    assert {warmup_cosine(s, 4, 20, 1.0) for s in range(3, 30)} == {1.0}  # min_ratio 1: constant
    assert warmup_cosine(0, 0, 10, 0.1) == 1.0  # no warmup
