"""The algorithmic task source (`data=task`, posab.data.tasks): each generator against hand-worked
examples and its definition, the tokenizer and the structure rule, the padded batches that score only the
answer, the configs of conf/task/ and the errors a bad task setting gets."""

from __future__ import annotations

import csv
import string
from collections import Counter

import numpy as np
import pytest
import torch

from conftest import CONF, ROOT, preset_jobs, typed_config
from posab.data import prepare_data
from posab.data.config import TaskConfig
from posab.data.tasks import TASKS, TaskExample, TaskStream, TaskTokenizer, TaskTracker, example_batch
from posab.data.tasks.generators import (
    POOL,
    addition,
    addition_indexed,
    addition_reversed,
    copy,
    flip_flop,
    mqar,
    parity,
    reverse,
    sort,
    summation,
)
from posab.data.tasks.vocab import BOS, EOS, PAD, SEP, structure, symbol_id
from posab.errors import ConfigError

TASK_NAMES = sorted(path.stem for path in (CONF / "task").glob("*.yaml"))


class Scripted:
    """A stand-in for np.random.Generator that returns the draws a hand-worked example needs, in order."""

    def __init__(self, *draws: int | list[int] | list[str]) -> None:
        self.draws = list(draws)

    def integers(self, low: int, high: int, size: int | None = None) -> int | np.ndarray:
        draw = self.draws.pop(0)
        values = np.atleast_1d(np.asarray(draw))
        assert ((low <= values) & (values < high)).all(), f"draw {draw} outside [{low}, {high})"
        return np.asarray(draw) if size is not None else int(draw)

    def permutation(self, n: int) -> np.ndarray:
        draw = self.draws.pop(0)
        assert sorted(draw) == list(range(n)), f"draw {draw} is no permutation of {n}"
        return np.asarray(draw)

    def choice(self, options: list[str], size: int, p: list[float]) -> np.ndarray:
        draw = self.draws.pop(0)
        assert len(draw) == size and set(draw) <= set(options) and abs(sum(p) - 1) < 1e-12
        return np.asarray(draw)


def symbols(text: str) -> list[int]:
    return [POOL.index(c) for c in text]


@pytest.mark.parametrize(
    ("generate", "n", "draws", "prompt", "answer"),
    [
        (copy, 3, [symbols("k3k")], "k3k", "k3k"),
        (reverse, 3, [symbols("k3a")], "k3a", "a3k"),
        (sort, 5, [symbols("k3a0z")], "k3a0z", "03akz"),  # digits before letters
        (sort, 3, [symbols("bab")], "bab", "abb"),  # repeats kept
        # the other operand's digits (1 .. n), which operand is long (0: the first), then each operand
        # from its lowest value: 507 = 100 + 407, 42 = 10 + 32
        (addition, 3, [2, 0, 407, 32], "507+42", "549"),
        (addition, 3, [2, 1, 32, 407], "42+507", "549"),
        (addition, 3, [1, 0, 899, 1], "999+1", "1000"),  # a carry lengthens the answer
        (addition, 1, [1, 0, 7, 8], "7+8", "15"),  # one digit: 0-9
        (parity, 3, [[0, 1, 1]], "011", "0"),  # two 1s: even
        (parity, 3, [[1, 1, 1]], "111", "1"),
        (summation, 3, [[3, 3, 1]], "3+3+1", "7"),
        (summation, 3, [[9, 9, 8]], "9+9+8", "6"),  # 26 mod 10
        (addition_reversed, 3, [2, 0, 407, 32], "705+24", "945"),  # 507 + 42 = 549, every number reversed
        (addition_indexed, 3, [2, 0, 407, 32], "c5b0a7+b4a2", "c5b4a9"),  # a marks the units
        # mqar: the keys' permutation (a, b, c first), the values, the order of the queries
        (mqar, 3, [list(range(26)), [3, 7, 1], [2, 0, 1]], "a3b7c1", "c1a3b7"),
        # flip-flop: the first write's bit, then per middle instruction its kind and (unless a read) its bit
        (flip_flop(0.8), 5, [1, ["i", "r", "w"], 0, 0], "w1i0r1w0r", "0"),
    ],
)
def test_each_generator_gives_the_hand_worked_example(
    generate, n: int, draws, prompt: str, answer: str
) -> None:
    assert generate(Scripted(*draws), n) == (prompt, answer)


def check_list(name: str, prompt: str, answer: str, n: int) -> None:
    assert len(prompt) == n and set(prompt) <= set(POOL)
    expected = {"copy": prompt, "reverse": prompt[::-1], "sort": "".join(sorted(prompt, key=POOL.index))}
    assert answer == expected[name]


def check_addition(prompt: str, answer: str, n: int) -> None:
    a, b = prompt.split("+")
    assert max(len(a), len(b)) == n and int(a) + int(b) == int(answer)
    assert all(len(x) == 1 or x[0] != "0" for x in (a, b, answer))  # no leading zeros


def check_parity(prompt: str, answer: str, n: int) -> None:
    assert len(prompt) == n and set(prompt) <= {"0", "1"} and answer == str(prompt.count("1") % 2)


def check_summation(prompt: str, answer: str, n: int) -> None:
    values = [int(v) for v in prompt.split("+")]
    assert len(values) == n and min(values) >= 1 and answer == str(sum(values) % 10)


def check_addition_reversed(prompt: str, answer: str, n: int) -> None:
    a, b = prompt.split("+")
    check_addition(f"{a[::-1]}+{b[::-1]}", answer[::-1], n)


def check_addition_indexed(prompt: str, answer: str, n: int) -> None:
    def digits(marked: str) -> str:
        letters, values = marked[0::2], marked[1::2]
        assert letters == string.ascii_lowercase[: len(values)][::-1]  # significance, a the units
        return values

    a, b = prompt.split("+")
    check_addition(f"{digits(a)}+{digits(b)}", digits(answer), n)


def check_addition_padded(prompt: str, answer: str, n: int) -> None:
    a, b = prompt.split("+")
    assert len(a) == len(b) == n and len(answer) == n + 1  # zero-padded: one layout per n
    assert max(len(str(int(a))), len(str(int(b)))) == n  # the longer operand has n digits, as addition's
    assert int(answer[::-1]) == int(a) + int(b)  # the sum, least significant digit first


def check_mqar(prompt: str, answer: str, n: int) -> None:
    table = {prompt[i]: prompt[i + 1] for i in range(0, len(prompt), 2)}
    assert len(prompt) == 2 * n and len(table) == n and set(table) <= set(string.ascii_lowercase)
    queries, values = answer[0::2], answer[1::2]
    assert sorted(queries) == sorted(table) and values == "".join(table[k] for k in queries)
    example = TASKS["mqar"].example(np.random.default_rng(n), n)
    assert example.given == tuple(range(0, 2 * n, 2))  # the keys: given, not written


def check_flip_flop(prompt: str, answer: str, n: int) -> None:
    instructions = [prompt[i : i + 2] for i in range(0, len(prompt), 2)]
    assert len(instructions) == n and instructions[0][0] == "w" and instructions[-1] == "r"
    memory = None
    for kind, *bit in instructions:
        assert kind in "wir" and all(b in "01" for b in bit)
        if kind == "r" and bit:
            assert bit[0] == memory  # a read inside the prompt shows the bit last written
        memory = bit[0] if kind == "w" else memory
    assert answer == memory


DEFINITIONS = {  # each task's definition, checked on its examples (a new task: add its own)
    "copy": lambda p, a, n: check_list("copy", p, a, n),
    "reverse": lambda p, a, n: check_list("reverse", p, a, n),
    "sort": lambda p, a, n: check_list("sort", p, a, n),
    "addition": check_addition,
    "parity": check_parity,
    "summation": check_summation,
    "addition_reversed": check_addition_reversed,
    "addition_indexed": check_addition_indexed,
    "addition_padded": check_addition_padded,
    "mqar": check_mqar,
    "flipflop": check_flip_flop,
}


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_example_satisfies_its_task_s_definition(name: str) -> None:
    """Every task's examples fit its token count, are written in task symbols, and (for the tasks with a
    checker here, which a new task must add) satisfy its definition."""
    task, rng, tokenizer = TASKS[name], np.random.default_rng(0), TaskTokenizer()
    assert name in DEFINITIONS, f"task {name} has no definition check in DEFINITIONS"
    least, most = task.lengths
    for n in (n for n in (1, 2, 5, 17, 26, 40) if least <= n <= (most or n)):
        for test in (None, *task.tests):
            for _ in range(20):
                example = task.example(rng, n, test)
                assert len(example.tokens) <= task.tokens(n) and example.length == n
                assert tokenizer.decode(example.tokens) == f"{example.prompt}={example.answer}"
                DEFINITIONS[name](example.prompt, example.answer, n)


def test_the_longest_example_reaches_the_stated_token_count() -> None:
    """`Task.tokens(n)` is the most an instance has (it sizes train.seq_len): reached, never passed."""
    rng = np.random.default_rng(1)
    for name, task in TASKS.items():
        for n in (n for n in (1, 3, 8) if n >= task.lengths[0]):
            lengths = [len(task.example(rng, n).tokens) for _ in range(3000)]
            assert max(lengths) == task.tokens(n), (name, n)


def test_operands_and_lengths_are_drawn_uniformly() -> None:
    stream = TaskStream(TASKS["addition"], "train", (1, 8), 0, 2**48)
    lengths = Counter(stream.example(i).length for i in range(4000))
    assert sorted(lengths) == list(range(1, 9)) and min(lengths.values()) > 400  # 500 each expected
    prompts = [stream.task.example(np.random.default_rng(i), 4).prompt.split("+") for i in range(2000)]
    leading = Counter(next(x for x in operands if len(x) == 4)[0] for operands in prompts)
    assert sorted(leading) == list("123456789") and min(leading.values()) > 150  # 222 each expected
    others = Counter(len(min(operands, key=len)) for operands in prompts)
    assert sorted(others) == [1, 2, 3, 4] and min(others.values()) > 400  # the other: U(1, 4) digits


def test_examples_are_a_function_of_seed_split_and_index() -> None:
    task = TASKS["copy"]
    train = TaskStream(task, "train", (1, 20), 0, 2**48)
    assert train.example(5) == TaskStream(task, "train", (1, 20), 0, 2**48).example(5)
    assert train.example(5) != TaskStream(task, "valid", (1, 20), 0, 256).example(5)
    assert train.example(5) != TaskStream(task, "train", (1, 20), 1, 2**48).example(5)
    test = TaskStream(task, "test", (1, 40), 0, 2**48)
    assert [e.length for e in test.examples_at(33, 4)] == [33] * 4
    assert len({e.prompt for e in test.examples_at(33, 4)}) == 4


def test_the_tokenizer_round_trips_and_refuses_unknown_symbols() -> None:
    tokenizer = TaskTokenizer()
    encoded = tokenizer.encode("12+7")
    assert encoded.tokens.tolist() == [
        BOS,
        symbol_id("1"),
        symbol_id("2"),
        symbol_id("+"),
        symbol_id("7"),
        SEP,
    ]
    assert tokenizer.encode("12+7=").tokens.tolist() == encoded.tokens.tolist()
    assert tokenizer.decode(encoded.tokens) == "12+7="
    assert tokenizer.decode([BOS, symbol_id("a"), EOS, PAD], show_special=True) == "<bos>a<eos><pad>"
    assert tokenizer.vocab_size == 4 + len(POOL) + 2 and len(tokenizer.pieces) == tokenizer.vocab_size
    with pytest.raises(ConfigError, match="'A' is no task symbol"):
        tokenizer.encode("aA")


def test_the_structure_rule_by_hand_and_the_tracker_agrees() -> None:
    """BOS 1 2 + 7 SEP 1 9 EOS: operands are sentences of paragraph 0, SEP opens the answer."""
    ids = TaskTokenizer().encode("12+7").tokens.tolist() + [symbol_id("1"), symbol_id("9"), EOS]
    sentence, paragraph = structure(np.asarray(ids))
    assert sentence.tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2]
    assert paragraph.tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    rng = np.random.default_rng(0)
    for name, task in TASKS.items():
        for n in (n for n in (1, 4, 9) if n >= task.lengths[0]):
            tokens = task.example(rng, n).tokens
            tracker = TaskTracker()
            tracked = tracker.extend(tokens[:3].tolist()), tracker.extend(tokens[3:].tolist())
            expected = structure(tokens)
            assert tracked[0][0] + tracked[1][0] == expected[0].tolist(), name
            assert tracked[0][1] + tracked[1][1] == expected[1].tolist(), name


def test_a_batch_scores_the_answer_and_its_eos_only() -> None:
    examples = [TaskExample(3, "507+42", "549"), TaskExample(1, "7+8", "15")]
    batch = example_batch(examples, 12)
    tokenizer = TaskTokenizer()
    assert tokenizer.decode(batch.inputs[0], show_special=True) == "<bos>507+42=549<eos>"  # EOS reads PAD
    assert tokenizer.decode(batch.inputs[1], show_special=True) == "<bos>7+8=15<eos>" + "<pad>" * 4
    scored = [
        tokenizer.decode(row[mask], show_special=True)
        for row, mask in zip(batch.targets, batch.loss_mask, strict=True)
    ]
    assert scored == ["549<eos>", "15<eos>"]
    assert batch.scored_tokens == 7 and batch.num_tokens == 24
    assert batch.sentence[1].tolist() == [
        0,
        0,
        1,
        1,
        2,
        2,
        2,
        2,
        2,
        2,
        2,
        2,
    ]  # padding keeps the last indices
    with pytest.raises(ConfigError, match="does not fit"):
        example_batch(examples, 10)


def test_the_loss_is_the_mean_over_answer_tokens() -> None:
    """The loss is the mean over the answer and EOS: the prompt's targets do not enter it."""
    from posab.training.losses import scored_loss, token_losses

    cfg = typed_config(["+experiment=tiny", "data=task", "task=addition", "encoding=nope"])
    from posab.build import build_model

    model = build_model(cfg, TaskTokenizer.vocab_size)
    batch = example_batch([TaskExample(3, "507+42", "549")], 12)
    losses = token_losses(model, batch)
    expected = losses[0, 7:11].mean()  # inputs SEP, 5, 4, 9 (positions 7-10) predict 5, 4, 9, EOS
    torch.testing.assert_close(scored_loss(losses, batch), expected, rtol=0, atol=0)
    batch.targets[0, :7] = (batch.targets[0, :7] + 1) % TaskTokenizer.vocab_size  # the prompt's targets
    torch.testing.assert_close(scored_loss(token_losses(model, batch), batch), expected, rtol=0, atol=0)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_each_task_config_composes_with_its_own_training_length(name: str) -> None:
    cfg = typed_config(["data=task", f"task={name}"])
    task = TASKS[name]
    assert cfg.data.source == "task" and cfg.data.task.name == name
    assert cfg.train.seq_len == cfg.data.task.seq_len == task.tokens(cfg.data.task.train_lengths[1]) - 1
    assert cfg.eval.task.enabled and not cfg.eval.perplexity.enabled and not cfg.eval.needle.enabled
    data = prepare_data(cfg.data)
    assert data.streams["valid"].fixed_windows(cfg.train.seq_len, 1000).tolist() == list(range(256))
    assert data.streams["test"].train_lengths == tuple(cfg.data.task.train_lengths)


def test_the_tasks_in_conf_are_the_generators() -> None:
    assert TASK_NAMES == sorted(TASKS)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.task.seq_len=40"], "data.task.seq_len=40: task copy's longest training example .* use 42"),
        (["data.task.name=divide"], "data.task.name='divide': use one of copy"),
        (["data.task.train_lengths=[5,2]"], r"data.task.train_lengths=\[5, 2\]: give \[low, high\]"),
        (["data.needle_rate=0.1"], "data.needle_rate=0.1 with data.source=task"),
        (
            ["task=mqar", "data.task.test_lengths=[1,30]"],
            r"test_lengths=\[1, 30\]: task mqar makes .* 1 .. 26",
        ),
        (
            ["task=flipflop", "data.task.train_lengths=[1,32]"],
            r"train_lengths=\[1, 32\]: task flipflop .* >= 2",
        ),
    ],
)
def test_bad_task_settings_are_named(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        typed_config(["data=task", *overrides])


def test_a_training_length_too_short_for_the_longest_example_is_named() -> None:
    stream = TaskStream(TASKS["copy"], "train", (1, 20), 0, 2**48)
    with pytest.raises(
        ConfigError, match="train.seq_len=30 cannot hold task copy's longest train example.*42"
    ):
        stream.fixed_windows(30, 1)


def test_the_task_section_defaults() -> None:
    assert TaskConfig().seq_len == TASKS["copy"].tokens(20) - 1


def test_the_tuning_preset_gives_every_encoding_the_same_rates_on_the_same_tasks() -> None:
    """Equal effort: every encoding of the suite at lr 1e-3, 3e-3 and 6e-3 on copy and addition, seed 0
    (the hierarchical bias on addition alone: copy has no structure)."""
    jobs = [dict(o.split("=", 1) for o in job) for job in preset_jobs("tasks_tune")]
    by_encoding: dict[str, set[tuple[str, str]]] = {}
    for job in jobs:
        by_encoding.setdefault(job["encoding"], set()).add((job["task"], job["train.lr"]))
        assert job["seed"] == "0"
    rates = {"0.001", "0.003", "0.006"}
    for encoding, points in by_encoding.items():
        tasks = {"addition"} if encoding == "hierarchical" else {"copy", "addition"}
        assert points == {(t, r) for t in tasks for r in rates}, encoding
    nope_study = {"nope", "t5", "alibi", "rope", "sinusoidal"}
    frontier = {
        "fox",
        "cope",
        "xpos",
        "randomized_rope",
        "randomized_sinusoidal",
        "swan",
        "rnope_swa",
        "stickbreaking",
    }
    others = {"learned", "kerple", "fire", "multiscale", "hierarchical", "dape_alibi"}
    assert set(by_encoding) == nope_study | frontier | others
    assert all(job.get("encoding.clamp") == "train" for job in jobs if job["encoding"] == "multiscale")
    randomized = [job for job in jobs if job["encoding"].startswith("randomized_")]
    assert randomized and all(job.get("encoding.eval_positions") == "sampled" for job in randomized)


def test_the_grid_runs_each_tuned_encoding_at_its_pick_on_each_task_for_3_seeds() -> None:
    """Issue 44's grid (`+experiment=tasks`): each encoding of the tuning at its pick in
    results/tasks/tuning/picks.csv, on the six tasks (the hierarchical bias on addition and summation, whose
    operands are its sentences), seeds 0-2, the multi-scale bias clamped and randomized positions scored at
    sampled positions, as they were tuned."""
    with (ROOT / "results" / "tasks" / "tuning" / "picks.csv").open() as file:
        picks = {row["encoding"]: row for row in csv.DictReader(file)}
    jobs = [dict(o.split("=", 1) for o in job) for job in preset_jobs("tasks")]
    six = {"copy", "reverse", "sort", "addition", "parity", "summation"}
    expected = {
        (encoding, task, str(seed))
        for encoding in picks
        for task in ({"addition", "summation"} if encoding == "hierarchical" else six)
        for seed in range(3)
    }
    assert sorted((j["encoding"], j["task"], j["seed"]) for j in jobs) == sorted(expected)
    for job in jobs:
        assert float(job["train.lr"]) == float(picks[job["encoding"]]["lr"]), job
        assert float(picks[job["encoding"]]["lr_mult"]) == 1.0 and "encoding.lr_mult" not in job, job
        assert (job.get("encoding.clamp") == "train") == (job["encoding"] == "multiscale"), job
        assert (job.get("encoding.eval_positions") == "sampled") == job["encoding"].startswith("randomized_")
    tuned = {dict(o.split("=", 1) for o in job)["encoding"] for job in preset_jobs("tasks_tune")}
    assert set(picks) == tuned


def lengths_of(batch) -> list[int]:
    """The instance lengths of a copy batch's rows: the symbols between BOS and SEP."""
    return [int((row == SEP).nonzero()[0]) - 1 for row in batch.inputs]


def test_a_length_curriculum_rises_from_the_shortest_to_the_longest_and_resumes() -> None:
    """`data.task.curriculum`: batch 0 draws the shortest length only, the longest rises linearly to the
    range's end at the curriculum's last batch; the sampler's state carries the count, so a resumed sampler
    draws what the uninterrupted one does."""
    from posab.data.sampler import TrainSampler

    stream = TaskStream(TASKS["copy"], "train", (1, 20), 0, 2**48, curriculum=10)
    # 1 + round(19 x b / 10): 1.9 -> 2, 9.5 -> 10 (half to even)
    assert [stream.longest_at(b) for b in (0, 1, 5, 10, 50)] == [1, 3, 11, 20, 20]
    assert TaskStream(TASKS["copy"], "train", (1, 20), 0, 2**48).longest_at(0) == 20  # none: every length
    sampler = TrainSampler(stream, 42, 64, 0)
    seen = [max(lengths_of(sampler.next_batch())) for _ in range(12)]
    assert seen[0] == 1 and all(s <= stream.longest_at(b) for b, s in enumerate(seen)) and seen[-1] > 15
    state = sampler.state_dict()
    assert state["drawn"] == 12
    resumed = TrainSampler(stream, 42, 64, 0)
    resumed.load_state_dict(state)
    assert torch.equal(resumed.next_batch().inputs, sampler.next_batch().inputs)
    legacy = TrainSampler(stream, 42, 64, 1)
    legacy.load_state_dict(TrainSampler(stream, 42, 64, 1).rng.bit_generator.state)  # an older checkpoint's
    assert legacy.drawn == 0 and max(lengths_of(legacy.next_batch())) == 1


def test_a_negative_curriculum_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"data.task.curriculum=-1: give the length curriculum's batches"):
        typed_config(["data=task", "task=copy", "data.task.curriculum=-1"])
