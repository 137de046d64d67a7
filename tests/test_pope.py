"""PoPE (Gopalakrishnan et al., 2025; conf/encoding/pope.yaml): the logits against the paper's equation
written out over all pairs in float64, sum_c softplus(q_ic) softplus(k_jc) cos((i - j) theta_c - delta_c)
/ sqrt(D), forward and every gradient (the phase bias too); the key phase bias held in [-2 pi, 0]; its
attention through every path keeps v's width. (The shared suite runs pope as every encoding.)"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from conftest import tiny_model
from posab.encodings import Dims, Positions
from posab.encodings.pope import PoPE
from tolerances import assert_close_to_scale

DIMS = Dims(d_model=32, n_heads=2, train_len=64)  # head_dim 16


def paper_logits(q: torch.Tensor, k: torch.Tensor, delta: torch.Tensor, base: float = 1e4) -> torch.Tensor:
    """All pairs in float64: (B, H, T, T) of the paper's polar inner product over sqrt(D)."""
    length, dim = q.shape[-2], q.shape[-1]
    theta = base ** -(torch.arange(dim, dtype=torch.float64) / dim)  # (D,)
    offsets = torch.arange(length, dtype=torch.float64)[:, None] - torch.arange(length, dtype=torch.float64)
    phase = offsets[None, :, :, None] * theta - delta.double()[:, :, None, :]  # (H, T, T, D)
    magnitudes = F.softplus(q.double())[..., :, None, :] * F.softplus(k.double())[..., None, :, :]
    return (magnitudes * phase.cos()).sum(-1) / math.sqrt(dim)  # (B, H, T, T)


def test_pope_logits_are_the_papers_forward_and_backward() -> None:
    pope = PoPE(DIMS)
    with torch.no_grad():
        pope.phase_bias.uniform_(-2 * math.pi, 0.0)
    generator = torch.Generator().manual_seed(0)
    qk = torch.randn(2, 1, 2, 40, 16, generator=generator, requires_grad=True)  # q and k: (1, H, T, D)
    upstream = torch.randn(1, 2, 40, 40, generator=generator, dtype=torch.float64)
    q2, k2 = pope.rotate(qk[0], qk[1], Positions.build(40))
    assert q2.shape == (1, 2, 40, 32)
    got = q2 @ k2.transpose(-1, -2) / math.sqrt(q2.shape[-1])  # as the forms scale: 1/sqrt(2D)
    (got.double() * upstream).sum().backward()
    leaf, delta = qk.detach().double().requires_grad_(), pope.phase_bias.detach().double().requires_grad_()
    want = paper_logits(leaf[0], leaf[1], delta)
    (want * upstream).sum().backward()
    assert_close_to_scale(got, want, rel=1e-5)
    assert qk.grad is not None and leaf.grad is not None and pope.phase_bias.grad is not None
    assert_close_to_scale(qk.grad, leaf.grad, rel=1e-5)
    assert_close_to_scale(pope.phase_bias.grad, delta.grad, rel=1e-5)


def test_the_phase_bias_is_held_in_its_range() -> None:
    pope = PoPE(DIMS)
    with torch.no_grad():
        pope.phase_bias.fill_(1.0)  # above 0: read as 0
    q, k = torch.randn(2, 1, 2, 8, 16)
    _, clamped = pope.rotate(q, k, Positions.build(8))
    with torch.no_grad():
        pope.phase_bias.zero_()
    _, zero = pope.rotate(q, k, Positions.build(8))
    assert torch.equal(clamped, zero)


def test_a_pope_model_attends_with_values_of_their_own_width() -> None:
    model = tiny_model("pope")
    tokens = torch.randint(0, 64, (2, 40))
    with torch.no_grad():
        assert model(tokens).shape == (2, 40, model.vocab_size)
