"""Perplexity at several lengths on the same tokens, tail and context-capped perplexity, per-position loss.

Protocol: windows of the longest evaluation length Lmax, the same fixed, non-overlapping windows for every
run (`TokenStream.fixed_windows`: evenly spread over the evaluation split, `eval.split`), max(1,
token_budget // Lmax) of them where the split has that many (`windows` fixes the count); an evaluation
corpus with `windows_per_document` k has k windows inside each document instead
(`TokenStream.document_windows`), whatever the budget. At every length
L (each must divide Lmax) each window is cut into Lmax / L chunks of L tokens, each scored from its own
start (positions 0..L-1, no context carried over): every length scores exactly the same tokens, so a
difference between lengths is the length, not the text. perplexity = exp(total loss / scored tokens).

- `loss/L`, `ppl/L`, `bpb/L` (bits per text byte), `position_loss/L` (mean loss per position, in
  `position_bins` equal-width bins), `ppl_windows/L` (chunks scored).
- L above the training length T: `loss_tail/L`, `ppl_tail/L`, the loss on chunk positions >= T only (`ppl/L`
  also averages the first T in-distribution positions); `loss_capped/L`, `ppl_capped/L`, the same tail
  tokens scored with their context cut to the training length: windows of T tokens ending at each block of
  `capped_stride` tail tokens, which they score (each tail token sees between T - capped_stride and T - 1
  tokens of context, at positions < T). `loss_capped - loss_tail` > 0: the model uses the context past T;
  ~ 0: it ignores it; < 0: the long context hurts (extrapolation failure).
- `loss_docmean/L`, `ppl_docmean/L`: the mean over documents of each document's mean token loss (a long
  document does not dominate), when the split records its documents.
- `ppl_sliding/L` with `stride`: sliding-window perplexity over the first windows' span of the split.
- The per-window mean losses (`loss/L`, `loss_tail/L`, `loss_capped/L`, one value per window of Lmax, in
  window order), the window starts and each window's document (`documents`, where the split records its
  documents: the one holding most of the window's targets) go to the `perplexity_windows` arrays
  (`perplexity_windows.npz`), so that runs can be paired window by window and windows resampled within
  documents.

Encodings with evaluation-time variants (`Encoding.variants`: the context extensions `pi`, `ntk`, `yarn`
of `posab.encodings.base.CONTEXT_EXTENSIONS`, which RoPE offers), at each length L past the training
length: the same chunks are scored again under each variant listed in `eval.perplexity.rope_scaling` at
scale factor s = L / train_len (or `eval.perplexity.rope_scaling_factor`), as `loss@KIND/L`, `ppl@KIND/L`,
`bpb@KIND/L`, `position_loss@KIND/L`, `ppl_windows@KIND/L`, the tail of those scaled losses
(`loss_tail@KIND/L`, `ppl_tail@KIND/L`: positions >= T), `loss_docmean@KIND/L` and `ppl_docmean@KIND/L`,
and the per-window losses `loss@KIND/L` and `loss_tail@KIND/L` in the `perplexity_windows` arrays
(`none` is the plain rows; at L <= T every variant would equal `none`, so those rows are left out).
Capped perplexity is not measured under a variant: it scores inputs of the training length, which the
variants exist to go beyond. Keys: `posab.keys`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from posab.catalog import perplexity as perplexity_columns
from posab.encodings.base import CONTEXT_EXTENSIONS
from posab.errors import require
from posab.evaluate.base import Evaluator, SectionConfig
from posab.evaluate.context import EvalContext, EvalSettings
from posab.keys import metric_key
from posab.outputs import Curves, EvalOutput, Table
from posab.results import bin_centres, bin_edges


@dataclass
class PerplexityConfig(SectionConfig):
    token_budget: int = 131072  # tokens scored at every length: max(1, budget // Lmax) windows of Lmax
    windows: int | None = None  # a fixed number of windows of the longest length instead of the budget
    position_bins: int = 32  # per-position loss: equal-width bins over each chunk
    stride: int | None = None  # also report sliding-window perplexity with this stride
    capped_stride: int = 128  # ppl_capped: tail tokens scored per window of the training length
    # encodings with evaluation-time variants (RoPE's context extensions), at lengths past the training
    # length: extra rows `ppl@KIND/L` (see `Encoding.variants`); "none" is the model as trained
    rope_scaling: list[str] = field(default_factory=lambda: ["none", *CONTEXT_EXTENSIONS])
    rope_scaling_factor: float | None = None  # None: s = L / training length; else this fixed s >= 1

    def validate(self, settings: EvalSettings) -> None:
        p = "eval.perplexity"
        kinds, factor, known = self.rope_scaling, self.rope_scaling_factor, ("none", *CONTEXT_EXTENSIONS)
        bad_kinds = sorted(set(kinds) - set(known)) or sorted({k for k in kinds if kinds.count(k) > 1})
        require(not bad_kinds, f"{p}.rope_scaling={kinds}: each of {'/'.join(known)} once; bad: {bad_kinds}")
        require(factor is None or factor >= 1, f"{p}.rope_scaling_factor={factor} must be >= 1, or null")
        require(self.token_budget > 0, f"{p}.token_budget={self.token_budget} must be positive")
        require(self.windows is None or self.windows > 0, f"{p}.windows={self.windows} must be positive")
        require(self.position_bins > 0, f"{p}.position_bins={self.position_bins} must be positive")
        require(self.stride is None or self.stride > 0, f"{p}.stride={self.stride} must be positive")
        require(self.capped_stride > 0, f"{p}.capped_stride={self.capped_stride} must be positive")
        if self.enabled:
            longest = max(settings.lengths, default=1)
            bad = [n for n in settings.lengths if longest % n]
            require(
                not bad,
                f"eval.lengths={settings.lengths}: every length must divide the longest ({longest}), so that "
                f"every length scores the same tokens; bad: {bad}",
            )


def window_count(cfg: PerplexityConfig, length: int) -> int:
    """Windows of the longest length `length`: `windows`, or as many as the token budget pays for."""
    return cfg.windows if cfg.windows is not None else max(1, cfg.token_budget // length)


def chunk_starts(window_starts: np.ndarray, longest: int, length: int) -> np.ndarray:
    """Starts of the chunks of `length` tokens that tile each window of `longest`: (N * longest / length,),
    window by window."""
    offsets = np.arange(0, longest, length)  # (k,)
    return (window_starts[:, None] + offsets[None, :]).reshape(-1)  # (N, k) -> (N * k,)


def token_losses(ctx: EvalContext, starts: np.ndarray, length: int, desc: str = "ppl") -> Tensor:
    """Per-token loss of each window: (N, L) float32 on the CPU; an inner progress bar `desc` counts the
    batches."""
    rows = []
    size = ctx.batch_size(length)
    for i in ctx.bar(range(0, len(starts), size), desc, inner=True, unit="batch"):
        batch = ctx.valid.batch(starts[i : i + size], length)
        logits = ctx.logits(batch.inputs, batch.sentence, batch.paragraph)  # (B, L, V)
        loss = F.cross_entropy(
            logits.flatten(0, 1), batch.targets.flatten().to(logits.device), reduction="none"
        )
        rows.append(loss.view(batch.targets.shape).cpu())  # (B*L,) -> (B, L)
    return torch.cat(rows)


def binned(curve: Tensor, bins: int) -> list[float]:
    """(L,) -> `bins` means over equal-width position ranges (`bin_edges`; fewer when L < bins)."""
    edges = bin_edges(len(curve), bins)
    return [float(curve[a:b].mean()) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def sliding_loss(ctx: EvalContext, length: int, stride: int, span: int) -> float:
    """Mean loss over the first `span` tokens of the split, each scored with up to `length` tokens of context.

    Windows of `length` tokens advance by `stride`; the first window scores all its tokens, every later one
    only its last `stride` tokens (tokens already scored are not scored again).
    """
    span = min(span, len(ctx.valid) - 1)
    starts = np.arange(0, max(1, span - length + 1), stride)
    losses = token_losses(ctx, starts, min(length, span), f"ppl sliding L={length}")  # (N, L)
    total = float(losses[0].sum())
    count = losses.shape[1]
    scored_tail = min(stride, losses.shape[1])
    total += float(losses[1:, -scored_tail:].sum())
    count += scored_tail * (len(starts) - 1)
    return total / count


def target_bytes(ctx: EvalContext, starts: np.ndarray, length: int) -> int:
    """How many text bytes the scored tokens of these windows stand for (anchors count 0)."""
    targets = ctx.valid.batch(starts, length).targets.numpy()  # (N, L)
    return int(ctx.token_bytes[targets].sum())


def loss_rows(
    losses: Tensor, length: int, bins: int, n_bytes: int, variant: str | None = None
) -> dict[str, Any]:
    """(N, L) per-token losses -> `loss/L`, `ppl/L`, `bpb/L`, `position_loss/L` (`loss@VARIANT/L`, ...
    under an evaluation-time variant).

    bpb: bits per text byte, total loss / ln 2 / the bytes the scored tokens stand for; unlike per-token
    loss it compares runs whose token streams differ (anchors on/off, bytes vs BPE)."""
    mean = float(losses.mean())
    values = {
        "loss": mean,
        "ppl": math.exp(mean),
        "bpb": float(losses.sum()) / math.log(2) / max(n_bytes, 1),
        "position_loss": binned(losses.mean(dim=0), bins),
    }
    return {metric_key(metric, length, variant=variant): value for metric, value in values.items()}


def scaled_losses(ctx: EvalContext, starts: np.ndarray, length: int) -> dict[str, Tensor]:
    """Per-token losses (N, L) of the windows under each evaluation-time variant of the encoding listed in
    `eval.perplexity.rope_scaling` (`none` excluded); empty for encodings without variants and up to the
    training length."""
    encoding, settings = ctx.model.encoding, ctx.cfg.perplexity
    kinds = [kind for kind in settings.rope_scaling if kind in encoding.variants]
    if not kinds or length <= ctx.train_len:
        return {}
    fixed = settings.rope_scaling_factor
    factor = length / ctx.train_len if fixed is None else fixed
    out: dict[str, Tensor] = {}
    for kind in kinds:
        with encoding.variant(kind, factor, ctx.train_len):
            out[kind] = token_losses(ctx, starts, length, f"ppl@{kind} L={length}")
    return out


def capped_tail_losses(ctx: EvalContext, starts: np.ndarray, length: int, stride: int) -> Tensor:
    """Losses of chunk positions train_len..length-1, each scored in a window of train_len tokens that ends
    with its block of `stride` positions: (N, length - train_len) on the CPU."""
    cap = ctx.train_len
    ends = [*range(cap + stride, length, stride), length]  # exclusive block ends within the chunk
    firsts = [cap, *ends[:-1]]
    windows = (starts[:, None] + (np.asarray(ends) - cap)[None, :]).reshape(-1)  # (N, blocks) -> (N*blocks,)
    losses = token_losses(ctx, windows, cap, f"ppl capped L={length}")  # (N * blocks, T)
    losses = losses.view(len(starts), len(ends), cap)  # (N * blocks, T) -> (N, blocks, T)
    blocks = [
        losses[:, b, cap - (end - first) :] for b, (first, end) in enumerate(zip(firsts, ends, strict=True))
    ]
    return torch.cat(blocks, dim=1)  # (N, length - cap)


@dataclass
class LengthLosses:
    """Per-token losses of every chunk of one length, and what they are summarised into."""

    full: Tensor  # (N * k, L)
    tail: Tensor | None  # (N * k, L - T), positions >= T; None at L <= T
    capped: Tensor | None  # (N * k, L - T), the tail with context cut to T; None at L <= T and under variants


def length_losses(ctx: EvalContext, cfg: PerplexityConfig, starts: np.ndarray, length: int) -> LengthLosses:
    full = token_losses(ctx, starts, length, f"ppl L={length}")  # (N * k, L)
    if length <= ctx.train_len:
        return LengthLosses(full, None, None)
    capped = capped_tail_losses(ctx, starts, length, cfg.capped_stride)
    return LengthLosses(full, full[:, ctx.train_len :], capped)


def per_window(losses: Tensor, windows: int) -> np.ndarray:
    """(N * k, M) chunk losses -> (N,) mean loss of each window of the longest length, float32."""
    return losses.reshape(windows, -1).mean(dim=1).numpy().astype(np.float32)  # (N*k, M) -> (N, k*M) -> (N,)


def window_documents(ctx: EvalContext, windows: np.ndarray, length: int) -> dict[str, np.ndarray]:
    """{"documents": each window's document (`TokenStream.window_documents`)}, the unit the report resamples
    windows within; empty when the split does not record documents."""
    documents = ctx.valid.window_documents(windows, length)  # (N,) or None
    return {} if documents is None else {"documents": documents}


def document_means(
    ctx: EvalContext, starts: np.ndarray, length: int, losses: Tensor, variant: str | None = None
) -> dict[str, float]:
    """`loss_docmean/L` and `ppl_docmean/L` (`@VARIANT` under a variant): the mean over documents of their
    mean token loss; empty when the split does not record documents."""
    documents = ctx.valid.target_documents(starts, length)  # (N * k, L) or None
    if documents is None:
        return {}
    ids = torch.from_numpy(documents.reshape(-1).astype(np.int64))
    _, index = torch.unique(ids, return_inverse=True)
    sums = torch.zeros(int(index.max()) + 1, dtype=torch.float64).index_add_(
        0, index, losses.reshape(-1).double()
    )
    counts = torch.bincount(index).double()
    mean = float((sums / counts).mean())
    return {
        metric_key("loss_docmean", length, variant=variant): mean,
        metric_key("ppl_docmean", length, variant=variant): math.exp(mean),
    }


@dataclass
class Scored:
    """What one length's chunks are: their starts, the text bytes their targets stand for, and how many
    windows of the longest length they tile."""

    starts: np.ndarray  # (N * k,) chunk starts
    length: int
    n_bytes: int
    windows: int  # N


def summarised(
    ctx: EvalContext, cfg: PerplexityConfig, scored: Scored, losses: LengthLosses, variant: str | None = None
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The rows of one length's losses under `variant` (None: the model as trained): plain, per-document,
    and tail and capped where measured; and their per-window mean losses."""
    length = scored.length
    out = loss_rows(losses.full, length, cfg.position_bins, scored.n_bytes, variant)
    out[metric_key("ppl_windows", length, variant=variant)] = len(scored.starts)
    out.update(document_means(ctx, scored.starts, length, losses.full, variant))
    arrays = {metric_key("loss", length, variant=variant): per_window(losses.full, scored.windows)}
    for name, part in (("tail", losses.tail), ("capped", losses.capped)):
        if part is not None:
            mean = float(part.mean())
            out[metric_key(f"loss_{name}", length, variant=variant)] = mean
            out[metric_key(f"ppl_{name}", length, variant=variant)] = math.exp(mean)
            arrays[metric_key(f"loss_{name}", length, variant=variant)] = per_window(part, scored.windows)
    return out, arrays


def length_rows(
    ctx: EvalContext, cfg: PerplexityConfig, windows: np.ndarray, length: int
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Every result of one length (plain, tail, capped, per-document, sliding, per-variant rows), and the
    per-window mean losses (plain and per variant)."""
    started = time.perf_counter()
    starts = chunk_starts(windows, max(ctx.cfg.lengths), length)
    scored = Scored(starts, length, target_bytes(ctx, starts, length), len(windows))
    out, arrays = summarised(ctx, cfg, scored, length_losses(ctx, cfg, starts, length))
    if cfg.stride is not None:
        sliding = sliding_loss(ctx, length, cfg.stride, len(starts) * length)
        out[metric_key("ppl_sliding", length)] = math.exp(sliding)
    out[f"time/ppl@{length}_s"] = round(time.perf_counter() - started, 3)
    for kind, scaled in scaled_losses(ctx, starts, length).items():  # only past the training length
        parts = LengthLosses(scaled, scaled[:, ctx.train_len :], None)  # capped: not measured under a kind
        rows, per_window_losses = summarised(ctx, cfg, scored, parts, kind)
        out.update(rows)
        arrays.update(per_window_losses)
    return out, arrays


def perplexity_table(results: dict[str, Any], lengths: list[int], sliding: bool) -> Table:
    columns, keys = ["length", "loss", "ppl", "windows"], ["loss", "ppl", "ppl_windows"]
    if sliding:
        columns, keys = [*columns, "ppl_sliding"], [*keys, "ppl_sliding"]
    return Table(columns, [[n, *(results[metric_key(key, n)] for key in keys)] for n in lengths])


def perplexity_curves(results: dict[str, Any], lengths: list[int]) -> dict[str, Curves]:
    """Perplexity against length, and the binned loss over the window's positions at each length."""
    ppl = ([float(n) for n in lengths], [results[metric_key("ppl", n)] for n in lengths])
    curves = {
        f"L={n}": (bin_centres(n, len(c)), c)
        for n in lengths
        if (c := results[metric_key("position_loss", n)])
    }
    return {
        "ppl_vs_length": Curves("Perplexity vs evaluation length", "length", {"ppl": ppl}),
        "position_loss": Curves("Loss per position", "position", curves),
    }


class Perplexity(Evaluator[PerplexityConfig]):
    """Perplexity at every `eval.lengths`, per-position loss, sliding-window and variant rows."""

    name = "perplexity"
    config = PerplexityConfig
    order = perplexity_columns.ORDER
    per_corpus = True

    def window_lengths(self, settings: EvalSettings) -> list[int]:
        return list(settings.lengths)

    def evaluate(self, ctx: EvalContext) -> EvalOutput:
        lengths = list(ctx.cfg.lengths)
        longest = max(lengths)
        windows = ctx.valid.evaluation_windows(longest, window_count(self.cfg, longest))  # (N,)
        results: dict[str, Any] = {}
        arrays: dict[str, np.ndarray] = {"starts": windows.astype(np.int64)}
        arrays.update(window_documents(ctx, windows, longest))
        for length in ctx.bar(lengths, "perplexity", unit="length"):
            rows, per_window_losses = length_rows(ctx, self.cfg, windows, length)
            results.update(rows)
            arrays.update(per_window_losses)
        data = {k: v for k, v in results.items() if isinstance(v, list)}
        return EvalOutput(
            scalars={k: v for k, v in results.items() if k not in data},
            data=data,
            tables={"perplexity": perplexity_table(results, lengths, self.cfg.stride is not None)},
            curves=perplexity_curves(results, lengths),
            arrays={"perplexity_windows": arrays},
        )
