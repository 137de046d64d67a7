"""DAPE (form (4) of the design note's section 3.3): the chunked attention against the all-pairs reference
in float64, forward and backward, and the encoding's wiring and errors."""

from __future__ import annotations

import pytest
import torch

from posab.encodings import Dims, Positions, build_encoding
from posab.encodings.dape import DAPE, ScoreMixer
from posab.encodings.dape_kernel import MIX_CHUNK, Mixed, mixed_attention
from posab.encodings.reference import dape_attention_all_pairs
from posab.errors import ConfigError
from posab.forms import Additive, AttentionInputs, causal_mask
from tolerances import EPS32, assert_close_to_scale

HEADS, WIDTH, DIM = 3, 8, 4
ALIBI = {"_target_": "posab.encodings.alibi.ALiBi"}


def inputs(batch: int, mask_batch: int | None, length: int) -> tuple[list[torch.Tensor], ScoreMixer]:
    """float64 leaves q, k, v (B, H, L, D), a learned bias (mask_batch, H, L, L) or none, and a mixer."""
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(batch, HEADS, length, DIM, generator=g, dtype=torch.float64) for _ in range(3)]
    if mask_batch is not None:
        tensors.append(torch.randn(mask_batch, HEADS, length, length, generator=g, dtype=torch.float64) * 2)
    torch.manual_seed(1)
    mixer = ScoreMixer(HEADS, WIDTH).double()
    return [t.requires_grad_() for t in tensors], mixer


def outputs_and_gradients(path: str, batch: int, mask_batch: int | None, length: int) -> list[torch.Tensor]:
    """The fast path: DAPE's form over a bias shared by the batch (or none), as the model runs it; a per-row
    bias is no form's, so its rows go to the kernel itself (`mixed_attention`)."""
    leaves, mixer = inputs(batch, mask_batch, length)
    q, k, v = leaves[:3]
    mask = None if mask_batch is None else leaves[3] + causal_mask(length, q.device).double()
    if path == "fast" and mask_batch == 2:
        out = mixed_attention(q, k, v, mask, mixer)
    elif path == "fast":
        base = None if mask_batch is None else Additive(leaves[3], torch.float64)
        out = Mixed(base, mixer).attend(q, k, v)
    else:
        out = dape_attention_all_pairs(q, k, v, mask, mixer)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out.backward(grad_out)
    return [out.detach(), *(t.grad for t in leaves), *(p.grad for p in mixer.parameters())]


@pytest.mark.parametrize("mask_batch", [None, 1, 2])
@pytest.mark.parametrize("length", [7, MIX_CHUNK + 9])
def test_chunked_dape_attention_equals_the_all_pairs_reference(mask_batch: int | None, length: int) -> None:
    """Output and every gradient (q, k, v, the bias, f's weights) in float64: the two differ only in the
    order of their sums (~1e-15 of the scale); a wrong chunk boundary, term or sign is off by ~1e-1."""
    fast = outputs_and_gradients("fast", 2, mask_batch, length)
    slow = outputs_and_gradients("reference", 2, mask_batch, length)
    names = ["out", "dq", "dk", "dv", *(["dbias"] if mask_batch else []), "dW1", "db1", "dW2", "db2"]
    assert len(fast) == len(slow) == len(names)
    grads = dict(zip(names, zip(fast, slow, strict=True), strict=True))
    # f's output bias b2 adds one constant to every key of a row: softmax ignores it, its gradient is 0
    # (both sides hold rounding noise only, compared with the scale of the gradient of W2)
    for side in grads.pop("db2"):
        assert side.abs().max() <= 1e-12 * grads["dW2"][1].abs().max()
    for name, (a, b) in grads.items():
        assert a is not None and b is not None, name
        assert_close_to_scale(a, b, rel=1e-12, msg=name)


def test_evaluation_path_and_attention_probabilities_equal_training_path() -> None:
    """Without gradients the chunked forward alone runs; the attention analysis's probabilities include f."""
    leaves, mixer = inputs(2, 1, MIX_CHUNK + 3)
    q, k, v, bias = (t.detach().float() for t in leaves)
    mixer = mixer.float()
    mask = bias + causal_mask(q.shape[-2], q.device)
    form = Mixed(Additive(bias, torch.float32), mixer)
    with torch.no_grad():
        evaluated = form.attend(q, k, v)
        probs = AttentionInputs(q, k, form).probabilities()
    reference = dape_attention_all_pairs(*(t.double() for t in (q, k, v, mask)), mixer.double())
    assert_close_to_scale(evaluated, reference, rel=100 * EPS32, msg="evaluation forward")
    assert_close_to_scale(probs @ v, reference, rel=100 * EPS32, msg="probabilities")
    assert torch.allclose(probs.sum(-1), torch.ones(()), atol=1e-5)
    assert probs.triu(1).abs().max() == 0  # causal: no weight on a future key


def bf16_training_step(autocast: bool) -> list[torch.Tensor]:
    """The output and gradients of DAPE's attention from bf16 q, k, v (as autocast's projections give
    them), with or without bf16 autocast around the forward pass; the backward runs outside it, as in
    `Trainer.step`."""
    leaves, mixer = inputs(2, 1, MIX_CHUNK + 3)
    q, k, v = (t.detach().bfloat16().requires_grad_() for t in leaves[:3])
    mixer = mixer.float()
    form = Mixed(Additive(leaves[3].detach().float(), torch.float32), mixer)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = form.attend(q, k, v)
    out.float().square().sum().backward()
    return [out.detach(), *(t.grad for t in (q, k, v)), *(p.grad for p in mixer.parameters())]


def test_dape_under_bf16_autocast_runs_f_in_float32_forward_and_backward_alike() -> None:
    """train.precision=bf16 (or auto on AVX-512 bf16): autocast must not reach f, or the forward runs f's
    bmm in bf16 while the backward recomputes it in float32 against the forward's log-sum-exp; and the
    needle evaluation's attention probabilities stay float32 (in bf16, numpy cannot hold them)."""
    with_autocast, without = bf16_training_step(True), bf16_training_step(False)
    names = ["out", "dq", "dk", "dv", "dW1", "db1", "dW2", "db2"]
    for name, a, b in zip(names, with_autocast, without, strict=True):
        assert a is not None and b is not None and torch.equal(a, b), name
    leaves, mixer = inputs(1, 1, 5)
    q, k = (t.detach().bfloat16() for t in leaves[:2])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        form = Mixed(Additive(leaves[3].detach().float(), torch.float32), mixer.float())
        probs = AttentionInputs(q, k, form).probabilities()
    assert probs.dtype == torch.float32


def test_dape_wraps_its_base_bias_and_has_one_mixer_per_layer() -> None:
    dims = Dims(d_model=12, n_heads=HEADS, n_layers=3)
    dape = build_encoding({"_target_": "posab.encodings.dape.DAPE", "base": ALIBI, "width": 5}, dims)
    alibi = build_encoding(ALIBI, dims)
    pos = Positions.build(9)
    assert torch.equal(dape.dense_bias(pos), alibi.dense_bias(pos))
    assert isinstance(dape, DAPE) and dape.static_form and dape.relative_only
    form = dape.attention_form(pos, 9, torch.float32)
    layers = [dape.layer_form(form, layer) for layer in range(3)]
    assert all(isinstance(f, Mixed) and f.base is form for f in layers)  # every layer over the one bias
    mixers = [f.mixer for f in layers]
    assert len({id(m) for m in mixers}) == 3
    assert mixers[0].first.weight.shape == (5, 2 * HEADS) and mixers[0].second.weight.shape == (HEADS, 5)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"base": ALIBI, "width": 0}, "width=0"),
        ({"base": {"num_freqs": 4}}, "_target_"),
        ({"base": {"_target_": "posab.encodings.rope.RoPE"}}, "additive bias"),
        ({"base": {"_target_": "posab.encodings.multiscale.MultiScale", "form": "multiplicative"}}, "score"),
        ({"base": "alibi"}, "base='alibi' is not a valid mapping"),
    ],
)
def test_bad_dape_settings_are_named(spec: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_encoding({"_target_": "posab.encodings.dape.DAPE", "name": "dape", **spec}, Dims(16, 2))


def test_attention_dropout_with_a_mixer_is_refused() -> None:
    leaves, mixer = inputs(1, 1, 5)
    with pytest.raises(ValueError, match="dropout=0.1"):
        Mixed(Additive(leaves[3], torch.float64), mixer).attend(*leaves[:3], dropout=0.1)
