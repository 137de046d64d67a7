"""The NoPE/RoPE hybrids (SWAN-GPT, RNoPE-SWA): the layer pattern, RoPE in the RoPE layers only, the
sliding window against the banded softmax written out (float64, forward and every gradient), SWAN's
inference-time scaling of the NoPE logits at hand-worked lengths, and the presets training a step and
evaluating at 8x the training length. The shared suite runs both presets through causality, offsets,
cached decoding and the meta device; here the scaled NoPE layers go through the last two as well."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from test_cache_equivalence import cached_logits
from torch import Tensor

from conftest import text_like, tiny_model
from posab.encodings import Dims, Positions
from posab.encodings.hybrid import KINDS, Hybrid, QueryScaled, swan_scale
from posab.encodings.rope import RoPE
from posab.errors import ConfigError
from posab.forms import Causal, Form, PerLayer
from posab.model import DecoderLM
from tolerances import assert_close_to_scale

SWAN = ["nope", "rope_window", "rope_window", "rope_window"]
B, H, D, L = 2, 2, 8, 40  # batch, heads, head dim, keys
WINDOW = 9  # each windowed query sees itself and the 8 keys before it


def dims(n_layers: int = 4, train_len: int = 32, window: int | None = None) -> Dims:
    return Dims(d_model=H * D, n_heads=H, train_len=train_len, n_layers=n_layers, window=window)


def hybrid(n_layers: int = 4, pattern: list[str] = SWAN, **settings: object) -> Hybrid:
    return Hybrid(dims(n_layers), pattern, **{"window": WINDOW, **settings})  # type: ignore[arg-type]


def qkv(queries: int = L, seed: int = 0) -> list[Tensor]:
    """float64 leaves: q (B, H, queries, D), k and v (B, H, L, D)."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, H, queries, D), (B, H, L, D), (B, H, L, D)]
    return [torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_() for shape in shapes]


def layer_form(encoding: Hybrid, layer: int, queries: int = L) -> Form:
    form = encoding.attention_form(Positions.build(L), queries, torch.float64)
    return encoding.layer_form(form, layer)


def explicit(q: Tensor, k: Tensor, v: Tensor, window: int | None, scale: Tensor | None = None) -> Tensor:
    """softmax(s_i q_i k_j / sqrt(D)) over keys j <= i (and j > i - window), written out: (B, H, c, D)."""
    c, n = q.shape[-2], k.shape[-2]
    i, j = torch.arange(n - c, n)[:, None], torch.arange(n)[None, :]  # query rows sit at the last c keys
    seen = (j <= i) & (j > i - window) if window is not None else j <= i
    logits = q @ k.transpose(-1, -2) / math.sqrt(D)  # (B, H, c, n)
    logits = logits if scale is None else logits * scale[:, None]
    return torch.softmax(logits.masked_fill(~seen, float("-inf")), dim=-1) @ v


def outputs_and_gradients(out: Tensor, inputs: list[Tensor]) -> list[Tensor]:
    """The output and the gradients of a fixed random projection of it with respect to every input."""
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=out.dtype)
    return [out, *torch.autograd.grad((out * weight).sum(), inputs)]


# ------------------------------------------------------------------------------------------- the pattern


def test_the_pattern_repeats_over_the_layers_and_is_cut_at_the_last() -> None:
    assert hybrid(4).kinds == tuple(SWAN)
    assert hybrid(6).kinds == (*SWAN, "nope", "rope_window")
    assert hybrid(2).kinds == ("nope", "rope_window")
    assert hybrid(3, ["rope", "nope"]).kinds == ("rope", "nope", "rope")


@pytest.mark.parametrize("pattern", [[], ["nope", "swa"], ["NoPE"]])
def test_a_bad_pattern_is_refused_naming_the_valid_kinds(pattern: list[str]) -> None:
    with pytest.raises(ConfigError, match="nope, rope, rope_window"):
        hybrid(4, pattern)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"window": "third"}, "use an integer in \\[1, 31\\] or one of half"),
        ({"window": 0}, "use an integer"),
        ({"window": 32}, "never acts in training"),
        ({"window": True}, "use an integer"),
        ({"nope_logit_scaling": "yarn"}, "use one of none, swan"),
        ({"nope_logit_scaling": "swan"}, "needs a > 1"),
        ({"nope_logit_scaling": "swan", "scaling_base": 1.0}, "needs a > 1"),
    ],
)
def test_bad_settings_are_refused(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        hybrid(4, SWAN, **settings)


def test_the_window_is_half_the_training_length_by_default_and_model_window_is_refused() -> None:
    assert Hybrid(dims(train_len=512), SWAN).window == 256
    with pytest.raises(ConfigError, match="leave model.window null"):
        Hybrid(dims(window=16), SWAN)


def test_the_presets_build_their_patterns() -> None:
    """At the tiny model's 2 layers and training length 128: SWAN starts with its global NoPE layer,
    RNoPE-SWA's first two layers are windowed RoPE layers (its NoPE layer is the fourth)."""
    assert tiny_model("swan").encoding.kinds == ("nope", "rope_window")
    assert tiny_model("rnope_swa").encoding.kinds == ("rope_window", "rope_window")
    assert tiny_model("swan").encoding.window == tiny_model("rnope_swa").encoding.window == 64


# ----------------------------------------------------------------------------------------------- rotation


def test_rope_layers_rotate_as_rope_does_and_nope_layers_do_not() -> None:
    encoding = hybrid(4, ["nope", "rope", "rope_window", "nope"], rope_base=500.0)
    rope = RoPE(dims(), base=500.0)
    q, k, _ = (t.detach().float() for t in qkv())
    pos = Positions.build(L, offset=7)
    expected = rope.rotate(q, k, pos)
    for layer, kind in enumerate(encoding.kinds):
        rotated = encoding.rotate(q, k, pos, layer)
        wanted = (q, k) if kind == "nope" else expected
        assert all(torch.equal(a, b) for a, b in zip(rotated, wanted, strict=True)), kind


# ------------------------------------------------------------------------------------------------ windows


def test_each_kind_attends_with_its_form() -> None:
    forms = hybrid(4, ["nope", "rope", "rope_window", "nope"]).attention_form(
        Positions.build(L), L, torch.float32
    )
    assert isinstance(forms, PerLayer) and len(forms.forms) == len(KINDS)
    encoding = hybrid(4, ["nope", "rope", "rope_window", "nope"])
    windows = [getattr(encoding.layer_form(forms, layer), "window", "scaled") for layer in range(4)]
    assert windows == [None, None, WINDOW, None]


@pytest.mark.parametrize("grad", [True, False], ids=["training path", "evaluation path"])
def test_a_windowed_layer_equals_the_banded_softmax(grad: bool) -> None:
    """float64 throughout: the CPU paths (the chunked kernel in training, SDPA with the band in evaluation)
    sum the same terms in another order, observed 2e-16 of the scale; 1e-12 leaves a wide margin, while a
    band one key too wide or too narrow is off by 0.7 of it."""
    inputs = qkv()
    form = layer_form(hybrid(), 1)
    with torch.set_grad_enabled(grad):
        fast = form.attend(*inputs)
    expected = explicit(*inputs, WINDOW)
    assert_close_to_scale(fast, expected, rel=1e-12)
    if grad:
        pairs = zip(outputs_and_gradients(fast, inputs), outputs_and_gradients(expected, inputs), strict=True)
        for actual, wanted in pairs:
            assert_close_to_scale(actual, wanted, rel=1e-12)


def test_a_windowed_layer_ignores_keys_outside_its_window_and_a_global_one_does_not() -> None:
    """Changing the keys and values WINDOW or more positions before the last query leaves that query's output
    of a windowed layer exactly as it was (their weight is exp(-inf) = 0); the NoPE layer's changes."""
    q, k, v = (t.detach() for t in qkv())
    far = L - 1 - WINDOW  # keys 0 .. far are outside the last query's window; key far + 1 is its oldest
    k2, v2 = k.clone(), v.clone()
    k2[:, :, : far + 1] += 3.0
    v2[:, :, : far + 1] -= 2.0
    encoding = hybrid()
    with torch.no_grad():
        windowed = [layer_form(encoding, 1).attend(q, *kv)[:, :, -1] for kv in ((k, v), (k2, v2))]
        nope = [layer_form(encoding, 0).attend(q, *kv)[:, :, -1] for kv in ((k, v), (k2, v2))]
    assert torch.equal(*windowed)
    assert (nope[0] - nope[1]).abs().max() > 1e-2
    k2[:, :, far + 1] += 3.0  # the oldest key inside the window does count
    with torch.no_grad():
        assert not torch.equal(windowed[0], layer_form(encoding, 1).attend(q, k2, v2)[:, :, -1])


# ----------------------------------------------------------------------------------- SWAN's scaling


def test_swan_scale_at_hand_worked_lengths() -> None:
    """s_t = log_a(t + a): with a = 512, t = 512 gives log_512(1024) = 10/9 and t = 1536 gives 11/9."""
    scale = swan_scale(512, 1025, 512.0, "cpu")
    assert scale.dtype == torch.float64 and scale.shape == (1025,)
    assert math.isclose(scale[0].item(), 10 / 9, rel_tol=1e-15)
    assert math.isclose(scale[-1].item(), 11 / 9, rel_tol=1e-15)
    assert math.isclose(swan_scale(1, 1, 512.0, "cpu").item(), math.log(513) / math.log(512), rel_tol=1e-15)


def test_swan_scaling_acts_on_the_nope_layers_in_evaluation_only() -> None:
    encoding = hybrid(nope_logit_scaling="swan", scaling_base=16.0)
    assert isinstance(layer_form(encoding, 0), Causal)  # a fresh module trains
    encoding.eval()
    nope, windowed = layer_form(encoding, 0, queries=5), layer_form(encoding, 1, queries=5)
    assert isinstance(nope, QueryScaled) and isinstance(windowed, Causal)
    # the last 5 of 40 keys see 36 .. 40 keys: s = log_16(52) .. log_16(56)
    wanted = torch.tensor([math.log(t + 16) / math.log(16) for t in range(36, 41)], dtype=torch.float64)
    assert_close_to_scale(nope.scale, wanted, rel=1e-15)
    assert Hybrid.same_in_training("nope_logit_scaling", "none", "swan", 512)
    assert Hybrid.same_in_training("scaling_base", 16.0, 900.0, 512)
    assert not Hybrid.same_in_training("window", "half", 128, 512)


@pytest.mark.parametrize("queries", [L, 7])
def test_the_scaled_nope_layer_equals_the_scaled_softmax(queries: int) -> None:
    """softmax(s_t q_t K^T / sqrt(D)) written out, float64: all queries through the training path (output
    and every gradient), and the last 7 against all keys (a cached decoding step: the block path)."""
    encoding = hybrid(nope_logit_scaling="swan", scaling_base=16.0).eval()
    inputs = qkv(queries)
    form = layer_form(encoding, 0, queries)
    assert isinstance(form, QueryScaled)
    fast = form.attend(*inputs)
    expected = explicit(*inputs, None, form.scale)
    pairs = zip(outputs_and_gradients(fast, inputs), outputs_and_gradients(expected, inputs), strict=True)
    for actual, wanted in pairs:
        assert_close_to_scale(actual, wanted, rel=1e-12)
    scores = form.scores(*(t.detach() for t in inputs[:2]), 0, queries)  # (B, H, c, n)
    finite = scores.isfinite()
    logits = inputs[0].detach() @ inputs[1].detach().transpose(-1, -2) / math.sqrt(D) * form.scale[:, None]
    assert_close_to_scale(scores[finite], logits[finite], rel=1e-12)


def sharpened(model: DecoderLM) -> DecoderLM:
    """The model with its query and key weights x 8 (logits x 64): attention as peaked as a trained model's,
    where an untrained one's is nearly uniform and barely moves under any scaling of its logits."""
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[: 2 * model.cfg.d_model] *= 8.0  # (3C, C): the q and k rows
    return model


def swan_model() -> DecoderLM:
    return tiny_model("swan", "encoding.nope_logit_scaling=swan", "encoding.scaling_base=64.0")


@torch.no_grad()
def test_the_scaled_model_decodes_with_a_cache_as_it_runs_whole_and_ignores_offsets() -> None:
    """With SWAN's scaling on: cached decoding (a 200-token prompt, 12 tokens one at a time) equals the full
    forward, and a common offset of every position changes nothing (t counts the keys a query sees).
    float32 sums as in tests/test_cache_equivalence.py: observed 2e-7 of the logits' scale; 1e-5 = 84 EPS32,
    while counting t one key off moves them by 2e-4 of it, and the scaling itself by 2e-2."""
    model = sharpened(swan_model())
    batch = text_like(212, seed=3)
    full = model(*batch)
    assert_close_to_scale(cached_logits(model, batch, 200, 1, 0), full, rel=1e-5)
    assert_close_to_scale(model(*batch, offset=1000), full, rel=1e-5)
    unscaled = sharpened(tiny_model("swan"))(*batch)  # the same weights (seed 0), the NoPE logits as trained
    assert (unscaled - full).abs().max() > 1e-2 * full.abs().max()


# ---------------------------------------------------------------------------------------- the presets


@pytest.mark.parametrize("preset", ["swan", "rnope_swa", "swan with scaling"])
def test_a_preset_trains_a_step_and_evaluates_at_eight_times_the_training_length(preset: str) -> None:
    model = swan_model() if preset == "swan with scaling" else tiny_model(preset)
    model.train()
    tokens = text_like(128, seed=1)[0]  # the training length
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    model.eval()
    with torch.no_grad():
        long = model(text_like(8 * 128, seed=2)[0])  # (2, 1024, V)
    assert long.shape[1] == 1024 and torch.isfinite(long).all()


@pytest.mark.slow
@torch.no_grad()
def test_flex_attention_evaluates_the_hybrid_as_sdpa_does() -> None:
    """`model.attention=flex` (FlexAttention compiled on the CPU, in evaluation): the windowed layers through
    its band block mask, the scaled NoPE layer through its causal one, against SDPA's explicit masks. float32
    sums in another order: observed 2e-7 of the scale; 1e-5 = 84 EPS32."""
    batch = text_like(256, seed=4)
    overrides = ("encoding.nope_logit_scaling=swan", "encoding.scaling_base=64.0")
    sdpa = sharpened(tiny_model("swan", *overrides))(*batch)
    flex = sharpened(tiny_model("swan", *overrides, "model.attention=flex"))(*batch)
    assert_close_to_scale(flex, sdpa, rel=1e-5)
