"""Every encoding through the same checks, plus formula checks for the ones that have a closed form."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

from conftest import tiny_model
from posab.encodings import Dims, Positions
from posab.encodings.alibi import ALiBi, alibi_slopes
from posab.encodings.hierarchical import Hierarchical
from posab.encodings.multiscale import MultiScale
from posab.encodings.reference import hierarchical_all_pairs, multiscale_all_pairs
from posab.encodings.sinusoidal import Sinusoidal
from posab.errors import ConfigError
from posab.forms import QUERY_CHUNK, Form, causal_mask
from tolerances import EPS32, assert_close_to_scale, scale_of

B, T, V = 2, 24, 260


def structured_batch(length: int = T, batch: int = B, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random tokens with sentence and paragraph indices that grow like real text."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, V, (batch, length), generator=g)
    sentence = torch.cumsum(torch.rand(batch, length, generator=g) < 0.15, dim=1)
    paragraph = torch.cumsum(torch.rand(batch, length, generator=g) < 0.04, dim=1)
    return tokens, sentence, paragraph


@torch.no_grad()
def test_output_shape(encoding: str) -> None:
    tokens, sentence, paragraph = structured_batch()
    logits = tiny_model(encoding)(tokens, sentence, paragraph)
    assert logits.shape == (B, T, V)
    assert torch.isfinite(logits).all()


@torch.no_grad()
def test_causality(encoding: str) -> None:
    """Changing tokens after t leaves the outputs up to t unchanged."""
    model = tiny_model(encoding)
    tokens, sentence, paragraph = structured_batch()
    t = T // 2
    changed = tokens.clone()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 7) % V
    before = model(tokens, sentence, paragraph)
    after = model(changed, sentence, paragraph)
    # the same sums over the visible keys (later keys weigh exactly 0): float32 rounding of the kernels at
    # most, observed <= 1e-6 of the logits' scale; 1e-5 = 84 EPS32, while a leak of a future token is
    # ~1e-1 of it, as the outputs after t show
    assert_close_to_scale(before[:, : t + 1], after[:, : t + 1], rel=1e-5)
    assert (before[:, t + 1 :] - after[:, t + 1 :]).abs().max() > 1e-3 * scale_of(before)


@torch.no_grad()
def test_forward_at_eight_times_training_length(encoding: str) -> None:
    model = tiny_model(encoding)  # trained length of the tiny preset: 64
    tokens, sentence, paragraph = structured_batch(length=8 * 64, batch=1)
    logits = model(tokens, sentence, paragraph)
    assert logits.shape == (1, 8 * 64, V)
    assert torch.isfinite(logits).all()


@torch.no_grad()
def test_position_offset(encoding: str) -> None:
    """Relative encodings ignore a common offset of all positions; absolute ones do not."""
    model = tiny_model(encoding)
    tokens, sentence, paragraph = structured_batch()
    base = model(tokens, sentence, paragraph)
    shifted = model(tokens, sentence, paragraph, offset=1000)
    # relative encodings: float32 rounding only (RoPE: of its angles up to 1000 + T), observed ~1.5e-7 of the
    # logits' scale; absolute ones differ by more than 1e-4 of it (FIRE, untrained, the least: ~1e-3)
    if model.encoding.relative_only:
        assert_close_to_scale(shifted, base, rel=1e-5)
    else:
        assert (base - shifted).abs().max() > 1e-4 * scale_of(base)


@pytest.mark.parametrize(
    ("heads", "expected"),
    [
        (4, [2**-2, 2**-4, 2**-6, 2**-8]),
        (8, [2 ** -(h + 1) for h in range(8)]),
        (12, [2 ** -(h + 1) for h in range(8)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]),
    ],
)
def test_alibi_slopes(heads: int, expected: list[float]) -> None:
    torch.testing.assert_close(alibi_slopes(heads), torch.tensor(expected))


def test_alibi_bias_is_minus_slope_times_distance() -> None:
    enc = ALiBi(Dims(d_model=32, n_heads=4))
    bias = enc.dense_bias(Positions.build(6))[0]  # (H, L, L)
    for h, m in enumerate(alibi_slopes(4).tolist()):
        for i in range(6):
            for j in range(i + 1):
                assert math.isclose(float(bias[h, i, j]), -m * (i - j), rel_tol=1e-6)


def test_multiscale_distinct_distances_equal_all_pairs() -> None:
    torch.manual_seed(0)
    enc = MultiScale(Dims(d_model=32, n_heads=4), num_freqs=8, max_dist=256.0, hidden=16)
    pos = Positions.build(40)
    fast = enc.dense_bias(pos)  # float32
    reference = copy.deepcopy(enc).double()
    slow = multiscale_all_pairs(reference, pos)  # the reference: all pairs in float64
    assert_close_to_scale(reference.dense_bias(pos), slow, rel=1e-12, msg="float64")  # the identity
    # float32: features to a few EPS32, then two layers summing 16 inputs each: observed ~1e-7 of the
    # bias's scale; 1e-5 = 84 EPS32, while a Toeplitz gather off by one distance is ~1e-1 of it
    assert_close_to_scale(fast, slow, rel=1e-5, msg="float32")


@pytest.mark.parametrize("combine", ["mix", "sum"])
def test_hierarchical_distinct_distances_equal_all_pairs(combine: str) -> None:
    torch.manual_seed(0)
    enc = Hierarchical(Dims(d_model=32, n_heads=4), combine=combine, num_freqs=8, hidden=16)
    with torch.no_grad():
        if combine == "mix":
            enc.mix.normal_()
    _, sentence, paragraph = structured_batch(length=30)
    pos = Positions.build(30, sentence=sentence, paragraph=paragraph)
    fast = enc.dense_bias(pos)  # (B, H, L, L): the token level's Toeplitz + the levels' factors, float32
    enc = copy.deepcopy(enc).double()
    slow = hierarchical_all_pairs(enc, pos)  # the reference: every level on all pairs, mixed, in float64
    assert_close_to_scale(enc.dense_bias(pos), slow, rel=1e-12, msg="float64")  # the identity, in float64
    # float32: three levels of MLP (as in the multi-scale test) and a 12-term mix: observed ~1e-7 of the
    # bias's scale; 1e-5 = 84 EPS32, while a level read at the wrong distance is ~1e-1 of it
    assert_close_to_scale(fast, slow, rel=1e-5, msg="float32")


@dataclass(eq=False)
class AllPairs(Form):
    """A whole (B, H, L, L) bias on every path by the explicit softmax, through autograd: the reference."""

    bias: Tensor  # (B, H, L, L) without the causal mask

    def attend(self, q: Tensor, k: Tensor, v: Tensor, dropout: float = 0.0, backend: str = "sdpa") -> Tensor:
        return self.reference(q, k, v)

    def scores(self, q: Tensor, k: Tensor, start: int, end: int) -> Tensor:
        logits = q[:, :, start:end] @ k[:, :, :end].transpose(-1, -2) / math.sqrt(q.shape[-1])
        return logits + self.bias[..., start:end, :end] + causal_mask(end, q.device)[start:end]

    def dense_bias(self) -> Tensor:
        return self.bias


@pytest.mark.parametrize("levels", [["token", "sentence", "paragraph"], ["sentence"]])
def test_hierarchical_model_equals_the_all_pairs_bias_forward_and_backward(levels: list[str]) -> None:
    """The model with the hierarchical bias as it runs (its `LowRank` form: the token level's Toeplitz
    mask and the sentence/paragraph factors; on the CPU, BiasedAttention with dU = dS E), in float32,
    against the same weights in float64 with the whole bias computed all-pairs and attended as one
    (B, H, L, L) bias by the explicit softmax: equal logits and equal gradients of every parameter."""
    model = tiny_model("hierarchical", f"encoding.levels=[{','.join(levels)}]").train()
    with torch.no_grad():
        model.encoding.mix.normal_()  # a mix other than the sum
    reference = copy.deepcopy(model).double()
    enc = reference.encoding
    enc.attention_form = lambda pos, queries, dtype: AllPairs(hierarchical_all_pairs(enc, pos))
    assert not model.encoding.static_form  # no form is cached, in either model
    tokens, sentence, paragraph = structured_batch(length=QUERY_CHUNK + 9)
    targets = torch.roll(tokens, -1, dims=1)
    for net in (model, reference):
        logits = net(tokens, sentence, paragraph)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
    # float32 through four layers (sums over <= 73 keys, 16 + 8 channels): observed ~1e-6 of each
    # tensor's scale; 1e-5 = 84 EPS32, while a level read at the wrong slot is off by ~1e-1 of it
    expected = reference(tokens, sentence, paragraph)
    assert_close_to_scale(model(tokens, sentence, paragraph), expected, rel=1e-5)
    largest = max(scale_of(p.grad) for p in reference.parameters())
    for (name, fast), slow in zip(model.named_parameters(), reference.parameters(), strict=True):
        if scale_of(slow.grad) < 1e-6 * largest:  # an MLP's output bias: a per-head constant, which the
            assert scale_of(fast.grad) < 1e-5 * largest, name  # softmax ignores (gradient 0 + rounding)
        else:
            assert_close_to_scale(fast.grad, slow.grad, rel=1e-5, msg=name)


def test_hierarchical_levels_and_anchor_independence() -> None:
    """Sentence/paragraph structure changes the hierarchical bias; the token level alone does not see it."""
    _, sentence, paragraph = structured_batch(length=20)
    torch.manual_seed(0)
    token_only = Hierarchical(Dims(32, 4), levels=["token"], combine="sum")
    flat = Positions.build(20, sentence=torch.zeros_like(sentence), paragraph=torch.zeros_like(paragraph))
    full = Positions.build(20, sentence=sentence, paragraph=paragraph)
    # the same float32 computation on the same token distances: equal up to an ulp at most
    assert_close_to_scale(token_only.dense_bias(flat), token_only.dense_bias(full), rel=4 * EPS32)
    torch.manual_seed(0)
    all_levels = Hierarchical(Dims(32, 4))
    assert not torch.allclose(all_levels.dense_bias(flat), all_levels.dense_bias(full))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["encoding=rope", "model.d_model=6", "model.n_heads=2"], "head_dim=3"),
        (["encoding=hierarchical", "encoding.levels=[token,word]"], "levels"),
        (["encoding=hierarchical", "encoding.combine=concat"], "combine='concat'"),
        (["encoding=multiscale", "encoding.num_freqs=0"], "num_freqs=0"),
    ],
)
def test_bad_encoding_settings(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tiny_model(*overrides[0].split("=")[1:], *overrides[1:])


# form -> (factor on x, factor on PE); scaled: s starts at E||x|| / ||PE row|| = 0.02 sqrt(d) / sqrt(d / 2)
# with the model's init std 0.02, i.e. 0.02 sqrt(2) at any d
SINUSOIDAL_FORMS = {
    "scaled": (1.0, 0.02 * math.sqrt(2)),
    "paper": (math.sqrt(8), 1.0),
    "unscaled": (1.0, 1.0),
}


@pytest.mark.parametrize("form", sorted(SINUSOIDAL_FORMS))
def test_sinusoidal_adds_the_formula_in_each_form(form: str) -> None:
    enc = Sinusoidal(Dims(d_model=8, n_heads=2), form=form)
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0))
    out = enc.embed(x, Positions.build(5, x.device, offset=3))
    p, i = 3 + torch.arange(5.0, dtype=torch.float64)[:, None], torch.arange(0, 8, 2)[None, :]
    pe = torch.stack([torch.sin(p / 10000 ** (i / 8)), torch.cos(p / 10000 ** (i / 8))], -1).flatten(1)
    token_factor, pe_factor = SINUSOIDAL_FORMS[form]
    # the formula in float64; float32 angles up to 7 rad and the sum x * a + s * pe: a few EPS32 of the
    # scale; 1e-6 = 8 EPS32, while a wrong frequency, a swapped sin/cos or a wrong factor is ~1e-1
    assert_close_to_scale(out, x.double() * token_factor + pe_factor * pe[None], rel=1e-6)


@pytest.mark.parametrize(("learn_scale", "parameters"), [(True, 1), (False, 0)])
def test_sinusoidal_scale_is_learned_unless_fixed(learn_scale: bool, parameters: int) -> None:
    enc = Sinusoidal(Dims(d_model=8, n_heads=2), learn_scale=learn_scale)
    assert sum(p.numel() for p in enc.parameters()) == parameters
    assert enc.scale is not None and enc.scale.item() == pytest.approx(0.02 * math.sqrt(2), rel=1e-6)
    for form in ("paper", "unscaled"):
        assert not list(Sinusoidal(Dims(d_model=8, n_heads=2), form=form).parameters())
