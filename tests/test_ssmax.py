"""Scalable softmax (`model.ssmax`, Nakanishi 2025; issue 59): the attention of a layer with SSMax against
the paper's softmax over n keys of (s_h ln n) z written out in float64, forward and every gradient (s_h
too), with and without a sliding window; at its initial s_h the training length's last query attends as
softmax does; with every encoding, cached decoding equals the full forward and the future never reaches
the past; and a run trains with it through train.py's path."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_cache_equivalence import cached_logits

from conftest import ENCODINGS, run_main, text_like, tiny_model
from posab.layers import ScalableSoftmax
from tolerances import assert_close_to_scale

SSMAX = "model.ssmax=true"


def paper_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: torch.Tensor, window: int | None
):
    """softmax over the keys row i sees of (s_h ln n_i) q_i . k_j / sqrt(D), n_i = i + 1 (at most the
    window), all pairs in float64: (B, H, T, D)."""
    length = q.shape[-2]
    rows, cols = torch.arange(length)[:, None], torch.arange(length)[None, :]
    seen = (rows - cols >= 0) & (window is None or (rows - cols < (window or 0)))  # (T, T)
    count = seen.sum(-1).double()  # n_i: (T,)
    logits = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    logits = logits * (scale.double()[:, None, None] * count.log()[None, :, None])
    weights = logits.masked_fill(~seen, float("-inf")).softmax(-1)
    return weights @ v.double()


@pytest.mark.parametrize("window", [None, 5])
def test_ssmax_is_the_papers_softmax_forward_and_backward(window: int | None) -> None:
    ssmax = ScalableSoftmax(n_heads=3, train_len=16, window=window)
    with torch.no_grad():
        ssmax.scale.copy_(torch.tensor([0.2, 0.5, 1.3]))
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 20, 8, generator=generator, requires_grad=True) for _ in range(3))
    upstream = torch.randn(2, 3, 20, 8, generator=generator, dtype=torch.float64)
    mask = None if window is None else (torch.ones(20, 20).tril() - torch.ones(20, 20).tril(-window)).bool()
    got = F.scaled_dot_product_attention(ssmax(q, 20), k, v, attn_mask=mask, is_causal=window is None)
    (got.double() * upstream).sum().backward()
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, ssmax.scale)]
    want = paper_attention(*leaves, window)
    (want * upstream).sum().backward()
    assert_close_to_scale(got, want, rel=1e-5)
    for ours, theirs in zip((q, k, v, ssmax.scale), leaves, strict=True):
        assert ours.grad is not None and theirs.grad is not None
        assert_close_to_scale(ours.grad, theirs.grad, rel=1e-5)


def test_at_its_initial_scale_the_last_training_query_attends_as_softmax() -> None:
    plain, scaled = tiny_model("nope"), tiny_model("nope", SSMAX)
    scaled.load_state_dict(plain.state_dict(), strict=False)  # the same weights; s_h at its start
    length = plain.encoding.dims.train_len
    batch = text_like(length, seed=3)
    with torch.no_grad():
        last_plain, last_scaled = plain(*batch)[:, -1], scaled(*batch)[:, -1]
        early_plain, early_scaled = plain(*batch)[:, 10], scaled(*batch)[:, 10]
    assert_close_to_scale(last_scaled, last_plain, rel=1e-5)
    assert not torch.allclose(early_scaled, early_plain)  # ln 11 / ln 128: flatter before the last


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_with_every_encoding_decoding_is_cached_alike_and_causal(encoding: str) -> None:
    model = tiny_model(encoding, SSMAX)
    batch = text_like(150, seed=1)
    with torch.no_grad():
        full = model(*batch)  # (2, T, V)
        cut = model(*(t[:, :90] for t in batch))
    assert_close_to_scale(cached_logits(model, batch, 138, 1, 0), full, rel=1e-5)
    assert_close_to_scale(cut, full[:, :90], rel=1e-5)  # the 60 later tokens change none of the first 90


def test_a_run_trains_with_ssmax(tmp_path: Path) -> None:
    overrides = [
        "+experiment=tiny",
        SSMAX,
        "train.steps=4",
        "train.val_every=2",
        "train.checkpoint_every=4",
        "eval.progress=false",
        "train.progress=false",
    ]
    results = run_main(overrides, tmp_path)
    assert results["status"] == "finished" and math.isfinite(results["val_loss"])
