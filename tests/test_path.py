"""PaTH and PaTH-FoX (Yang et al., 2025; conf/encoding/path.yaml, path_fox.yaml): the chunked kernel
against the paper's logits with every product of (D, D) transforms formed explicitly, in float64, forward
and every gradient (q, k, v, w, beta and the gate sums), over several chunks with padding and over chunks
of one; a block of queries after cached keys; float32 against float64; the scores the attention analysis
reads; the layer's w and beta; the audit's statistics. (The shared suite runs both as every encoding,
cached decoding and the meta device included.)"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import posab.encodings.path_kernel as path_kernel
from conftest import tiny_model, typed_config
from posab.build import build_model
from posab.encodings.path_kernel import PathAttention, PathForm, carried_keys, explicit_logits, path_attention
from posab.errors import ConfigError
from tolerances import assert_close_to_scale

BATCH, HEADS, LENGTH, DIM = 2, 3, 19, 8


def inputs(dtype: torch.dtype = torch.float64, length: int = LENGTH, seed: int = 1) -> list[torch.Tensor]:
    """q, k, v, w (unit), beta in (0, 2) and gate sums c of a window."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(BATCH, HEADS, length, DIM, generator=generator, dtype=dtype) for _ in range(3))
    w = F.normalize(torch.randn(BATCH, HEADS, length, DIM, generator=generator, dtype=dtype), dim=-1)
    beta = 2 * torch.rand(BATCH, HEADS, length, generator=generator, dtype=dtype)
    gates = F.logsigmoid(torch.randn(BATCH, HEADS, length, generator=generator, dtype=dtype) + 2)
    return [q, k, v, w, beta, torch.cumsum(gates, dim=-1)]


def paper_attention(*inputs: torch.Tensor | None) -> torch.Tensor:
    """softmax(q_i^T (H_i ... H_{j+1}) k_j / sqrt(d) [+ c_i - c_j]) V with every product formed, from q, k,
    v, w, beta and c (or None)."""
    q, k, v, w, beta, cum = inputs
    assert q is not None and k is not None and v is not None and w is not None and beta is not None
    scores = explicit_logits(q, k, w, beta) / math.sqrt(q.shape[-1])  # (B, H, L, L)
    if cum is not None:
        scores = scores + cum[..., :, None] - cum[..., None, :]
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("chunk", [4, 32, 1])
@pytest.mark.parametrize("gated", [False, True], ids=["path", "path_fox"])
def test_the_kernel_is_the_papers_product_forward_and_backward(
    chunk: int, gated: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """19 tokens in chunks of 4 (four whole, one padded), one chunk of 32, and chunks of one token."""
    monkeypatch.setattr(PathAttention, "chunk", chunk)
    leaves = [t.requires_grad_() for t in inputs()]
    if not gated:
        leaves[5] = None
    out, final = path_attention(*leaves)
    assert final is None  # a gradient is taken: no rewritten keys
    upstream = torch.randn_like(out)
    wanted = [t for t in leaves if t is not None]
    got = torch.autograd.grad((out * upstream).sum(), wanted)
    theirs = [None if t is None else t.detach().clone().requires_grad_() for t in leaves]
    expected = paper_attention(*theirs)
    want = torch.autograd.grad((expected * upstream).sum(), [t for t in theirs if t is not None])
    assert_close_to_scale(out, expected, rel=1e-12)
    for name, ours, reference in zip("q k v w beta cum".split(), got, want, strict=False):
        assert_close_to_scale(ours, reference, rel=1e-12, msg=name)


@pytest.mark.parametrize("gated", [False, True], ids=["path", "path_fox"])
def test_a_block_after_cached_keys_reads_them_as_rewritten_and_leaves_the_windows_keys(
    gated: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first 11 tokens' pass leaves their keys carried through token 10; the last 8 queries over those
    and their own keys give the window's last 8 rows, and the keys they leave are the window's."""
    monkeypatch.setattr(PathAttention, "chunk", 4)
    q, k, v, w, beta, cum = inputs()
    cum = cum if gated else None
    first = 11
    with torch.no_grad():
        _, carried = path_attention(
            q[:, :, :first],
            k[:, :, :first],
            v[:, :, :first],
            w[:, :, :first],
            beta[:, :, :first],
            None if cum is None else cum[..., :first],
        )
        keys = torch.cat([carried, k[:, :, first:]], dim=-2)  # (B, H, L, D): the cache, then the new keys
        out, after = path_attention(q[:, :, first:], keys, v, w[:, :, first:], beta[:, :, first:], cum)
        _, whole = path_attention(q, k, v, w, beta, cum)
    assert_close_to_scale(out, paper_attention(q, k, v, w, beta, cum)[:, :, first:], rel=1e-12)
    assert after is not None and whole is not None
    assert_close_to_scale(after, whole, rel=1e-12)
    assert_close_to_scale(whole, carried_keys(k, w, beta), rel=1e-12)


def test_a_decoding_form_rewrites_the_keys_it_is_given() -> None:
    """`rewrite`: the cache's keys, after the step, are carried through the step's tokens."""
    q, k, v, w, beta, _ = inputs()
    keys = k.clone()
    with torch.no_grad():
        PathForm(w, beta, rewrite=True).attend(q, keys, v)
    assert_close_to_scale(keys, carried_keys(k, w, beta), rel=1e-12)
    with pytest.raises(RuntimeError, match="without gradients"):
        PathForm(w, beta, rewrite=True).attend(q.requires_grad_(), k.clone(), v)
    with pytest.raises(ValueError, match="model.dropout=0.0"):
        PathForm(w, beta).attend(q, k, v, dropout=0.1)


@pytest.mark.parametrize("gated", [False, True], ids=["path", "path_fox"])
def test_float32_is_float64_to_its_precision_over_several_chunks(gated: bool) -> None:
    """150 tokens in the declared chunks (several, one padded): output and every gradient within 1e-4 of
    scale."""
    leaves64 = [t.requires_grad_() for t in inputs(length=150, seed=3)]
    leaves32 = [t.detach().float().requires_grad_() for t in leaves64]
    if not gated:
        leaves64[5] = leaves32[5] = None
    outs, grads = [], []
    for leaves in (leaves64, leaves32):
        out, _ = path_attention(*leaves)
        upstream = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
        grads.append(torch.autograd.grad((out * upstream).sum(), [t for t in leaves if t is not None]))
        outs.append(out)
    assert outs[1].dtype == torch.float32
    assert_close_to_scale(outs[1], outs[0], rel=1e-5)
    for name, low, high in zip("q k v w beta cum".split(), grads[1], grads[0], strict=False):
        assert_close_to_scale(low, high, rel=1e-4, msg=name)


def test_scores_are_the_papers_logits_in_order_and_out_of_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """`scores` (the attention analysis's rows) walked in order, then asked again from the start."""
    monkeypatch.setattr(PathAttention, "chunk", 4)
    q, k, _, w, beta, cum = inputs()
    form = PathForm(w, beta, cum)
    expected = explicit_logits(q, k, w, beta) / math.sqrt(DIM) + cum[..., :, None] - cum[..., None, :]
    for start, end in [(0, 4), (4, 8), (8, 13), (13, 19), (2, 9), (16, 19)]:
        assert_close_to_scale(form.scores(q, k, start, end), expected[:, :, start:end, :end], rel=1e-12)


@pytest.mark.parametrize("encoding", ["path", "path_fox"])
def test_the_layer_makes_unit_w_and_beta_in_its_range_and_reads_three_tokens(encoding: str) -> None:
    """w is unit per head, beta in [0, 2] (1 at initialisation); changing token 5's input changes w at
    tokens 5, 6 and 7 only (the causal convolution over 3 tokens), and beta at token 5 only."""
    model = tiny_model(encoding)
    path = model.encoding
    x = torch.randn(2, 12, model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        w, beta = path.transforms(0, x, None)
    assert torch.allclose(w.norm(dim=-1), torch.ones(()), atol=1e-6)
    assert bool(((beta >= 0) & (beta <= 2)).all()) and abs(float(beta.mean()) - 1.0) < 0.1
    changed = x.clone()
    changed[:, 5] += 1.0
    with torch.no_grad():
        w2, beta2 = path.transforms(0, changed, None)
    moved = (w2 - w).abs().amax((0, 1, 3)) > 0  # (c,)
    assert moved.nonzero().flatten().tolist() == [5, 6, 7]
    assert ((beta2 - beta).abs().amax((0, 1)) > 0).nonzero().flatten().tolist() == [5]
    assert (path.gate_sums(0, x, None) is None) == (encoding == "path")


def test_the_audit_reads_how_far_the_transforms_carry_the_first_keys() -> None:
    """With beta = 0 nothing is transformed (kept 1, turned 1); with beta = 1 along one fixed w every key
    loses its component along w once (kept |k - (k.w) w| / |k|); PaTH-FoX adds FoX's statistics."""
    _, k, _, w, beta, cum = inputs()
    untouched = PathForm(w, torch.zeros_like(beta)).content_statistics(k, k)
    assert torch.allclose(untouched["path_kept_far"], torch.ones(HEADS, dtype=torch.float64))
    assert torch.allclose(untouched["path_turn_far"], torch.ones(HEADS, dtype=torch.float64))
    axis = F.normalize(torch.ones(DIM, dtype=torch.float64), dim=0).expand_as(w)
    found = PathForm(axis, torch.ones_like(beta), cum).content_statistics(k, k)
    first = k[:, :, : path_kernel.FAR_KEYS]
    along = axis[0, 0, 0]  # (D,)
    projected = first - (first @ along)[..., None] * along
    kept = projected.norm(dim=-1) / first.norm(dim=-1)  # (B, H, 16): every one has later tokens
    assert torch.allclose(found["path_beta"], torch.ones(HEADS, dtype=torch.float64))
    assert torch.allclose(found["path_kept_far"], kept.mean((0, 2)))
    assert set(found) == {"path_beta", "path_kept_far", "path_turn_far", "gate_log", "gate_bias_far"}


def test_a_window_is_refused_with_the_setting_named() -> None:
    with pytest.raises(ConfigError, match="model.window=64"):
        build_model(typed_config(["encoding=path", "model=tiny", "model.window=64"]), 256)
