"""The benchmark's command line: `posab bench [--quick] [--out DIR] [--sections 1,2,3,4,5,6,7]
[--repeats N] [--threads N] [--no-progress]` (see `posab.bench`), `posab bench decoding ...`, cached
decoding against the full forward pass (`posab.bench.decoding`, its own options and folder), and `posab
bench ladder ...`, the task ladder's step times and run-hours (`posab.bench.ladder`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from posab.bench import bias, chunks, decoding, eval_forward, flops, ladder, output, peer, profile, train_step
from posab.bench.progress import Progress
from posab.bench.settings import Settings, positive
from posab.bench.targets import evaluate
from posab.paths import encoding_names

SECTIONS: dict[int, Callable[[Settings, Progress], output.Result]] = {
    1: bias.section,
    2: train_step.section,
    3: eval_forward.section,
    4: peer.section,
    5: flops.section,
    6: profile.section,
    7: chunks.section,
}


def parse_sections(text: str) -> list[int]:
    sections = sorted({int(part) for part in text.split(",") if part.strip()})
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown section(s) {unknown}; pick from {sorted(SECTIONS)}")
    return sections


def encoding_list(text: str) -> tuple[str, ...]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in encoding_names()]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown encoding(s) {unknown}; pick from {encoding_names()}")
    return tuple(dict.fromkeys(["nope", "alibi", *names]))


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="posab bench",
        description="posab performance benchmark",
        epilog="posab bench decoding --help: cached decoding against the full forward pass, per encoding; "
        "posab bench ladder --help: the task suite's model-size ladder sized to the machine",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repeat (for the tests)")
    parser.add_argument(
        "--out", type=Path, help=f"output folder (default {output.FULL_OUT}; {output.QUICK_OUT} with --quick)"
    )
    parser.add_argument("--sections", type=parse_sections, default=sorted(SECTIONS), help="e.g. 1,2,5")
    parser.add_argument(
        "--encodings",
        type=encoding_list,
        default=(),
        help="sections 2 and 3 time only these, e.g. dape_alibi (default: every encoding; NoPE and ALiBi, "
        "the ratios' references, are always added)",
    )
    parser.add_argument("--repeats", type=positive, help="timed runs (default 5; 1 with --quick)")
    parser.add_argument("--threads", type=positive, help="torch threads (default all cores; 1 with --quick)")
    parser.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        default=Progress.default(),
        help="no progress bars (default: bars when stderr is a terminal, else a line per case)",
    )
    return parser


def say(text: str) -> None:
    """A line on stdout that does not tear the progress bars."""
    tqdm.write(text)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen sections and write their tables (`posab bench decoding ...`: that benchmark instead);
    returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["decoding"]:
        return decoding.main(argv[1:])
    if argv[:1] == ["ladder"]:
        return ladder.main(argv[1:])
    args = parser().parse_args(argv)
    threads = args.threads or (1 if args.quick else None)
    if threads:
        torch.set_num_threads(threads)
    settings = Settings.build(args.quick, args.repeats, args.encodings)
    progress = Progress(args.progress)
    out = output.output_folder(args.out, args.quick)
    if args.quick and args.out is None:
        say(f"quick run: writing to {out}/ ({output.FULL_OUT}/ is left to full runs)")
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for number in progress.over(args.sections, "sections", keep=True):
        result = SECTIONS[number](settings, progress)
        say(output.section_markdown(result))
        output.write_section(out, result)
        results.append(result)
    targets = evaluate({result.key: result.rows for result in results})
    if targets:
        say(output.targets_markdown(targets))
        output.write_csv(out / "targets.csv", [target.row() for target in targets])
    (out / "bench.md").write_text(output.report(results, targets, settings), encoding="utf-8")
    say(f"wrote {out / 'bench.md'}")
    return 0
