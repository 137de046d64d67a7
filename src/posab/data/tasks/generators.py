"""The algorithmic tasks, after the NoPE study (Kazemnejad et al., NeurIPS 2023, arXiv 2305.19466, §3 and
Appendix; reference `McGill-NLP/length-generalization`, `scripts/dataset_builders/make_*_dataset.py` and
`src/data/data_instance_processor/`): each turns (a random generator, an instance length n) into a prompt
and an answer written in the task symbols (`posab.data.tasks.vocab`). The examples posab builds from them
are BOS prompt SEP answer EOS, the loss on the answer and EOS only, decoded greedily and scored by exact
match, as the reference does.

- copy: n tokens uniform with repeats -> the same (`k3k` -> `k3k`). Reference split `cmc_tr20_ts40`: 100
  tokens; here the 36 of `POOL` (digits, then letters).
- reverse: as copy, reversed (`k3a` -> `a3k`). Reference `mc_tr20_ts40`.
- sort: n items of `POOL` with repeats -> sorted in `POOL` order (`k3a` -> `3ak`). Reference
  `len_sngd_tr8_ts16`: 50 single-token items, sorted by vocabulary index.
- addition: n is the digit count of the longer operand (`507+42` -> `549`). Reference `len_tr8_ts16`: digit
  counts (d_a, d_b) in {1..8}^2, n = max(d_a, d_b); here one operand has n digits, the other U(1, n).
- parity: n bits -> `0` when the count of 1s is even, `1` when odd (`011` -> `0`). Reference `len_tr8_ts16`,
  answering "Yes" when even.
- summation: n operands, digits 1-9 -> their sum mod 10 (`3+3+1` -> `7`). Reference `tr8_ts16`, as here.
- addition_reversed, addition_indexed (issue 58): addition made learnable as the field does at small
  scale. `addition_reversed` writes the operands and the sum least significant digit first (Lee et al.,
  ICLR 2024, "Teaching Arithmetic to Small Transformers", reversed output; here the operands too, so that
  digits of one significance are read in the order they are added: `705+24` -> `945` for 507 + 42 = 549);
  `addition_indexed` marks each digit with a letter naming its significance (Zhou et al., 2024, "What
  Algorithms can Transformers Learn?", index hints: `c5b0a7+b4a2` -> `c5b4a9`, a the units), n <= 26.
- addition_padded (issue 58): Cho et al.'s format for position coupling (NeurIPS 2024, "Position Coupling:
  Improving Length Generalization of Arithmetic Transformers Using Task Structure", section 4; reference
  `HanseulJo/position-coupling`, `src/data/addition.py`): both operands n digits, zero-padded, most
  significant first, and the sum zero-padded to n + 1 digits, written least significant first
  (`507+042` -> `9450` for 507 + 42 = 549). Every instance of length n has one layout, so its coupled
  positions (`coupled_addition`) depend on n alone: the option `data.task.positions=coupled`.
- mqar (issue 58): multi-query associative recall (Arora et al., 2023, "Zoology", MQAR; reference
  `HazyResearch/zoology`, `zoology/data/multiquery_ar.py`): n key-value pairs, keys distinct letters, values
  digits (with repeats: ten digits, up to 26 keys), then every key once in a random order, each followed by
  its value (`a3b7c1` -> `c1a3b7`). The query keys are given, not written (`Task.given`): decoding feeds
  them, the loss and exact match score the values (and EOS), as the reference's labels score only the
  token after each query key. So each value is one associative hop from the key just read. (The first
  form, the queries in the prompt and the values alone as the answer, `a3b7c1,cab` -> `137`, also asked
  the model to find the i-th query from the i-th answer position: not the reference's task; its pilot is in
  results/tasks/pilot_mqar_first_form.) Trained on a
  mixture of lengths (U(1, 8)): training at the longest length alone is a known failure. n <= 26.
- flipflop (issue 58): flip-flop language modelling (Liu et al., 2023, "Exposing Attention Glitches with
  Flip-Flop Language Modeling"): n instructions, each a letter and a bit, `w` (write the bit), `i` (ignore
  it) or `r` (read: the bit last written), the first a write, the last a read whose bit is the answer
  (`w1i0r1i1r` -> `1`); a read inside the prompt shows its correct bit. Training draws ignores with
  probability 0.8 and writes and reads 0.1 each (the paper's FFL(0.8)); the test split too, and two more
  test distributions (`Task.tests`): `sparse`, ignores at 0.98, and `dense`, at 0.1, the paper's.

Where posab differs, and why: one id per symbol and no words around the data (the reference writes "Copy:
a b c", "Compute 5 3 + 1 2 ?", "The answer is 6 5 ." in T5's SentencePiece), so the sequence holds the task
and nothing else at a model ~100x smaller; 36 copy symbols rather than 100 (one small vocabulary for every
task); parity answers a digit rather than Yes/No. Numbers are written most significant digit first, as
the reference's `str(number)`. An operand of d digits is uniform on [10^(d-1), 10^d) (0-9 for one digit),
as the reference draws it; carries are neither forced nor balanced. Lengths: the issue's, from the
reference's splits: train U(1, 20), test 1 .. 40 for copy and reverse; train U(1, 8), test 1 .. 16 for
the others (`conf/task/*.yaml`); the reference's shortest training lengths were 2 (copy) and 4 (its
builders' default) where its logs do not say.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from posab.data.tasks.example import TaskExample
from posab.errors import ConfigError

POOL = string.digits + string.ascii_lowercase  # copy, reverse and sort: 36 symbols, sorted in this order
Generator = Callable[[np.random.Generator, int], tuple[str, str]]


def draw_tokens(rng: np.random.Generator, n: int) -> str:
    """n symbols of `POOL`, uniform with repeats."""
    return "".join(POOL[i] for i in rng.integers(0, len(POOL), size=n))


def copy(rng: np.random.Generator, n: int) -> tuple[str, str]:
    tokens = draw_tokens(rng, n)
    return tokens, tokens


def reverse(rng: np.random.Generator, n: int) -> tuple[str, str]:
    tokens = draw_tokens(rng, n)
    return tokens, tokens[::-1]


def sort(rng: np.random.Generator, n: int) -> tuple[str, str]:
    tokens = draw_tokens(rng, n)
    return tokens, "".join(sorted(tokens, key=POOL.index))


def operand(rng: np.random.Generator, digits: int) -> int:
    """Uniform on [10^(d-1), 10^d), 0-9 for one digit; exact for any d (Python integers)."""
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return low + int(rng.integers(0, 10**digits - low)) if digits <= 18 else big_operand(rng, digits)


def big_operand(rng: np.random.Generator, digits: int) -> int:
    """An operand of more than 18 digits: a leading digit 1-9, then uniform digits."""
    rest = rng.integers(0, 10, size=digits - 1)
    return int(str(int(rng.integers(1, 10))) + "".join(map(str, rest)))


def addition(rng: np.random.Generator, n: int) -> tuple[str, str]:
    other = int(rng.integers(1, n + 1))
    first, second = (n, other) if rng.integers(0, 2) == 0 else (other, n)
    a, b = operand(rng, first), operand(rng, second)
    return f"{a}+{b}", str(a + b)


def parity(rng: np.random.Generator, n: int) -> tuple[str, str]:
    bits = rng.integers(0, 2, size=n)
    return "".join(map(str, bits)), str(int(bits.sum()) % 2)


def summation(rng: np.random.Generator, n: int) -> tuple[str, str]:
    values = rng.integers(1, 10, size=n)
    return "+".join(map(str, values)), str(int(values.sum()) % 10)


def addition_reversed(rng: np.random.Generator, n: int) -> tuple[str, str]:
    prompt, answer = addition(rng, n)
    first, second = prompt.split("+")
    return f"{first[::-1]}+{second[::-1]}", answer[::-1]


def indexed(number: str) -> str:
    """Each digit after the letter of its significance, a the units: `507` -> `c5b0a7`."""
    return "".join(string.ascii_lowercase[len(number) - 1 - i] + digit for i, digit in enumerate(number))


def addition_indexed(rng: np.random.Generator, n: int) -> tuple[str, str]:
    prompt, answer = addition(rng, n)
    first, second = prompt.split("+")
    return f"{indexed(first)}+{indexed(second)}", indexed(answer)


def addition_padded(rng: np.random.Generator, n: int) -> tuple[str, str]:
    prompt, _ = addition(rng, n)  # addition's operands: one of n digits, the other U(1, n)
    a, b = (int(number) for number in prompt.split("+"))
    return f"{a:0{n}d}+{b:0{n}d}", f"{a + b:0{n + 1}d}"[::-1]


def coupled_addition(n: int, start: int = 1) -> np.ndarray:
    """Position coupling for `addition_padded` (Cho et al., 2024, section 4; the reference's
    `AdditionDatasetWithCoupledPositions`): the position of every token of BOS a + b SEP sum EOS at instance
    length n, from `start` (the reference's: 1, a training draw U(1, max_position - n - 1)). The digit of
    significance s, in either operand or in the sum, is at start + n - s; the '+' and the SEP after the
    operands, and the EOS after the sum, at start + n + 1 (the reference's `end`); the BOS at 0."""
    operand = [*range(start + 1, start + n + 1), start + n + 1]  # n digits, most significant first; '+'|SEP
    answer = list(range(start + n, start - 1, -1))  # n + 1 digits, least significant first
    return np.array([0, *operand, *operand, *answer, start + n + 1], dtype=np.int64)


KEYS = string.ascii_lowercase  # mqar's keys: distinct letters
FLIP_FLOP_IGNORES = {"train": 0.8, "sparse": 0.98, "dense": 0.1}  # p(ignore), Liu et al. (2023), section 3


def mqar(rng: np.random.Generator, n: int) -> tuple[str, str]:
    keys = [KEYS[i] for i in rng.permutation(len(KEYS))[:n]]
    values = [str(v) for v in rng.integers(0, 10, size=n)]
    pairs = [k + v for k, v in zip(keys, values, strict=True)]
    return "".join(pairs), "".join(pairs[i] for i in rng.permutation(n))


def mqar_given(n: int) -> tuple[int, ...]:
    """mqar's given answer symbols: the query keys, every other symbol from the first."""
    return tuple(range(0, 2 * n, 2))


def flip_flop(ignore: float) -> Generator:
    """Flip-flop instructions with ignores drawn at probability `ignore` (module docstring)."""

    def generate(rng: np.random.Generator, n: int) -> tuple[str, str]:
        if n < 2:
            raise ConfigError(f"flipflop instance length {n}: a write and a read need n >= 2")
        memory = str(int(rng.integers(0, 2)))
        parts = [f"w{memory}"]
        for kind in rng.choice(["w", "i", "r"], size=n - 2, p=[(1 - ignore) / 2, ignore, (1 - ignore) / 2]):
            bit = memory if kind == "r" else str(int(rng.integers(0, 2)))
            memory = bit if kind == "w" else memory
            parts.append(f"{kind}{bit}")
        return "".join(parts) + "r", memory

    return generate


@dataclass(frozen=True)
class Task:
    """A task: its generator, the most tokens (BOS prompt SEP answer EOS) an instance of length n has, the
    instance lengths it can make, and further test distributions the task evaluator scores beside its own
    (`tests`: name -> generator; flip-flop's sparse and dense)."""

    name: str
    generate: Generator
    tokens: Callable[[int], int]  # n -> the most tokens an instance of length n has
    lengths: tuple[int, int | None] = (1, None)  # the instance lengths it can make: [low, high or no bound]
    tests: dict[str, Generator] = field(default_factory=dict)
    family: str = "sequence"  # the tasks tuned together (issue 58): sequence, arithmetic, recall, state
    # position coupling (`data.task.positions=coupled`): (n, start) -> the position of every token of an
    # instance of length n, one layout per n; None where the task defines none
    coupled: Callable[[int, int], np.ndarray] | None = None
    # n -> the answer's symbols the reader supplies (`TaskExample.given`: fed, never written nor scored);
    # None where the model writes the whole answer
    given: Callable[[int], tuple[int, ...]] | None = None

    def example(self, rng: np.random.Generator, n: int, test: str | None = None) -> TaskExample:
        """An example of length n, by the task's generator or by its test distribution `test`."""
        prompt, answer = (self.generate if test is None else self.tests[test])(rng, n)
        return TaskExample(n, prompt, answer, () if self.given is None else self.given(n))

    def check_lengths(self, low: int, high: int, what: str) -> None:
        """A ConfigError naming `what` unless the task can make instances of lengths low .. high."""
        least, most = self.lengths
        if low < least or (most is not None and high > most):
            bound = f"{least} .. {most}" if most is not None else f">= {least}"
            raise ConfigError(f"{what}=[{low}, {high}]: task {self.name} makes instances of lengths {bound}")


TASKS = {
    task.name: task
    for task in (
        Task("copy", copy, lambda n: 2 * n + 3),
        Task("reverse", reverse, lambda n: 2 * n + 3),
        Task("sort", sort, lambda n: 2 * n + 3),
        Task("addition", addition, lambda n: 3 * n + 5, family="arithmetic"),  # n + 1 + n digits, a carry
        Task("parity", parity, lambda n: n + 4, family="arithmetic"),
        Task(
            "summation", summation, lambda n: 2 * n + 3, family="arithmetic"
        ),  # n digits, n - 1 '+', a digit
        Task(
            "addition_reversed", addition_reversed, lambda n: 3 * n + 5, family="arithmetic"
        ),  # as addition's
        Task("addition_indexed", addition_indexed, lambda n: 6 * n + 6, (1, 25), family="arithmetic"),
        Task(
            "addition_padded",
            addition_padded,
            lambda n: 3 * n + 5,
            family="arithmetic",
            coupled=coupled_addition,
        ),  # BOS, n digits, '+', n digits, SEP, n + 1 digits, EOS
        Task(
            "mqar", mqar, lambda n: 4 * n + 3, (1, len(KEYS)), family="recall", given=mqar_given
        ),  # BOS, n pairs, SEP, n queries and values, EOS
        Task(
            "flipflop",
            flip_flop(FLIP_FLOP_IGNORES["train"]),
            lambda n: 2 * n + 3,  # 2n - 1 symbols, one bit
            (2, None),
            {name: flip_flop(p) for name, p in FLIP_FLOP_IGNORES.items() if name != "train"},
            family="state",
        ),
    )
}


def task_named(name: str) -> Task:
    if name not in TASKS:
        raise ConfigError(f"data.task.name={name!r}: use one of {', '.join(TASKS)}")
    return TASKS[name]
