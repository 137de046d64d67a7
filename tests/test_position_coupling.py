"""Position coupling (issue 58; Cho et al., NeurIPS 2024): `addition_padded`'s format and coupled positions
worked by hand, digits of one significance at one position, batches that share their positions, the
configuration's errors, models that read given positions (and those that refuse them), cached decoding at
coupled positions equal to full decoding, and a coupled run through train.py's path."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import ENCODINGS, run_main, typed_config
from posab.build import build_model
from posab.data import prepare_data
from posab.data.tasks import TaskStream, TaskTokenizer, task_named
from posab.data.tasks.generators import addition_padded, coupled_addition
from posab.decoding import generate, step_by_step_full
from posab.encodings.base import reads_given_positions
from posab.errors import ConfigError

COUPLED = ["data=task", "task=addition_padded", "data.task.positions=coupled"]
COUPLED_COPY = ["data=task", "task=copy", "data.task.positions=coupled"]


def test_addition_padded_and_its_coupled_positions_by_hand() -> None:
    """507 + 42 at n = 3: BOS 5 0 7 + 0 4 2 SEP 9 4 5 0 EOS; the digit of significance s at 1 + 3 - s, the
    '+', SEP and EOS at 5, the BOS at 0 (the reference's start 1, end 5)."""
    assert coupled_addition(3).tolist() == [0, 2, 3, 4, 5, 2, 3, 4, 5, 4, 3, 2, 1, 5]
    assert coupled_addition(3, start=4).tolist() == [0, 5, 6, 7, 8, 5, 6, 7, 8, 7, 6, 5, 4, 8]
    for seed in range(20):
        prompt, answer = addition_padded(np.random.default_rng(seed), 3)
        a, b = prompt.split("+")
        assert len(a) == len(b) == 3 and len(answer) == 4
        assert int(answer[::-1]) == int(a) + int(b)
    assert task_named("addition_padded").tokens(3) == len(coupled_addition(3)) == 14


@pytest.mark.parametrize(("n", "start"), [(1, 1), (4, 1), (7, 3)])
def test_digits_of_one_significance_share_one_position(n: int, start: int) -> None:
    positions = coupled_addition(n, start)
    first, second = positions[1 : n + 1], positions[n + 2 : 2 * n + 2]  # most significant first
    answer = positions[2 * n + 3 : 3 * n + 4]  # least significant first
    for significance in range(n):
        at = n - 1 - significance
        assert first[at] == second[at] == answer[significance], significance
    assert answer[n] == start  # the carry digit, one significance higher than any operand's


def coupled_streams(*overrides: str) -> dict[str, TaskStream]:
    cfg = typed_config(["+experiment=tiny", *COUPLED, *overrides])
    return prepare_data(cfg.data).streams  # type: ignore[return-value]


def test_a_coupled_batch_shares_one_instance_length_and_its_positions() -> None:
    streams = coupled_streams()
    train, valid = streams["train"], streams["valid"]
    limit = train.max_position
    assert limit is not None
    for first in range(40):
        indices = [first, first + 1000, first + 2000, first + 3000]
        batch = train.batch(indices, train.longest)
        n = train.example(first).length
        assert {train.example(i, n).length for i in indices} == {n}
        assert batch.positions is not None and batch.positions.shape == (train.longest,)
        start = int(batch.positions[1]) - 1  # the most significant digit of the first operand: start + 1
        assert 1 <= start <= limit - n - 1 and int(batch.positions.max()) <= limit
        assert torch.equal(batch.positions[: 3 * n + 4], torch.from_numpy(coupled_addition(n, start)[:-1]))
    fixed = valid.batch([0, 1, 2], valid.longest)
    assert fixed.positions is not None and int(fixed.positions[1]) == 2  # validation starts at 1


def test_sequential_tasks_keep_their_batches() -> None:
    stream = prepare_data(typed_config(["+experiment=tiny", "data=task", "task=addition_padded"]).data)
    batch = stream.streams["train"].batch([0, 1, 2], stream.streams["train"].longest)  # type: ignore[attr-defined]
    assert batch.positions is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.task.positions=sideways"], "use one of sequential, coupled"),
        (["data.task.max_position=10"], "use an integer >= 18"),
        (["data.task.max_position=null"], "use an integer >= 18"),
    ],
)
def test_coupling_errors_name_the_bad_value_and_what_is_valid(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        typed_config(["+experiment=tiny", *COUPLED, *overrides])
    with pytest.raises(ConfigError, match="defines no position coupling; tasks that do: addition_padded"):
        typed_config(["+experiment=tiny", *COUPLED_COPY])


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_coupled_runs_build_only_encodings_that_read_given_positions(encoding: str) -> None:
    cfg = typed_config(["+experiment=tiny", *COUPLED, f"encoding={encoding}"])
    plain = build_model(typed_config(["+experiment=tiny", f"encoding={encoding}"]), 16)
    if reads_given_positions(plain.encoding):
        build_model(cfg, TaskTokenizer.vocab_size)
        return
    with pytest.raises(ConfigError, match=f"encoding={encoding} .* use one of those"):
        build_model(cfg, TaskTokenizer.vocab_size)
    with pytest.raises(ConfigError, match="only encodings that read each token's own position"):
        plain(torch.zeros(1, 4, dtype=torch.long), positions=torch.arange(4))


READERS = ["sinusoidal", "learned", "rope", "xpos"]


@pytest.mark.parametrize("encoding", READERS)
def test_given_positions_are_read_and_decode_alike_with_and_without_the_cache(encoding: str) -> None:
    """0 .. T - 1 given equal the default; coupled positions change the logits; greedy decoding with the
    cache at coupled positions writes what full forward passes at them write."""
    torch.manual_seed(0)
    model = build_model(typed_config(["+experiment=tiny", *COUPLED, f"encoding={encoding}"]), 48).eval()
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if weight.dim() == 2 and not name.startswith("encoding."):
                weight.normal_(0, 4.0 / weight.shape[1] ** 0.5)
    tokens = torch.randint(4, 48, (2, 14))
    with torch.no_grad():
        default, given = model(tokens), model(tokens, positions=torch.arange(14))
        coupled = model(tokens, positions=torch.from_numpy(coupled_addition(3)))
    assert torch.equal(default, given)
    assert not torch.allclose(default, coupled)
    positions = torch.from_numpy(coupled_addition(6, start=5))  # (23,)
    prompt = torch.randint(4, 48, (2, 15))  # BOS, 6 digits, '+', 6 digits, SEP at n = 6
    cached = generate(model, prompt, 8, positions=positions)
    full = step_by_step_full(model, prompt, 8, positions=positions)
    assert torch.equal(cached, full)
    assert not torch.equal(cached, generate(model, prompt, 8))  # the positions reach the decoding


def test_decoding_refuses_positions_it_cannot_place() -> None:
    model = build_model(typed_config(["+experiment=tiny", *COUPLED, "encoding=learned"]), 48).eval()
    prompt = torch.randint(4, 48, (1, 6))
    with pytest.raises(ConfigError, match=r"give \(T \+ steps - 1,\) = \(9,\) or longer"):
        generate(model, prompt, 4, positions=torch.arange(8))
    with pytest.raises(ConfigError, match="offset=2 with positions given"):
        generate(model, prompt, 4, positions=torch.arange(9), offset=2)


def test_a_coupled_addition_run_trains_and_scores_at_coupled_positions(tmp_path: Path) -> None:
    overrides = [
        *COUPLED,
        "encoding=learned",
        "model=tiny",
        "data.task.test_lengths=[1,10]",
        "data.task.max_position=12",
        "train.steps=6",
        "train.batch_size=4",
        "train.warmup_steps=1",
        "train.val_every=3",
        "train.checkpoint_every=6",
        "train.progress=false",
        "eval.progress=false",
        "eval.task.examples=2",
    ]
    results = run_main(overrides, tmp_path)
    assert results["status"] == "finished" and math.isfinite(results["val_loss"])
    assert {f"task/exact@{n}" for n in range(1, 11)} <= set(results["eval"])
