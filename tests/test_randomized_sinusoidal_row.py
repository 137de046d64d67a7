"""Randomized sinusoidal, the part-10 row (results/study/frontier/randomized_sinusoidal.md): checks that
would catch a bug behind its 10.30 at 512. Over tests/test_randomized.py (the sample's law, its seeding,
embed at the drawn positions), these check the whole model: at positions 0 .. T-1 it is plain sinusoidal
exactly (contiguous evaluation, and a sample of every position in training and in sampled evaluation);
at drawn positions it is plain sinusoidal at them (nothing else in the pass changes, one sample for every
row of the batch, as the reference draws one per call); the study's range is 8 x the training length
whatever the evaluation reaches; the table survives bf16 autocast at positions up to 4,095; and the scale s
starts, trains and sits in the optimizer group as plain sinusoidal's does."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from conftest import text_like, tiny_model
from posab.encodings import Dims, EncodingOptimizer, Positions
from posab.encodings.base import INIT_STD
from posab.encodings.randomized import Randomized
from posab.model import DecoderLM
from posab.training.optim import param_groups

SINUSOIDAL = {"_target_": "posab.encodings.sinusoidal.Sinusoidal", "form": "scaled", "learn_scale": True}
STUDY = Dims(d_model=128, n_heads=4, train_len=512, max_positions=4609, seed=0)  # a main-grid run's dims


def pair(*overrides: str) -> tuple[DecoderLM, DecoderLM]:
    """A tiny randomized-sinusoidal model and a plain sinusoidal one holding the same weights (the scale is
    `encoding.base.scale` in the one, `encoding.scale` in the other)."""
    randomized = tiny_model("randomized_sinusoidal", *overrides)
    plain = tiny_model("sinusoidal")
    state = randomized.state_dict()
    del state["encoding._extra_state"]  # the training draws' generator state
    plain.load_state_dict({k.replace("encoding.base.", "encoding."): v for k, v in state.items()})
    return randomized, plain


def perturb_scale(*models: DecoderLM) -> None:
    """Move s off its initial value in every model alike, so a wrapper that ignored it would show."""
    for model in models:
        enc = model.encoding.base if isinstance(model.encoding, Randomized) else model.encoding
        with torch.no_grad():
            enc.scale.mul_(1.7)


def test_contiguous_evaluation_is_plain_sinusoidal_exactly() -> None:
    """eval_positions=contiguous: the same logits as plain sinusoidal, bit for bit, offsets honoured."""
    randomized, plain = pair()
    perturb_scale(randomized, plain)
    tokens, sentence, paragraph = text_like(96)
    with torch.no_grad():
        for offset in (None, 64):
            assert torch.equal(
                randomized(tokens, sentence, paragraph, offset=offset),
                plain(tokens, sentence, paragraph, offset=offset),
            )


def test_a_sample_of_every_position_is_plain_sinusoidal_in_training_and_sampled_evaluation() -> None:
    """L_max tokens draw every position of [0, L_max): the randomized pass is then plain sinusoidal's pass
    at 0 .. L_max - 1, in training mode and under sampled evaluation alike (here L_max = 1 x 128)."""
    randomized, plain = pair("encoding.max_length_factor=1", "encoding.eval_positions=sampled")
    perturb_scale(randomized, plain)
    tokens, sentence, paragraph = text_like(128)
    with torch.no_grad():
        for mode in (True, False):
            randomized.train(mode)
            plain.train(mode)
            assert torch.equal(randomized(tokens, sentence, paragraph), plain(tokens, sentence, paragraph))


def test_at_drawn_positions_the_whole_pass_is_plain_sinusoidal_at_them() -> None:
    """In training the only change from plain sinusoidal is the embedding's positions: the plain model whose
    embedding is read at the drawn sample gives the same logits (no layer, mask or norm sees the sample)."""
    randomized, plain = pair()
    randomized.train()
    plain.train()
    tokens, sentence, paragraph = text_like(100)
    with torch.no_grad():
        got = randomized(tokens, sentence, paragraph)
        sample = randomized.encoding._drawn[1].token  # (T,) this pass's positions
        assert sample.tolist() != list(range(100)) and int(sample.max()) < 8 * 128
        original = plain.encoding.embed
        plain.encoding.embed = lambda x, pos: original(
            x, Positions(sample, int(sample[0]), pos.sentence, pos.paragraph, largest=int(sample[-1]))
        )
        assert torch.equal(got, plain(tokens, sentence, paragraph))


def test_one_sample_serves_every_row_of_the_batch() -> None:
    """The reference draws one sample per call, broadcast over the batch: two equal rows get equal logits,
    in training and in sampled evaluation (a sample per row would make them differ)."""
    model = tiny_model("randomized_sinusoidal", "encoding.eval_positions=sampled")
    tokens, sentence, paragraph = (t[:1].expand(2, -1).contiguous() for t in text_like(64))
    with torch.no_grad():
        for mode in (True, False):
            logits = model.train(mode)(tokens, sentence, paragraph)
            assert torch.equal(logits[0], logits[1])


def draws(dims: Dims, mode: bool, passes: int) -> list[Tensor]:
    enc = Randomized(dims, SINUSOIDAL, eval_positions="sampled").train(mode)
    return [enc.positions(Positions.build(512)).token for _ in range(passes)]


def test_the_study_draws_from_eight_times_512_whatever_the_evaluation_reaches() -> None:
    """A tuning run (positions to 513) and a main-grid run (to 4,609) draw the same samples from [0, 4,096),
    in training and in sampled evaluation: distinct, sorted, spread over the range (mean gap ~ 8)."""
    tuning = Dims(d_model=128, n_heads=4, train_len=512, max_positions=513, seed=0)
    for mode in (True, False):
        main, tuned = draws(STUDY, mode, 20), draws(tuning, mode, 20)
        assert all(torch.equal(a, b) for a, b in zip(main, tuned, strict=True))
        samples = torch.stack(main)  # (20, 512)
        assert bool((samples[:, 1:] > samples[:, :-1]).all()) and int(samples.min()) >= 0
        assert int(samples.max()) < 4096 and int(samples[:, -1].min()) > 3900  # the top of the range
        gaps = (samples[:, -1] - samples[:, 0]).double() / 511
        assert 7.5 < float(gaps.mean()) < 8.1  # E gap = 4097 / 513 ~ 7.99


def test_the_table_is_exact_under_bf16_autocast_up_to_the_largest_position() -> None:
    """The training ran under bf16 autocast with positions up to 4,095: the embedding must not round them
    (bf16 has a spacing of 16 there). Under autocast it equals the fp32 computation exactly, and neighbouring
    positions at the top are as far apart as at the bottom (||PE(p) - PE(q)|| depends on p - q alone)."""
    enc = Randomized(STUDY, SINUSOIDAL).train()
    x = torch.randn(1, 512, 128, generator=torch.Generator().manual_seed(0)) * INIT_STD
    pos = Positions.build(512)
    sample = enc.positions(pos)
    expected = enc.embed(x, pos)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(enc.embed(x, pos), expected)
    top = enc.base.table(torch.tensor([4094, 4095, 4093]))
    bottom = enc.base.table(torch.tensor([0, 1, 2]))
    for table in (top, bottom):
        assert abs(float((table[0] - table[1]).norm()) - float((bottom[0] - bottom[1]).norm())) < 1e-3
    assert len(set(sample.token.tolist())) == 512


def test_the_scale_starts_trains_and_is_grouped_as_plain_sinusoidal() -> None:
    """s starts at INIT_STD * sqrt(2) (s * PE has the token embeddings' norm), is the encoding's one
    parameter, sits alone in the group at lr x lr_mult with no decay as plain sinusoidal's s does, and
    gets a gradient through the sampled positions."""
    randomized, plain = pair()
    groups = {
        name: param_groups(model, EncodingOptimizer(lr_mult=10.0), lr=3e-3, weight_decay=0.1)
        for name, model in (("randomized", randomized), ("plain", plain))
    }
    for name, model in (("randomized", randomized), ("plain", plain)):
        coded = [g for g in groups[name] if math.isclose(g.get("lr", 3e-3), 3e-2)]
        assert len(coded) == 1 and coded[0]["weight_decay"] == 0.0
        assert [p.shape for p in coded[0]["params"]] == [torch.Size([])]
        assert math.isclose(coded[0]["params"][0].item(), INIT_STD * math.sqrt(2), rel_tol=1e-6)
        assert len(list(model.encoding.parameters())) == 1
    assert coded[0]["params"][0] is plain.encoding.scale
    randomized.train()
    tokens, sentence, paragraph = text_like(64)
    randomized(tokens, sentence, paragraph).logsumexp(-1).mean().backward()
    assert randomized.encoding.base.scale.grad is not None and float(randomized.encoding.base.scale.grad) != 0
