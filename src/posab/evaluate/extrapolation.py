"""The extrapolation audit: what a positional bias does past the training length, as numbers every run has.

Issue 28, part 1. The evaluation layer names no encoding: it asks the model's encoding for two optional
methods (`DistanceBias`, `BiasFeatures`), which each encoding with such a bias implements on its own code
path, so the audit reads exactly what the model adds. T = L_train (`train.seq_len`), D = max(longest of
`eval.lengths`, T).

1. The bias curve (ALiBi, T5, FIRE, KERPLE, multiscale; the hierarchical bias's token level, its sentence
   and paragraph levels depending on where a document's sentences end, not on i - j): b_h(d) for
   d = 0 .. D - 1, computed under the evaluation's autocast and rounded to the attention's dtype, as the
   model's mask holds it (bf16 under bf16). FIRE, and multiscale with `input=fire`, depend on the query:
   their curve is the row of the last query, i = D - 1 (the only one that sees every distance), for the
   distances below T as well. Per head:

       at_end      b_h(T - 1)
       min, max    of b_h(d) over T <= d < D ("beyond")
       jump        max_{T <= d < D} |b_h(d) - b_h(d - 1)|, the step into T included
       jump_rel    jump / (max_{d < T} b_h(d) - min_{d < T} b_h(d))   (NaN where that range is 0)

   `audit/bias_end/headH`, `audit/bias_min_beyond/headH`, `audit/bias_max_beyond/headH`,
   `audit/bias_jump/headH` (jump_rel) and `audit/bias_jump` (the largest defined one); the
   `extrapolation_bias` table and figure, and the curve itself as `extrapolation_bias.npz`. ALiBi's
   jump_rel is 1 / (T - 1): its bias is the linear continuation. Needs D > T for the summary.

   The pull past T (issue 28's explanation of the multi-scale bias's breaks): at each evaluation length
   L > T, for each head, the share of the bias-only attention of the last query, softmax_d(b_h(d)) over
   d < L, that lies at d >= T, minus the same share for the bias held at its last trained value past T
   (b_h(min(d, T - 1)), a clamp):

       pull_h(L)   sum_{d >= T} softmax(b_h)_d - sum_{d >= T} softmax(b_h(min(., T - 1)))_d

   0 for a clamped bias and for a flat one (a broad head stays as broad), below 0 for a bias that keeps
   decaying (ALiBi), near 1 when a head that attends locally within T finds, past T, distances its bias
   ranks above every near one. `audit/bias_pull@L/headH` and `audit/bias_pull@L` (the largest over heads).

2. Input novelty (the multiscale MLP, the hierarchical token level's): x(d) in R^F, the MLP's input
   features, as the first layer receives them (rounded to the autocast dtype). Training inputs
   X_T = {x(d): d < T}; at each evaluation length L, X_L = {x(d): d < L} of the query L - 1:

       outside_f(L)   fraction of the L inputs whose feature f lies outside [min, max] of f over X_T
                      (by more than OUTSIDE_SLACK of the bound: the same input in a tensor of another
                      length may round differently by an ulp, vectorised vs scalar kernels)
       nearest(d)     min_{t < T} ||x(d) - x(t)||_2

   `audit/novelty_outside@L` (mean over f), `audit/novelty_outside_max@L` (max over f),
   `audit/novelty_nearest@L` (max over d), `audit/novelty_nearest_mean@L` (mean over d),
   `audit/novelty_near@L` (mean of nearest(d) over the trained distances d < T only), and the
   `extrapolation_novelty` table (per length and feature). All 0 at L <= T. `novelty_near` is 0 at every
   length for an input of d alone (raw, log: the distances below T keep their training inputs, and only
   new distances can be novel); it is not for the FIRE input, whose normaliser ln(1 + max(i, T)) is
   constant over training's queries and grows past T, so at the last query of L every trained distance
   d >= 1 reads an input it never had, the near ones that local heads attend included.

3. Attention, for every encoding: entropy and mean attended distance per layer and head at each of
   `eval.lengths`, over `eval.extrapolation.windows` fixed validation windows, by the attention analysis's
   own functions (`posab.evaluate.attention_analysis`, whose docstring has the formulas):
   `audit/entropy@L/layerN/headM`, `audit/distance@L/layerN/headM`, their means over layers and heads
   `audit/entropy@L`, `audit/distance@L`, the `audit/grid` data and the `extrapolation_attention` table.
   Cost: one forward pass per window and length holding every layer's float32 probabilities (the
   analysis's timings, `QUERY_CHUNK`: default model, 2 CPU cores, ~4-5 s a window at L = 4096, so under
   ~10 s over 512 .. 4096 with one window); parts 1 and 2 are a few calls of the bias on D distances.

4. Position that depends on the content (FoX's forget gates, CoPE's position counts): what each layer's
   attention form reports of it (`Form.content_statistics`, per head, from the layer's q and k) over the
   first of the fixed validation windows at each of `eval.lengths`, one forward pass per length, only for
   an encoding whose forms report anything (found by one pass at the shortest length). FoX: the mean
   log forget gate per token (`gate_log`, the decay's slope) and the mean gate bias c_i - c_j at the
   window's longest distance (`gate_bias_far`): the bias curve as the gates make it, at and past the
   training length. CoPE: the position count at the last query (`cope_count_last`, which the clamp at
   npos - 1 caps), its mean over each row's keys (`cope_count_mean`), its largest (`cope_count_max`),
   the share of pairs counted past npos - 1 (`cope_clamped`) and, past the training length, the share
   counted past each head's largest count at the training length (`cope_past_trained`: keys that read a
   table row training barely reached; measured on the window at L_train, one more pass when L_train is
   not among the lengths). `audit/NAME@L` (mean over layers and heads), `audit/NAME@L/layerN/headM`,
   and the `extrapolation_content` table.

The keys are `posab.keys`' audit family. With a passkey stage the audit runs on the language model,
before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor

from posab.catalog import extrapolation as extrapolation_columns
from posab.device import autocast
from posab.errors import require
from posab.evaluate.attention_analysis import grid_scalars, statistics_grid, stats_table
from posab.evaluate.base import Evaluator, SectionConfig
from posab.evaluate.context import EvalContext, EvalSettings
from posab.forms import AttentionInputs
from posab.keys import AUDIT, metric_key
from posab.outputs import EvalOutput, Table
from posab.plots import new_figure

PREFIX = AUDIT  # the keys' family (posab.keys)
CONTENT_COLUMNS = ["length", "layer", "head", "statistic", "value"]  # part 4's table
OUTSIDE_SLACK = 4 * torch.finfo(torch.float32).eps  # relative: a few float32 ulps of the bound
SUMMARY = ("at_end", "min_beyond", "max_beyond", "jump", "jump_rel")
SUMMARY_KEYS = {  # the per-head scalars: `audit/KEY/headH`
    "at_end": "bias_end",
    "min_beyond": "bias_min_beyond",
    "max_beyond": "bias_max_beyond",
    "jump_rel": "bias_jump",
}


@dataclass
class ExtrapolationConfig(SectionConfig):
    enabled: bool = True  # the audit runs in every run (issue 28)
    windows: int = 1  # validation windows per length for the attention statistics

    def validate(self, settings: EvalSettings) -> None:
        valid = isinstance(self.windows, int) and not isinstance(self.windows, bool) and self.windows > 0
        require(valid, f"eval.extrapolation.windows={self.windows!r}: use a positive integer")


@runtime_checkable
class DistanceBias(Protocol):
    """An encoding whose additive score bias depends on i - j (for FIRE-like ones: and on the query)."""

    def distance_bias(self, distance: Tensor) -> Tensor | None:
        """(D,) distances i - j >= 0 -> (H, D) the bias at each (query i = max(distance)), or None."""
        ...


@runtime_checkable
class BiasFeatures(Protocol):
    """An encoding whose distance bias is an MLP on features of the distance."""

    def bias_features(self, distance: Tensor) -> Tensor | None:
        """(D,) distances as `distance_bias` -> (D, F) the MLP's input features, or None."""
        ...


def bias_curve(
    encoding: object, length: int, device: torch.device, dtype: torch.dtype | None
) -> Tensor | None:
    """(H, length) float64 b_h(d), d = 0 .. length - 1, as the model's mask holds it; None without one."""
    if not isinstance(encoding, DistanceBias):
        return None
    distance = torch.arange(length, device=device, dtype=torch.float32)  # (D,)
    with torch.inference_mode(), autocast(device, dtype):
        bias = encoding.distance_bias(distance)  # (H, D) or None
    return None if bias is None else bias.to(dtype or torch.float32).double().cpu()


def bias_summary(bias: Tensor, train_len: int) -> dict[str, Tensor]:
    """(H, D) curve, D > train_len -> each of SUMMARY as (H,) float64 (module docstring)."""
    bias = bias.double()
    inside, beyond = bias[:, :train_len], bias[:, train_len:]  # (H, T), (H, D - T)
    steps = beyond - bias[:, train_len - 1 : -1]  # (H, D - T): b(d) - b(d - 1) for d >= T
    jump = steps.abs().amax(1)
    spread = inside.amax(1) - inside.amin(1)
    relative = torch.where(spread > 0, jump / spread, torch.full_like(jump, float("nan")))
    return {
        "at_end": bias[:, train_len - 1],
        "min_beyond": beyond.amin(1),
        "max_beyond": beyond.amax(1),
        "jump": jump,
        "jump_rel": relative,
    }


def beyond_share(curve: Tensor, train_len: int) -> Tensor:
    """(H, L) bias curve -> (H,) the share of softmax over the L distances at d >= train_len."""
    return torch.softmax(curve, dim=1)[:, train_len:].sum(1)


def bias_pull(bias: Tensor, train_len: int, length: int) -> Tensor:
    """(H, D) curve, train_len < length <= D -> (H,) float64 pull past train_len at `length` (docstring)."""
    curve = bias[:, :length].double()  # (H, L)
    held = curve[:, train_len - 1 : train_len].expand(-1, length - train_len)  # (H, L - T): b(T - 1)
    clamped = torch.cat([curve[:, :train_len], held], dim=1)  # (H, L)
    return beyond_share(curve, train_len) - beyond_share(clamped, train_len)


def pull_scalars(bias: Tensor, train_len: int, lengths: list[int]) -> dict[str, float]:
    """`audit/bias_pull@L/headH` and `audit/bias_pull@L` (max over heads) at each length L > train_len."""
    scalars: dict[str, float] = {}
    for length in (n for n in lengths if train_len < n <= bias.shape[1]):
        pull = bias_pull(bias, train_len, length)
        scalars |= {metric_key("bias_pull", length, head=h): v for h, v in enumerate(pull.tolist())}
        scalars[metric_key("bias_pull", length)] = float(pull.max())
    return scalars


def summary_scalars(summary: dict[str, Tensor]) -> dict[str, float]:
    """The per-head scalars of a `bias_summary`, and the largest relative jump over heads (NaN heads left
    out)."""
    scalars = {
        metric_key(key, head=h): value
        for name, key in SUMMARY_KEYS.items()
        for h, value in enumerate(summary[name].tolist())
    }
    defined = summary["jump_rel"][~summary["jump_rel"].isnan()]  # heads whose range inside is not 0
    scalars[metric_key("bias_jump")] = float(defined.max()) if defined.numel() else float("nan")
    return scalars


def bias_figure(bias: Tensor, train_len: int, title: str) -> Figure:
    """b_h(d) against d, one line per head, the training length marked."""
    fig = new_figure(8.0, 4.5)
    ax = fig.add_subplot()
    distance = np.arange(bias.shape[1])
    for h, row in enumerate(bias.numpy()):
        ax.plot(distance, row, linewidth=1.0, label=f"head {h}")
    ax.axvline(train_len, color="k", linestyle="--", label=f"training length {train_len}")
    ax.set_xlabel("distance i − j (tokens, linear axis)")
    ax.set_ylabel("additive attention bias b_h(d)")
    ax.set_title(f"{title}: bias by distance" if title else "bias by distance")
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize="small")
    return fig


def mlp_inputs(
    encoding: object, length: int, device: torch.device, dtype: torch.dtype | None
) -> Tensor | None:
    """(length, F) float64 MLP input features x(d), d = 0 .. length - 1, rounded as the first layer
    receives them; None for an encoding without an MLP bias."""
    if not isinstance(encoding, BiasFeatures):
        return None
    distance = torch.arange(length, device=device, dtype=torch.float32)  # (L,)
    with torch.inference_mode():
        features = encoding.bias_features(distance)  # (L, F) or None
    return None if features is None else features.to(dtype or torch.float32).double().cpu()


def novelty(train: Tensor, inputs: Tensor) -> tuple[Tensor, Tensor]:
    """Training inputs (T, F) and evaluation inputs (L, F) -> the fraction of the L inputs outside each
    feature's training range (F,) and each input's distance to its nearest training input (L,)."""
    low, high = train.amin(0), train.amax(0)  # (F,) each
    slack = OUTSIDE_SLACK * torch.maximum(low.abs(), high.abs())  # (F,)
    outside = ((inputs < low - slack) | (inputs > high + slack)).double().mean(0)  # (F,)
    pairwise = torch.cdist(inputs, train, compute_mode="donot_use_mm_for_euclid_dist")  # (L, T), exact 0s
    return outside, pairwise.amin(1)


def input_novelty(
    encoding: object, train_len: int, lengths: list[int], device: torch.device, dtype: torch.dtype | None
) -> dict[int, tuple[Tensor, Tensor]] | None:
    """`novelty` at each length, or None for an encoding without an MLP bias. At L <= T the inputs are
    the first L training inputs themselves (the same tensor): novelty exactly 0."""
    train = mlp_inputs(encoding, train_len, device, dtype)  # (T, F) or None
    if train is None:
        return None
    out: dict[int, tuple[Tensor, Tensor]] = {}
    for length in lengths:
        inputs = train[:length] if length <= train_len else mlp_inputs(encoding, length, device, dtype)
        assert inputs is not None  # the same encoding answered for the training distances
        out[length] = novelty(train, inputs)
    return out


def novelty_scalars(found: dict[int, tuple[Tensor, Tensor]], train_len: int) -> dict[str, float]:
    """Per length: the mean and the largest outside fraction over features, the largest and the mean
    nearest-input distance over distances, and its mean over the trained distances d < `train_len`."""
    scalars: dict[str, float] = {}
    for length, (outside, nearest) in found.items():
        scalars[metric_key("novelty_outside", length)] = float(outside.mean())
        scalars[metric_key("novelty_outside_max", length)] = float(outside.max())
        scalars[metric_key("novelty_nearest", length)] = float(nearest.max())
        scalars[metric_key("novelty_nearest_mean", length)] = float(nearest.mean())
        scalars[metric_key("novelty_near", length)] = float(nearest[:train_len].mean())
    return scalars


def novelty_table(found: dict[int, tuple[Tensor, Tensor]]) -> Table:
    """One row per (length, feature): the fraction of inputs outside the feature's training range."""
    rows = [
        [length, f, value]
        for length, (outside, _) in found.items()
        for f, value in enumerate(outside.tolist())
    ]
    return Table(["length", "feature", "outside"], rows)


def bias_output(ctx: EvalContext) -> EvalOutput:
    """Part 1: the curve, its summary, table, figure and arrays; empty without a distance bias."""
    longest = max([ctx.train_len, *ctx.cfg.lengths])
    bias = bias_curve(ctx.model.encoding, longest, ctx.device, ctx.dtype)  # (H, D) or None
    if bias is None:
        return EvalOutput()
    arrays = {"distance": np.arange(longest), "bias": bias.numpy(), "train_len": np.array(ctx.train_len)}
    output = EvalOutput(
        figures={"extrapolation_bias": bias_figure(bias, ctx.train_len, ctx.title)},
        arrays={"extrapolation_bias": arrays},
    )
    if longest > ctx.train_len:
        summary = bias_summary(bias, ctx.train_len)
        output.scalars.update(summary_scalars(summary))
        output.scalars.update(pull_scalars(bias, ctx.train_len, list(ctx.cfg.lengths)))
        rows = [
            [h, *values] for h, values in enumerate(torch.stack([summary[n] for n in SUMMARY], 1).tolist())
        ]
        output.tables["extrapolation_bias"] = Table(["head", *SUMMARY], rows)
    return output


def novelty_output(ctx: EvalContext) -> EvalOutput:
    """Part 2: input novelty at each evaluation length; empty without an MLP bias."""
    found = input_novelty(ctx.model.encoding, ctx.train_len, list(ctx.cfg.lengths), ctx.device, ctx.dtype)
    if found is None:
        return EvalOutput()
    scalars = novelty_scalars(found, ctx.train_len)
    return EvalOutput(scalars=scalars, tables={"extrapolation_novelty": novelty_table(found)})


def attention_output(ctx: EvalContext, windows: int) -> EvalOutput:
    """Part 3: attention entropy and distance per layer and head at each evaluation length."""
    grid, _ = statistics_grid(ctx, list(ctx.cfg.lengths), windows)
    scalars: dict[str, float] = {}
    for i, length in enumerate(grid["lengths"]):
        scalars.update(grid_scalars(grid, i, PREFIX))
        for name in ("entropy", "distance"):
            scalars[metric_key(name, length)] = float(np.mean(grid[name][i]))
    return EvalOutput(
        scalars=scalars, data={f"{PREFIX}/grid": grid}, tables={"extrapolation_attention": stats_table(grid)}
    )


def layer_content(
    ctx: EvalContext, length: int, trained: list[dict[str, Tensor]] | None = None
) -> list[dict[str, Tensor]]:
    """Part 4 at one length: every layer's `content_statistics` over the first fixed validation window,
    given each layer's at the training length (`trained`) when there are any."""
    start = int(ctx.valid.fixed_windows(length, 1)[0])
    batch = ctx.valid.batch([start], length)
    layers: list[dict[str, Tensor]] = []

    def observe(inputs: AttentionInputs) -> None:
        reference = trained[len(layers)] if trained else None
        found = inputs.form.content_statistics(inputs.q, inputs.k, reference)
        layers.append({name: value.double().cpu() for name, value in found.items()})

    ctx.logits(batch.inputs, batch.sentence, batch.paragraph, observe=observe)
    return layers


def content_scalars(name: str, length: int, per_layer: np.ndarray) -> dict[str, float]:
    """`audit/NAME@L` (the mean) and `audit/NAME@L/layerN/headM` from a (layers, H) statistic."""
    scalars = {metric_key(name, length): float(per_layer.mean())}
    for (layer, head), value in np.ndenumerate(per_layer):
        scalars[f"{PREFIX}/{name}@{length}/layer{layer}/head{head}"] = float(value)
    return scalars


def content_output(ctx: EvalContext) -> EvalOutput:
    """Part 4: content-dependent position statistics at each length, those past the training length read
    against the pass at it; empty when no form reports any."""
    lengths = sorted(ctx.cfg.lengths)
    trained = layer_content(ctx, ctx.train_len)
    if not any(trained):
        return EvalOutput()  # an encoding whose forms report nothing: one pass
    rows: list[list[object]] = []
    scalars: dict[str, float] = {}
    for length in lengths:
        past = length > ctx.train_len
        layers = trained if length == ctx.train_len else layer_content(ctx, length, trained if past else None)
        for name in layers[0]:
            per_layer = torch.stack([stats[name] for stats in layers]).numpy()  # (layers, H)
            scalars.update(content_scalars(name, length, per_layer))
            rows += [[length, layer, head, name, float(v)] for (layer, head), v in np.ndenumerate(per_layer)]
    return EvalOutput(scalars=scalars, tables={"extrapolation_content": Table(CONTENT_COLUMNS, rows)})


class ExtrapolationAudit(Evaluator[ExtrapolationConfig]):
    """The bias curve and its summary, the MLP's input novelty and the attention statistics (module
    docstring): `audit/...` scalars, the `extrapolation_*` tables, figure and arrays."""

    name = "extrapolation"
    config = ExtrapolationConfig
    order = extrapolation_columns.ORDER

    def window_lengths(self, settings: EvalSettings) -> list[int]:
        return list(settings.lengths)

    def evaluate(self, ctx: EvalContext) -> EvalOutput:
        output = bias_output(ctx)
        output.update(novelty_output(ctx))
        output.update(attention_output(ctx, self.cfg.windows))
        output.update(content_output(ctx))
        return output
