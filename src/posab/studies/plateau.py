"""Is B past the plateau? (issue 56, the study's part 13): the same encodings and seeds at two budgets, B
(the main grid's 1,000 steps) and a longer one (4B), held side by side. For each run at the longer budget it
finds the run at B of the same encoding and seed whose arm (the encoding's, the model's and the training
settings below) differs least, names what still differs, and reports, seed by seed:

- the fit at the training length (perplexity at `--length` on `--corpus`) and the validation loss;
- every ordering of two encodings at that length: at B and at the longer budget, on each seed both have,
  whether it holds or reverses;
- the flat verdict past the training length (`posab.report.flat`: the tail within 1.10x) at both budgets.

Two seeds give no test: it is descriptive (exploratory), and says so.

    posab plateau --at-b results/study/main results/study/extrapolation --longer results/study/plateau \
        --out results/study/plateau [--corpus test] [--length 512]

Writes plateau.csv (one line per encoding and seed) and plateau.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import pandas as pd

from posab.io import write_text
from posab.keys import key_lengths, metric_key
from posab.report.cli import collect_runs
from posab.report.flat import FLAT_RATIO, run_ratio
from posab.report.markdown import MISSING, markdown_table
from posab.report.records import SEQ_LEN_KEY, ReportError, RunRecord

STEPS = "train.steps"
# What makes two runs the same arm, besides the encoding's and the model's settings (encoding.*, model.*)
ARM_KEYS = ("train.lr", "train.precision", "train.batch_size", "train.seq_len", "train.weight_decay",
            "data.anchors")  # fmt: skip
ARM_PREFIXES = ("encoding.", "model.")


@dataclass(frozen=True)
class Pair:
    """One encoding and seed at both budgets."""

    short: RunRecord  # at B
    long: RunRecord  # at the longer budget
    differs: tuple[str, ...]  # the arm's settings that differ: "key: B value -> longer value"


def arm(run: RunRecord) -> dict[str, str]:
    """The settings that make a run's arm (ARM_KEYS and every encoding.* and model.* key)."""
    return {k: v for k, v in run.config.items() if k in ARM_KEYS or k.startswith(ARM_PREFIXES)}


def differences(short: RunRecord, long: RunRecord) -> tuple[str, ...]:
    """The arm's settings that both runs record and that differ between them. A setting one run lacks was
    no option when it ran (an option added later keeps the behaviour from before it as its default), and the
    report completes an encoding's options for every run (posab.report.rundirs.encoding_defaults)."""
    a, b = arm(short), arm(long)
    return tuple(f"{k}: {a[k]} -> {b[k]}" for k in sorted(a.keys() & b.keys()) if a[k] != b[k])


def steps_of(run: RunRecord) -> int:
    """The run's training budget (train.steps); a ReportError names a run without one."""
    if STEPS not in run.config:
        raise ReportError(f"run {run.name} records no `{STEPS}`: it cannot be placed at a budget")
    return int(run.config[STEPS])


def pairs(short_runs: Sequence[RunRecord], long_runs: Sequence[RunRecord]) -> list[Pair]:
    """Each finished run at the longer budget with the finished run at B of its encoding and seed, at fewer
    steps, whose arm differs least (ties: the first given); a run with none is left out."""
    found = []
    for long in (r for r in long_runs if r.finished):
        candidates = [
            s
            for s in short_runs
            if s.finished
            and s.encoding == long.encoding
            and s.seed == long.seed
            and steps_of(s) < steps_of(long)
        ]
        if candidates:
            differs, short = min(((differences(s, long), s) for s in candidates), key=lambda c: len(c[0]))
            found.append(Pair(short, long, differs))
    if not found:
        raise ReportError("no run at the longer budget has a run at B of its encoding and seed")
    return sorted(found, key=lambda p: (p.long.encoding, p.long.seed if p.long.seed is not None else -1))


def fit(run: RunRecord, length: int, corpus: str | None) -> float | None:
    """The run's perplexity at `length` on `corpus` (None: eval.split), or None."""
    return run.metrics.get(metric_key("ppl", length, corpus=corpus))


def flat_ratio(run: RunRecord, corpus: str | None) -> float | None:
    """The run's largest tail perplexity past its training length over its perplexity there, or None."""
    train_len = int(run.config[SEQ_LEN_KEY])
    lengths = [n for n in key_lengths(run.metrics, "ppl", corpus=corpus) if n > train_len]
    ratio = run_ratio(run, train_len, lengths, corpus) if lengths else None
    return None if ratio is None else ratio.ratio


def pair_frame(found: Sequence[Pair], length: int, corpus: str | None) -> pd.DataFrame:
    """plateau.csv: one line per encoding and seed."""
    return pd.DataFrame(
        [
            {
                "encoding": p.long.encoding,
                "seed": p.long.seed,
                "steps_b": steps_of(p.short),
                "steps_longer": steps_of(p.long),
                "val_loss_b": p.short.metrics.get("val_loss"),
                "val_loss_longer": p.long.metrics.get("val_loss"),
                f"ppl{length}_b": fit(p.short, length, corpus),
                f"ppl{length}_longer": fit(p.long, length, corpus),
                "ratio_b": flat_ratio(p.short, corpus),
                "ratio_longer": flat_ratio(p.long, corpus),
                "run_b": p.short.name,
                "run_longer": p.long.name,
                "differs": "; ".join(p.differs),
            }
            for p in found
        ]
    )


def orderings(frame: pd.DataFrame, length: int) -> pd.DataFrame:
    """Every ordering of two encodings at `length`, on the seeds both have at both budgets: the lower
    perplexity at B and at the longer budget, seed by seed, and on how many seeds it holds."""
    b, longer = f"ppl{length}_b", f"ppl{length}_longer"
    lines = []
    for first, second in combinations(sorted(frame["encoding"].unique()), 2):
        both = frame[frame["encoding"] == first].merge(frame[frame["encoding"] == second], on="seed")
        both = both.dropna(subset=[f"{b}_x", f"{b}_y", f"{longer}_x", f"{longer}_y"])
        if both.empty:
            continue
        at_b = [first if x < y else second for x, y in zip(both[f"{b}_x"], both[f"{b}_y"], strict=True)]
        at_long = [
            first if x < y else second for x, y in zip(both[f"{longer}_x"], both[f"{longer}_y"], strict=True)
        ]
        lines.append({
            "pair": f"{first} vs {second}",
            "seeds": len(both),
            "lower_at_b": ", ".join(at_b),
            "lower_longer": ", ".join(at_long),
            "holds": sum(x == y for x, y in zip(at_b, at_long, strict=True)),
            "gap_b": float((both[f"{b}_x"] - both[f"{b}_y"]).abs().mean()),
        })  # fmt: skip
    columns = ["pair", "seeds", "lower_at_b", "lower_longer", "holds", "gap_b"]
    return pd.DataFrame(lines, columns=columns).sort_values("gap_b", ascending=False)


def cell(value: float | None, digits: int = 2) -> str:
    return MISSING if value is None or pd.isna(value) else f"{value:.{digits}f}"


def flat_word(ratio: float) -> str:
    return "flat" if ratio <= FLAT_RATIO else "not"


def flat_cell(ratio: float | None) -> str:
    return MISSING if ratio is None or pd.isna(ratio) else f"{flat_word(ratio)} {ratio:.3f}"


def flat_changes(frame: pd.DataFrame) -> list[str]:
    """The runs whose flat verdict differs between the budgets, as "encoding seed N (flat → not)"; a run
    with a ratio missing at either budget has no verdict to compare."""
    changed = []
    for _, line in frame.iterrows():
        ratios = (line["ratio_b"], line["ratio_longer"])
        if any(ratio is None or pd.isna(ratio) for ratio in ratios):
            continue
        verdicts = [flat_word(ratio) for ratio in ratios]
        if verdicts[0] != verdicts[1]:
            changed.append(f"{line['encoding']} seed {line['seed']} ({verdicts[0]} → {verdicts[1]})")
    return changed


def run_cells(frame: pd.DataFrame, length: int) -> list[list[str]]:
    """plateau.md's first table: each encoding and seed, B -> the longer budget."""
    return [
        [
            line["encoding"],
            str(line["seed"]),
            f"{line['steps_b']:,} → {line['steps_longer']:,}",
            f"{cell(line['val_loss_b'], 3)} → {cell(line['val_loss_longer'], 3)}",
            f"{cell(line[f'ppl{length}_b'])} → {cell(line[f'ppl{length}_longer'])}",
            f"{flat_cell(line['ratio_b'])} → {flat_cell(line['ratio_longer'])}",
            line["differs"] or "none",
        ]
        for _, line in frame.iterrows()
    ]


def ordering_cells(order: pd.DataFrame) -> list[list[str]]:
    """plateau.md's second table: each ordering at B and at the longer budget."""
    return [
        [
            line["pair"],
            line["lower_at_b"],
            line["lower_longer"],
            f"{line['holds']} of {line['seeds']}",
            f"{line['gap_b']:.3f}",
        ]
        for _, line in order.iterrows()
    ]


def plateau_lines(frame: pd.DataFrame, order: pd.DataFrame, length: int, corpus: str | None) -> list[str]:
    """plateau.md."""
    where = f"`{corpus}`" if corpus else "the evaluation split"
    head = [
        "encoding",
        "seed",
        "steps",
        "val loss",
        f"ppl@{length}",
        "past the training length",
        "arm differs",
    ]
    reversed_ = order.loc[order["holds"] < order["seeds"], "pair"].tolist()
    return [
        "# Is B past the plateau? The same encodings and seeds at two budgets",
        "",
        f"Perplexity at {length} on {where}; flat: the tail within {FLAT_RATIO:.2f}× the perplexity at the "
        "training length at every longer length (on the same corpus). Exploratory: a few seeds give no test.",
        "",
        *markdown_table(head, run_cells(frame, length)),
        "",
        f"Flat verdicts that change with the budget: {', '.join(flat_changes(frame)) or 'none'}.",
        "",
        f"## Orderings at {length}: the lower perplexity, seed by seed",
        "",
        *markdown_table(
            ["pair", "lower at B", "lower at the longer budget", "holds", "mean gap at B"],
            ordering_cells(order),
        ),
        "",
        f"Orderings that do not hold on every seed: {', '.join(reversed_) or 'none'}.",
        "",
        "- arm differs: the settings of the encoding, the model and training (train.lr, precision, batch, "
        "length, weight decay, anchors) that both runs record and that differ between them",
        "- mean gap at B: the pair's mean |Δ perplexity| at B over its seeds; a small gap can flip with the "
        "seed",
        "",
    ]


def runs_of(paths: Sequence[Path]) -> list[RunRecord]:
    """The runs behind `paths`, each once: report folders often share runs (a part folds in the runs of
    another), so a run name met again is the same run, and the first met is kept."""
    found: dict[str, RunRecord] = {}
    for path in paths:
        for run in collect_runs([path]):
            found.setdefault(run.name, run)
    return list(found.values())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="posab plateau", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--at-b",
        nargs="+",
        type=Path,
        required=True,
        help="the runs at B (folders, runs.csv; may share runs)",
    )
    parser.add_argument("--longer", nargs="+", type=Path, required=True, help="the runs at the longer budget")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--corpus", help="an eval.corpora name (default: the evaluation split, eval.split)")
    parser.add_argument("--length", type=int, default=512, help="the length the fit is read at (default 512)")
    args = parser.parse_args(argv)
    corpus = args.corpus
    try:
        found = pairs(runs_of(args.at_b), collect_runs(args.longer))
    except (ReportError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    frame = pair_frame(found, args.length, corpus)
    if frame[f"ppl{args.length}_longer"].isna().all():
        print(
            f"error: --length {args.length}: no run at the longer budget has a perplexity there",
            file=sys.stderr,
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "plateau.csv", index=False)
    lines = plateau_lines(frame, orderings(frame, args.length), args.length, corpus)
    print(write_text(args.out / "plateau.md", "\n".join(lines)))
    return 0
