"""Section 7: the chunked core's one chunk-size rule, measured (issue 57).

Every kernel on the chunked core (`posab.forms.chunked.Kernel`) runs its backward pass, and its explicit
forward pass, over chunks of `chunk` query rows. The rule, the same for every kernel: a kernel's `chunk` is
a power of two in CHUNK_ROWS whose training step, at the default training shape (`Trainer.step` of the
encoding in KERNEL_RUNS, timed interleaved with every other kernel's and chunk's step), is within TOLERANCE
of the fastest one's. The tolerance keeps a chunk that a rerun cannot tell from the fastest: the chunk
fixes the order in which dk and dv sum over chunks, so changing it changes every committed number of the
kernel's runs. tests/test_bench.py holds every kernel's `chunk` to the committed table,
results/bench/chunks/section7_chunks.csv (`posab bench --sections 7 --repeats 15 --out
results/bench/chunks`, on a quiet machine), and every `Kernel` subclass to a row of KERNEL_RUNS. PaTH's
kernel (`encodings.path_kernel.PathAttention`), which has its own backward pass over chunks of tokens,
declares its `chunk` by the same rule (OWN_CHUNKED; `posab bench --sections 7 --encodings path --repeats 15
--out results/bench/path_chunks`): with `--encodings`, the section times only those encodings' kernels and
the references' that `--encodings` always adds (ALiBi's: the additive kernel).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from posab.bench.inputs import posab_model
from posab.bench.measure import median_times
from posab.bench.output import Result
from posab.bench.progress import Progress
from posab.bench.settings import Settings
from posab.bench.steps import training_step
from posab.encodings.cope_kernel import Counting
from posab.encodings.dape_kernel import Mixing
from posab.encodings.fox_kernel import Forgetful
from posab.encodings.path_kernel import PathAttention
from posab.forms.chunked import Kernel
from posab.forms.kernels import Biased

CHUNK_ROWS = (8, 16, 32, 64, 128)  # query rows per chunk, the candidates of the rule
TOLERANCE = 0.05  # a chunk within 5% of the fastest step stands (a rerun of section 2 agrees to ~2%)
# each kernel and the encoding whose training step runs on it (the additive kernel: every additive bias)
KERNEL_RUNS: dict[type[Kernel], str] = {
    Biased: "alibi",
    Forgetful: "fox",
    Counting: "cope",
    Mixing: "dape_alibi",
}
OWN_CHUNKED: dict[type, str] = {PathAttention: "path"}  # kernels off the core that read a `chunk` alike


@contextlib.contextmanager
def chunked_by(kernel: type, rows: int) -> Iterator[None]:
    """`kernel.chunk` set to `rows` while inside (the kernels read it at every pass)."""
    declared = kernel.chunk
    kernel.chunk = rows
    try:
        yield
    finally:
        kernel.chunk = declared


def step_chunked_by(kernel: type, rows: int, step: Callable[[], object]) -> Callable[[], object]:
    """`step` run with `kernel.chunk` set to `rows`."""

    def run() -> object:
        with chunked_by(kernel, rows):
            return step()

    return run


def section(settings: Settings, progress: Progress) -> Result:
    result = Result("section7_chunks", "7. The chunked core's chunk size: training step per kernel and chunk")
    runs: dict[type, str] = {**KERNEL_RUNS, **OWN_CHUNKED}
    chosen = set(settings.encodings) or set(runs.values())
    kernels = {kernel.__name__: kernel for kernel, encoding in runs.items() if encoding in chosen}
    cases = [(name, rows) for name in kernels for rows in CHUNK_ROWS]
    steps = []
    for name, rows in progress.over(cases, "section 7"):
        cfg = settings.config(runs[kernels[name]])
        steps.append(step_chunked_by(kernels[name], rows, training_step(posab_model(cfg), cfg)))
    progress.note(f"{len(cases)} steps ({len(kernels)} kernels x {len(CHUNK_ROWS)} chunks), interleaved")
    times = dict(zip(cases, median_times(steps, settings.warmup, settings.repeats), strict=True))
    for name, kernel in kernels.items():
        fastest = min(times[name, rows] for rows in CHUNK_ROWS)
        for rows in CHUNK_ROWS:
            ratio = times[name, rows] / fastest
            result.rows.append(
                {
                    "kernel": name,
                    "encoding": runs[kernel],
                    "rows": rows,
                    "step_s": times[name, rows],
                    "ratio_to_fastest": ratio,
                    "within_tolerance": ratio <= 1 + TOLERANCE,
                    "declared": rows == kernel.chunk,
                }
            )
    return result
