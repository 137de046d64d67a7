"""The perplexity evaluator's report columns (`posab.evaluate.perplexity`): ppl, tail and capped perplexity
and bits per byte at each length, and the evaluation corpora's ppl and tail."""

from __future__ import annotations

from collections.abc import Collection

from posab.keys import key_corpora, key_lengths, metric_key, parse_key
from posab.outputs import Column

ORDER = 10  # the evaluator's place among the others, in its runs and in a study's table
PPL_LEGEND = (
    "perplexity over fixed non-overlapping windows of {n} tokens, each scored from its own start (`ppl/{n}`)"
)
TAIL_LEGEND = "perplexity of those windows' positions past the training length only (`ppl_tail/{n}`)"
CAPPED_LEGEND = (
    "the tail tokens rescored with their context cut to the training length (`ppl_capped/{n}`): above "
    "tail@{n}, the model uses the context past the training length; equal, it ignores it; below, it hurts"
)


def report_columns(keys: Collection[str]) -> list[Column]:
    """ppl at every length, tail and capped perplexity at every length past training, bits per byte at
    the shortest and the longest length."""
    every = key_lengths(keys, "ppl")
    ends = {min(every, default=0), max(every, default=0)}
    return [
        *(Column(f"ppl@{n}", metric_key("ppl", n), ".2f", PPL_LEGEND.format(n=n)) for n in every),
        *(
            Column(f"tail@{n}", metric_key("ppl_tail", n), ".2f", TAIL_LEGEND.format(n=n))
            for n in key_lengths(keys, "ppl_tail")
        ),
        *(
            Column(f"capped@{n}", metric_key("ppl_capped", n), ".2f", CAPPED_LEGEND.format(n=n))
            for n in key_lengths(keys, "ppl_capped")
        ),
        *(
            Column(f"bpb@{n}", metric_key("bpb", n), ".3f", f"bits per text byte (`bpb/{n}`)")
            for n in key_lengths(keys, "bpb")
            if n in ends
        ),
        *(column for corpus in key_corpora(keys) for column in corpus_columns(keys, corpus)),
    ]


def corpus_columns(keys: Collection[str], corpus: str) -> list[Column]:
    """ppl at every length and the tail perplexity at the longest, on one evaluation corpus."""
    ppl = [metric_key("ppl", n, corpus=corpus) for n in key_lengths(keys, "ppl", corpus=corpus)]
    tail = [metric_key("ppl_tail", n, corpus=corpus) for n in key_lengths(keys, "ppl_tail", corpus=corpus)]
    return [
        Column(
            f"{corpus} {name}@{parse_key(key).length}", key, ".2f", f"{what} on the corpus {corpus} (`{key}`)"
        )
        for name, what, chosen in (("ppl", "ppl", ppl), ("tail", "tail perplexity", tail[-1:]))
        for key in chosen
    ]
