"""Randomized positions (posab.encodings.randomized): the sample, its seeding, what the base sees in
training and at evaluation, the bias of a distance base at sampled positions, and the settings' errors.
The shared suite runs the randomized_* configs too (tests/test_encodings.py, test_cache_equivalence.py...)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from conftest import run_main, text_like, tiny_model
from posab.cache import KVCache
from posab.decoding import generate, step_by_step_full
from posab.encodings import Dims, Positions, build_encoding
from posab.encodings.alibi import alibi_slopes
from posab.encodings.randomized import Randomized, sorted_sample
from posab.encodings.rope import RoPE
from posab.errors import ConfigError
from posab.run.reevaluation import reevaluate
from tolerances import assert_close_to_scale

ROPE = {"_target_": "posab.encodings.rope.RoPE"}
SINUSOIDAL = {"_target_": "posab.encodings.sinusoidal.Sinusoidal"}
LEARNED = {"_target_": "posab.encodings.learned.Learned"}
ALIBI = {"_target_": "posab.encodings.alibi.ALiBi"}
T5 = {"_target_": "posab.encodings.t5.T5Bias"}
DIMS = Dims(d_model=16, n_heads=4, train_len=32, max_positions=33, seed=3)


def wrapper(base: dict[str, Any], dims: Dims = DIMS, **settings: Any) -> Randomized:
    return Randomized(dims, base, **settings)


def drawn(enc: Randomized, length: int, passes: int) -> list[Tensor]:
    """The positions of `passes` forward passes of `length` tokens (a new `Positions` per pass, as the
    model builds one)."""
    return [enc.positions(Positions.build(length)).token for _ in range(passes)]


def test_the_sample_is_sorted_distinct_and_in_range_and_uniform() -> None:
    g = torch.Generator().manual_seed(0)
    samples = torch.stack([sorted_sample(32, 256, g) for _ in range(2000)])  # (2000, 32)
    assert bool((samples[:, 1:] > samples[:, :-1]).all())  # sorted, hence without replacement
    assert int(samples.min()) >= 0 and int(samples.max()) < 256
    # uniform without replacement: every value drawn with probability 32/256 per sample
    counts = torch.bincount(samples.flatten(), minlength=256).double() / 2000
    assert abs(float(counts.mean()) - 0.125) < 1e-12 and float((counts - 0.125).abs().max()) < 0.04
    # the k-th smallest of 32 of 256 has mean (k + 1) * 257 / 33 - 1
    expected = (torch.arange(1, 33, dtype=torch.float64) * 257 / 33) - 1
    assert float((samples.double().mean(0) - expected).abs().max()) < 2.0


def test_training_draws_a_new_sample_per_pass_reproducibly_per_seed() -> None:
    """L_max = 8 x the training length; the same seed draws the same sequence, another seed another."""
    enc = wrapper(ROPE).train()
    first = drawn(enc, 32, 3)
    assert enc.max_length == 8 * 32 and all(int(t.max()) < 256 for t in first)
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])
    again = drawn(wrapper(ROPE).train(), 32, 3)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    other = Dims(16, 4, 32, 33, seed=4)
    assert not torch.equal(drawn(wrapper(ROPE, other).train(), 32, 1)[0], first[0])


def test_one_pass_draws_once_for_every_hook_and_layer() -> None:
    """The model hands embed, attention_form and every layer's rotate the same `Positions`: one sample."""
    enc = wrapper(ROPE).train()
    pos = Positions.build(20)
    seen = [enc.positions(pos) for _ in range(4)]
    assert all(s is seen[0] for s in seen)
    assert seen[0].first == int(seen[0].token[0]) and seen[0].last == int(seen[0].token[-1])


def test_the_base_sees_the_sampled_positions() -> None:
    """rope under the wrapper rotates as rope at the drawn positions; sinusoidal embeds them."""
    enc = wrapper(ROPE).train()
    pos = Positions.build(24)
    q, k = (torch.randn(2, 4, 24, 4, generator=torch.Generator().manual_seed(s)) for s in (0, 1))
    got = enc.rotate(q, k, pos)
    sample = enc.positions(pos).token
    direct = RoPE(DIMS).rotate(q, k, Positions(sample, int(sample[0]), largest=int(sample[-1])))
    assert all(torch.equal(a, b) for a, b in zip(got, direct, strict=True))
    assert not torch.equal(got[0], RoPE(DIMS).rotate(q, k, pos)[0])
    sinusoidal = wrapper(SINUSOIDAL).train()
    x = torch.zeros(1, 24, 16)
    embedded = sinusoidal.embed(x, pos)
    table = sinusoidal.base.table(sinusoidal.positions(pos).token) * sinusoidal.base.scale  # (T, C)
    assert torch.equal(embedded[0], table.to(x.dtype))


def test_evaluation_is_contiguous_or_sampled_and_sampled_evaluations_repeat() -> None:
    """contiguous: the base sees the true positions; sampled: a sample per pass, the same sequence of
    samples in every evaluation (the draws are re-seeded on entering evaluation mode)."""
    pos = Positions.build(24, offset=5)
    assert wrapper(ROPE).eval().positions(pos) is pos
    enc = wrapper(ROPE, eval_positions="sampled").eval()
    first = drawn(enc, 24, 2)
    assert not torch.equal(first[0], first[1]) and int(first[0].max()) < 256
    enc.train()
    drawn(enc, 24, 5)  # training draws in between change nothing at evaluation
    enc.eval()
    assert all(torch.equal(a, b) for a, b in zip(first, drawn(enc, 24, 2), strict=True))
    assert enc.positions(Positions.build(256)).token.equal(torch.arange(256))  # L_max tokens: every position


def test_relative_only_and_static_form_follow_the_base_and_the_evaluation_positions() -> None:
    assert wrapper(ROPE).relative_only and not wrapper(SINUSOIDAL).relative_only
    assert not wrapper(ROPE, eval_positions="sampled").relative_only
    alibi = wrapper(ALIBI)
    assert alibi.relative_only and not alibi.train().static_form and alibi.eval().static_form
    assert not wrapper(ALIBI, eval_positions="sampled").eval().static_form
    assert Randomized.same_in_training("eval_positions", "contiguous", "sampled", 512)
    assert not Randomized.same_in_training("max_length_factor", 8, 4, 512)


@pytest.mark.parametrize("base", [ALIBI, T5])
def test_a_distance_base_takes_its_bias_at_the_sampled_differences(base: dict[str, Any]) -> None:
    """At sampled positions the bias is the base's b(p_i - p_j) (ALiBi: -m_h (p_i - p_j)), for the last
    c queries too; at contiguous positions it is the base's own Toeplitz form, exactly."""
    enc = wrapper(base).train()
    pos = Positions.build(12)
    sample = enc.positions(pos).token
    bias = enc.attention_form(pos, 12, torch.float32).dense_bias()[0]  # (H, T, T)
    differences = (sample[:, None] - sample[None, :]).float()  # (T, T)
    expected = torch.stack([enc.base.distance_bias(row) for row in differences], dim=1)  # (H, T, T)
    assert torch.equal(bias, expected)
    if base is ALIBI:
        slopes = alibi_slopes(4)[:, None, None]
        assert_close_to_scale(bias, -slopes * differences, rel=1e-7)
    assert torch.equal(enc.sampled_bias(enc.positions(pos), 5), bias[:, -5:])  # the last 5 queries' rows
    contiguous = Positions.build(12)
    assert torch.equal(enc.sampled_bias(contiguous, 12), enc.base.dense_bias(contiguous)[0])


def test_a_learned_bias_base_trains_through_the_sampled_bias() -> None:
    model = tiny_model("randomized_rope", "encoding.base._target_=posab.encodings.t5.T5Bias")
    assert model.encoding.base.__class__.__name__ == "T5Bias"
    model.train()
    tokens, sentence, paragraph = text_like(40)
    model(tokens, sentence, paragraph).logsumexp(-1).mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.encoding.parameters())


def test_a_learned_base_gets_a_row_for_every_position_it_may_draw() -> None:
    enc = wrapper(LEARNED).train()
    assert enc.base.num_rows == 8 * 32  # L_max, though the run's own positions stop at 32
    assert enc.summary() == {"learned/rows_allocated": 256, "learned/rows_trained": 256}
    x = torch.zeros(1, 32, 16)
    assert enc.embed(x, Positions.build(32)).shape == (1, 32, 16)


def test_a_resumed_run_continues_the_draws() -> None:
    enc = wrapper(ROPE).train()
    drawn(enc, 16, 3)
    state = enc.state_dict()
    expected = drawn(enc, 16, 2)
    resumed = wrapper(ROPE).train()
    resumed.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(drawn(resumed, 16, 2), expected, strict=True))


def test_the_same_seed_trains_the_same_model() -> None:
    """Two models of one seed: the same logits pass by pass in training; passes differ from each other."""
    batch = text_like(30)
    one, two = (tiny_model("randomized_rope").train() for _ in range(2))
    with torch.no_grad():
        first = [one(*batch) for _ in range(2)]
        second = [two(*batch) for _ in range(2)]
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert not torch.equal(first[0], first[1])


@pytest.mark.parametrize(
    ("base", "settings", "message"),
    [
        ({"_target_": "posab.encodings.fire.FIRE"}, {}, "not position-indexed: a dense-bias encoding acts"),
        ({"_target_": "posab.encodings.hierarchical.Hierarchical"}, {}, "rope, xpos"),
        ({"_target_": "posab.encodings.dape.DAPE", "base": ALIBI}, {}, "alibi, t5, kerple"),
        ({"base": 1}, {}, "_target_"),
        (ROPE, {"eval_positions": "shuffled"}, "eval_positions='shuffled'"),
        (ROPE, {"max_length_factor": 0}, "max_length_factor=0"),
    ],
)
def test_bad_settings_are_config_errors_naming_them(base: dict, settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_encoding({"_target_": "posab.encodings.randomized.Randomized", "base": base, **settings}, DIMS)


def test_a_sampled_sequence_longer_than_l_max_is_named() -> None:
    enc = wrapper(ROPE, max_length_factor=1).train()
    with pytest.raises(ConfigError, match=r"33 tokens .* \[0, 32\); raise encoding.max_length_factor"):
        enc.positions(Positions.build(33))


def test_sampled_evaluation_decodes_with_a_cache_only_within_a_plan() -> None:
    """A cached step's keys outnumber its queries: without a plan of the whole sequence that is an error
    naming the remedy; within one (`planned_positions`) every pass reads the plan's positions, so cached
    steps give the full pass's logits under the same plan, and cached greedy decoding (which plans itself)
    chooses what step-by-step full decoding chooses from the same draws."""
    model = tiny_model("randomized_rope", "encoding.eval_positions=sampled")
    tokens, sentence, paragraph = text_like(12)
    with torch.no_grad():
        cache = KVCache()
        model(tokens[:, :8], sentence[:, :8], paragraph[:, :8], cache=cache)
        with pytest.raises(ConfigError, match="only within a plan of the whole sequence"):
            model(tokens[:, 8:], sentence[:, 8:], paragraph[:, 8:], cache=cache)
        with model.encoding.planned_positions(12):
            plan = model.encoding._plan.clone()
            full = model(tokens, sentence, paragraph)
            cache = KVCache()
            steps = [model(tokens[:, :8], sentence[:, :8], paragraph[:, :8], cache=cache)]
            steps += [
                model(tokens[:, t : t + 1], sentence[:, t : t + 1], paragraph[:, t : t + 1], cache=cache)
                for t in range(8, 12)
            ]
            with model.encoding.planned_positions(10):  # a plan long enough is kept
                assert torch.equal(model.encoding._plan, plan)
        assert_close_to_scale(torch.cat(steps, dim=1), full, rel=1e-5)
        assert model.encoding._plan is None and plan.tolist() == sorted(set(plan.tolist()))
        assert plan.tolist() != list(range(12))  # a sample of [0, 8 x 128), not the true positions
        contiguous = tiny_model("randomized_rope")(tokens, sentence, paragraph)
        assert (contiguous - full).abs().max() > 1e-3 * full.abs().max()  # the plan's positions do act

    def decode(decoder) -> Tensor:
        model.train()
        model.eval()  # the evaluation draws restart: both decoders draw the same plan
        return decoder(model, tokens[:, :8], 6)

    assert torch.equal(decode(generate), decode(step_by_step_full))


def test_a_sampled_evaluation_is_reproduced_from_the_checkpoint_and_contiguous_re_scores_it(
    tmp_path: Path,
) -> None:
    """A tiny run evaluated with sampled positions: re-evaluating its checkpoint draws the same positions
    (the same numbers), and `posab evaluate` may switch it to contiguous (the same weights, other numbers);
    a setting that changes training is refused."""
    settings = ["+experiment=tiny", "encoding=randomized_rope", "eval.needle.enabled=false"]
    trained = run_main([*settings, "encoding.eval_positions=sampled"], tmp_path / "run")
    again = reevaluate(tmp_path / "run", [], tmp_path / "again")
    assert again["ppl/128"] == pytest.approx(trained["eval"]["ppl/128"], rel=1e-6)
    assert again["ppl/256"] == pytest.approx(trained["eval"]["ppl/256"], rel=1e-6)
    contiguous = reevaluate(tmp_path / "run", ["encoding.eval_positions=contiguous"], tmp_path / "contiguous")
    assert contiguous["ppl/128"] != pytest.approx(trained["eval"]["ppl/128"], rel=1e-6)
    with pytest.raises(ConfigError, match="would have changed training"):
        reevaluate(tmp_path / "run", ["encoding.max_length_factor=4"], tmp_path / "refused")
