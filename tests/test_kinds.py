"""Every encoding declares its kind (`posab.encodings.base.Kind`) as data; this file holds each declaration
to what the encoding's hooks and forms do, and the wrappers' choices of base (DAPE, randomized positions)
to what probing the hooks used to decide (issue 57), on every configured encoding and the forms' variants."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from conftest import CASES, tiny_model
from posab.encodings.base import BIAS_KINDS, Encoding, Kind, Positions, Wrapping
from posab.encodings.randomized import indexing
from posab.encodings.stickbreaking_kernel import StickBreakingForm
from posab.forms import Additive, Causal, Form, LowRank, PerLayer, Scaled

LENGTH = 8


def inputs(encoding: Encoding) -> tuple[Positions, Tensor, Tensor, Tensor]:
    """Positions of one window with a sentence and paragraph structure, its embeddings x (1, L, C) and
    q, k (1, H, L, D)."""
    g = torch.Generator().manual_seed(0)
    units = torch.tensor([[0, 0, 1, 1, 1, 2, 2, 3]])  # (1, L)
    pos = Positions.build(LENGTH, sentence=units, paragraph=units // 2)
    dims = encoding.dims
    x = torch.randn(1, LENGTH, dims.d_model, generator=g)
    q, k = (torch.randn(1, dims.n_heads, LENGTH, dims.head_dim, generator=g) for _ in range(2))
    return pos, x, q, k


def hooks_used(encoding: Encoding) -> tuple[bool, bool, Form, Form]:
    """Whether `embed` changes its input and `rotate` more than the logits' scale (q times one number: T5's
    `scale_logits: false`), the pass's form, and layer 0's form."""
    pos, x, q, k = inputs(encoding)
    with torch.no_grad():
        embeds = not torch.equal(encoding.embed(x, pos), x)
        rotated = encoding.rotate(q, k, pos, 0)
        reshaped = rotated[0].shape != q.shape  # PoPE's q' and k' have twice the channels
        scale = 1.0 if reshaped else (rotated[0].flatten() @ q.flatten()) / (q.flatten() @ q.flatten())
        rotates = reshaped or not (
            torch.allclose(rotated[0], scale * q, rtol=1e-6, atol=0) and torch.equal(rotated[1], k)
        )
        form = encoding.attention_form(pos, LENGTH, torch.float32)
        layer = encoding.layer_form(form, 0, x)
    return embeds, rotates, form, layer


def behaves_as_declared(encoding: Encoding) -> str:
    """ "" when the encoding does what its kind says, else what it does instead."""
    embeds, rotates, form, layer = hooks_used(encoding)
    plain = not embeds and not rotates and layer is form
    checks = {
        Kind.NONE: plain and type(form) is Causal,
        Kind.ABSOLUTE: embeds and not rotates and type(form) is Causal and layer is form,
        Kind.ROTARY: rotates and not embeds and type(form) is Causal and layer is form,
        Kind.PER_LAYER: isinstance(form, PerLayer) and not isinstance(layer, PerLayer),
        Kind.DISTANCE_BIAS: plain and isinstance(form, Additive) and form.table is not None,
        Kind.DENSE_BIAS: plain and isinstance(form, Additive),
        Kind.STRUCTURE_BIAS: plain and isinstance(form, LowRank),
        Kind.SCALED: plain and isinstance(form, Scaled),
        Kind.CONTENT: not embeds and not rotates and layer is not form,
        Kind.SOFTMAX_REPLACEMENT: plain and isinstance(form, StickBreakingForm),
    }
    found = f"embeds={embeds}, rotates={rotates}, form={type(form).__name__}, layer={type(layer).__name__}"
    return "" if checks[encoding.kind] else found


def probed_additive_only(encoding: Encoding) -> bool:
    """What DAPE decided before kinds were declared: the hooks untouched (read from what they do, as the
    class-level probe read them before T5's rotate could scale its logits), the form `Additive` (a
    structural bias, which needs sentence indices, was refused with its own error then: given flat ones
    here)."""
    embeds, rotates, *_ = hooks_used(encoding)  # what the hooks do (T5's rotate scales its logits alone)
    untouched = not embeds and not rotates and type(encoding).layer_form is Encoding.layer_form
    flat = torch.zeros(1, 2, dtype=torch.long)
    form = encoding.attention_form(Positions.build(2, sentence=flat, paragraph=flat), 2, torch.float32)
    return untouched and isinstance(form, Additive)


def probed_indexing(encoding: Encoding) -> str | None:
    """What randomized positions decided before kinds were declared, from the hooks and a throwaway form."""
    embeds, rotates, *_ = hooks_used(encoding)
    untouched = {"embed": not embeds, "rotate": not rotates}
    untouched["layer_form"] = type(encoding).layer_form is Encoding.layer_form
    flat = torch.zeros(1, 2, dtype=torch.long)
    form = encoding.attention_form(Positions.build(2, sentence=flat, paragraph=flat), 2, torch.float32)
    if untouched["layer_form"] and type(form) is Causal:
        return "positions"
    by_distance = isinstance(form, Additive) and form.table is not None and encoding.static_form
    return "distance" if all(untouched.values()) and by_distance else None


@pytest.mark.parametrize(("name", "override"), CASES)
def test_each_encoding_does_what_its_declared_kind_says(name: str, override: str | None) -> None:
    encoding = tiny_model(name, *([override] if override else [])).encoding
    assert isinstance(encoding.kind, Kind)
    assert behaves_as_declared(encoding) == "", f"{name} ({override}) declared {encoding.kind}"


@pytest.mark.parametrize(("name", "override"), CASES)
def test_the_wrappers_choose_their_bases_as_probing_did(name: str, override: str | None) -> None:
    """DAPE takes the bias kinds, randomized positions the position-indexed ones and static distance
    biases: the same bases as the probes chose (a wrapper itself was opaque to them: not compared)."""
    encoding = tiny_model(name, *([override] if override else [])).encoding
    if isinstance(encoding, Wrapping):
        assert encoding.base.kind is not None
        return
    assert (encoding.kind in BIAS_KINDS) == probed_additive_only(encoding)
    assert indexing(encoding) == probed_indexing(encoding)


def test_a_wrapper_forwards_every_hook_and_declaration_to_its_base() -> None:
    """Randomized positions evaluated contiguously are their base: the same kind, embeddings, rotations and
    form; DAPE declares its own kind and keeps its base's flags."""
    randomized = tiny_model("randomized_rope").encoding
    assert randomized.kind is Kind.ROTARY and randomized.base.kind is Kind.ROTARY
    assert randomized.relative_only == randomized.base.relative_only
    assert randomized.variants == ()  # RoPE's context extensions assume contiguous positions
    pos, x, q, k = inputs(randomized)
    assert all(
        torch.equal(a, b)
        for a, b in zip(randomized.rotate(q, k, pos), randomized.base.rotate(q, k, pos), strict=True)
    )
    dape = tiny_model("dape_alibi").encoding
    assert dape.kind is Kind.CONTENT and dape.base.kind is Kind.DISTANCE_BIAS
    assert (dape.relative_only, dape.static_form) == (dape.base.relative_only, dape.base.static_form)
