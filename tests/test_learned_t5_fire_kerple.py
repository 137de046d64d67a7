"""Formula checks for the learned, T5, FIRE and KERPLE encodings, and their YAML configs."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from conftest import typed_config
from posab.build import build_model
from posab.data.tokenizer import VOCAB_SIZE
from posab.encodings import Dims, Positions
from posab.encodings.fire import FIRE
from posab.encodings.kerple import Kerple, inverse_softplus
from posab.encodings.learned import Learned
from posab.encodings.reference import fire_all_pairs
from posab.encodings.t5 import T5Bias, t5_buckets
from posab.errors import ConfigError
from tolerances import EPS32, assert_close_to_scale, scale_of

NEW = {"learned": Learned, "t5": T5Bias, "fire": FIRE, "kerple": Kerple}


# num_buckets=32, max_distance=128: e = 16 exact buckets; for n >= 16,
# bucket = 16 + floor(16 * ln(n / 16) / ln 8), capped at 31.
T5_CASES = [
    *[(n, n) for n in range(16)],  # exact
    (-5, 0),  # future distance: bucket 0
    (16, 16),  # 16 * ln 1 / ln 8 = 0
    (20, 17),  # 16 * ln 1.25 / ln 8 = 1.72
    (32, 21),  # 16 * ln 2 / ln 8 = 5.33
    (63, 26),  # 16 * ln 3.9375 / ln 8 = 10.55
    (64, 26),  # 16 * ln 4 / ln 8 = 10.67
    (112, 30),  # 16 * ln 7 / ln 8 = 14.97
    (113, 31),  # 16 * ln 7.0625 / ln 8 = 15.01
    (127, 31),  # 16 * ln 7.9375 / ln 8 = 15.94
    (128, 31),  # 16 * ln 8 / ln 8 = 16 -> 32, capped at 31
    (1000, 31),  # beyond max_distance: the last bucket
]


def test_t5_buckets_hand_computed() -> None:
    d = torch.tensor([n for n, _ in T5_CASES], dtype=torch.float32)
    assert t5_buckets(d, 32, 128).tolist() == [b for _, b in T5_CASES]


def reference_bucket(n: int, num_buckets: int, max_distance: int) -> int:
    """The T5 code's `_relative_position_bucket(bidirectional=False)` for one i - j, in plain Python."""
    n, exact = max(n, 0), num_buckets // 2
    if n < exact:
        return n
    large = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact))
    return min(large, num_buckets - 1)


@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (16, 64), (7, 50)])
def test_t5_buckets_match_the_reference_and_use_every_bucket(num_buckets: int, max_distance: int) -> None:
    d = torch.arange(-20, 3000)
    got = t5_buckets(d.float(), num_buckets, max_distance).tolist()
    assert got == [reference_bucket(n, num_buckets, max_distance) for n in d.tolist()]
    assert set(got) == set(range(num_buckets))


@pytest.mark.parametrize(("init", "gain"), [("xtransformers", math.sqrt(8)), ("gpt2", 1.0)])
def test_t5_bias_reads_the_table_at_the_bucket_of_i_minus_j(init: str, gain: float) -> None:
    torch.manual_seed(0)
    enc = T5Bias(Dims(d_model=32, n_heads=4), num_buckets=8, max_distance=20, init=init)  # d_head 8
    bias = enc.dense_bias(Positions.build(40))[0].double()  # (H, L, L)
    table = enc.table.detach().double()
    for i, j in [(0, 0), (5, 1), (39, 0), (30, 27), (3, 9)]:
        bucket = reference_bucket(i - j, 8, 20)
        # two float32 roundings per entry (the gain, the product): at most EPS32 of it; 2 EPS32 allowed,
        # while a wrong bucket or gain is off by a table entry's size
        assert_close_to_scale(bias[:, i, j], table[bucket] * gain, rel=2 * EPS32, msg=f"({i}, {j})")


@pytest.mark.parametrize("param", ["clamp", "softplus"])
def test_kerple_bias_hand_computed(param: str) -> None:
    enc = Kerple(Dims(d_model=32, n_heads=2), param=param)
    raw = (lambda v: v) if param == "clamp" else inverse_softplus  # the free parameter giving value v
    with torch.no_grad():
        enc.raw_p.copy_(raw(torch.tensor([1.0, 2.0])))
        enc.raw_a.copy_(raw(torch.tensor([0.5, 1.0])))
    bias = enc.dense_bias(Positions.build(8, offset=100))[0]  # (H, L, L)
    expected = {  # (i, j): [-p_0 ln(1 + a_0 (i - j)), -p_1 ln(1 + a_1 (i - j))]
        (0, 0): [0.0, 0.0],
        (5, 2): [-math.log(2.5), -2 * math.log(4.0)],  # d = 3: ln(1 + 1.5), 2 ln(1 + 3)
        (7, 0): [-math.log(4.5), -2 * math.log(8.0)],  # d = 7: ln(1 + 3.5), 2 ln(1 + 7)
        (1, 6): [0.0, 0.0],  # future: distance clamped to 0
    }
    for (i, j), values in expected.items():
        torch.testing.assert_close(bias[:, i, j], torch.tensor(values), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("param", ["clamp", "softplus"])
def test_kerple_starts_positive_as_in_the_paper(param: str) -> None:
    torch.manual_seed(0)
    enc = Kerple(Dims(d_model=64, n_heads=16), param=param)
    assert ((enc.p >= 0.0099) & (enc.p < 2)).all() and ((enc.a >= 0.0099) & (enc.a < 1)).all()
    assert enc.p.std() > 0.3 and enc.a.std() > 0.15  # spread over U(0, 2) and U(0, 1): std 0.58, 0.29


def test_kerple_clamp_keeps_p_and_a_at_the_floor() -> None:
    enc = Kerple(Dims(d_model=32, n_heads=2))
    with torch.no_grad():
        enc.raw_p.copy_(torch.tensor([-0.5, 0.3]))
        enc.raw_a.copy_(torch.tensor([0.2, 0.001]))
    assert enc.p.tolist() == pytest.approx([0.01, 0.3]) and enc.a.tolist() == pytest.approx([0.2, 0.01])
    enc.constrain()  # the reference's projection of the stored values
    assert enc.raw_p.tolist() == pytest.approx([0.01, 0.3])
    assert enc.raw_a.tolist() == pytest.approx([0.2, 0.01])


def fire_module(train_len: int = 16) -> FIRE:
    torch.manual_seed(0)
    enc = FIRE(Dims(d_model=32, n_heads=4, train_len=train_len), hidden=32, init_c=0.5)
    with torch.no_grad():
        enc.log_scale.fill_(0.3)  # L_thr = 16 e^0.3 = 21.6: rows on both sides of the threshold
    return enc


@pytest.mark.parametrize("offset", [0, 7, 500])
def test_fire_bias_is_the_formula(offset: int) -> None:
    enc = fire_module()
    bias = enc.dense_bias(Positions.build(40, offset=offset))[0]  # (H, L, L), float32
    mlp64 = copy.deepcopy(enc.mlp).double()  # the reference: the MLP itself, in float64
    c, threshold = enc.c.item(), enc.threshold.item()
    got, expected = [], []
    for r, k in [(0, 0), (10, 3), (20, 0), (25, 24), (39, 0), (39, 17)]:
        i, j = offset + r, offset + k  # absolute positions
        x = math.log(1 + c * (i - j)) / math.log(1 + c * max(i, threshold))
        got.append(bias[:, r, k])
        with torch.no_grad():
            expected.append(mlp64(torch.tensor([[x]], dtype=torch.float64))[0])  # (H,)
    # float32: x to a few EPS32, each slope and intercept a sum of <= 32 products (hidden units), so
    # ~32 EPS32 of their magnitudes; 1e-5 = 84 EPS32 of the largest value; a wrong segment or unit: ~1e-1.
    assert_close_to_scale(torch.stack(got), torch.stack(expected), rel=1e-5)


def loss_and_grads(enc: torch.nn.Module, out: torch.Tensor, weights: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gradients of sum(out * weights) with respect to each of enc's parameters."""
    enc.zero_grad()
    (out * weights.to(out.dtype)).sum().backward()
    return {name: p.grad.clone() for name, p in enc.named_parameters()}


def test_fire_piecewise_linear_equals_the_mlp_on_all_pairs_with_gradients() -> None:
    enc = fire_module()
    ref = copy.deepcopy(enc).double()
    pos = Positions.build(50, offset=3)
    weights = torch.randn(1, 4, 50, 50).tril()  # a loss on the visible pairs
    slow = fire_all_pairs(ref, pos)  # the reference: the MLP on every pair, in float64 from the same inputs
    slow_grads = loss_and_grads(ref, slow, weights)
    # the identity itself, both sides in float64: off by float64 rounding (~1e-16) only
    exact = ref.dense_bias(pos)
    for name, g in loss_and_grads(ref, exact, weights).items():
        assert_close_to_scale(g, slow_grads[name], rel=1e-12, msg=f"float64 {name}")
    assert_close_to_scale(exact, slow, rel=1e-12, msg="float64 bias")
    # the float32 path the model runs: the bias to a few EPS32 (see test_fire_bias_is_the_formula); each
    # gradient entry sums ~L^2 / 2 = 1275 weighted pairs, whose float32 rounding depends on the CPU's
    # summation order (AVX-512 vs AVX2 vs scalar: a few 1e-7 of the scale); 1e-5 = 84 EPS32 of the
    # largest entry, while a pair on a wrong segment moves an entry by ~1e-2 of it.
    fast = enc.dense_bias(pos)
    assert_close_to_scale(fast, slow, rel=1e-5, msg="float32 bias")
    fast_grads = loss_and_grads(enc, fast, weights)
    for name, g in fast_grads.items():
        assert_close_to_scale(g, slow_grads[name], rel=1e-5, msg=f"float32 {name}")
    assert all(g.abs().sum() > 0 for g in fast_grads.values())


def test_fire_depends_on_the_offset_past_the_threshold_only() -> None:
    enc = fire_module()
    at = {k: enc.dense_bias(Positions.build(20, offset=k)) for k in (0, 1, 100)}
    # every query below L_thr = 21.6: the normaliser is fixed; the same float32 formula on the same values,
    # up to an ulp where a vector kernel and its scalar tail round log1p differently
    assert_close_to_scale(at[0], at[1], rel=4 * EPS32)
    assert (at[0] - at[100]).abs().max() > 1e-3 * scale_of(at[0])  # observed 0.3 of it
    assert not FIRE.relative_only


def tiny_learned(*overrides: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(typed_config(["+experiment=tiny", "encoding=learned", *overrides]), VOCAB_SIZE)


def test_learned_rows_past_the_training_length_get_no_gradient() -> None:
    model = tiny_learned()
    train_len, rows = model.encoding.dims.train_len, model.encoding.num_rows
    assert rows == 257 > train_len == 128  # tiny: eval lengths up to 256
    tokens = torch.randint(0, VOCAB_SIZE, (2, train_len))
    logits = model(tokens)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.roll(-1, 1).flatten()).backward()
    grad = model.encoding.weight.grad
    assert (grad[train_len:] == 0).all() and (grad[:train_len].abs().sum(-1) > 0).all()


def test_learned_position_beyond_the_table_is_a_config_error() -> None:
    enc = Learned(Dims(d_model=8, n_heads=2, train_len=4, max_positions=16))
    x = torch.zeros(1, 6, 8)
    assert enc.embed(x, Positions.build(6, offset=10)).shape == (1, 6, 8)  # positions 10..15: fine
    with pytest.raises(ConfigError, match="position 16 .* 16 rows"):
        enc.embed(x, Positions.build(6, offset=11))


@pytest.mark.parametrize(("saved_rows", "rows"), [(16, 64), (64, 16)])
def test_learned_loads_a_table_with_another_number_of_rows(saved_rows: int, rows: int) -> None:
    torch.manual_seed(0)
    saved = Learned(Dims(d_model=8, n_heads=2, train_len=8, max_positions=saved_rows))
    enc = Learned(Dims(d_model=8, n_heads=2, train_len=8, max_positions=rows))
    before = enc.weight.detach().clone()
    enc.load_state_dict(saved.state_dict())
    kept = min(saved_rows, rows)
    assert enc.weight.shape == (rows, 8)
    torch.testing.assert_close(enc.weight[:kept], saved.weight[:kept], rtol=0, atol=0)
    torch.testing.assert_close(enc.weight[kept:], before[kept:], rtol=0, atol=0)


def test_learned_checkpoint_reevaluated_at_a_longer_length() -> None:
    short, long = tiny_learned(), tiny_learned("eval.lengths=[128,1024]")
    long.load_state_dict(short.state_dict())  # 257 saved rows into 1025
    torch.testing.assert_close(long.encoding.weight[:257], short.encoding.weight, rtol=0, atol=0)
    with torch.no_grad():
        assert long.eval()(torch.randint(0, VOCAB_SIZE, (1, 1024))).shape == (1, 1024, VOCAB_SIZE)


@pytest.mark.parametrize("name", sorted(NEW))
def test_builds_from_its_yaml_and_trains(name: str) -> None:
    cfg = typed_config(["+experiment=tiny", f"encoding={name}"])
    torch.manual_seed(0)
    model = build_model(cfg, VOCAB_SIZE)
    assert type(model.encoding) is NEW[name] and cfg.encoding["name"] == name
    if name == "fire":
        assert model.encoding.threshold.item() == cfg.train.seq_len
        assert model.encoding.c.item() == pytest.approx(0.1, rel=1e-6)  # the paper's code
    tokens = torch.randint(0, VOCAB_SIZE, (2, 32))
    model(tokens).logsumexp(-1).mean().backward()  # through the flash-kernel attention with a bias
    for param_name, p in model.encoding.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, param_name


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("encoding=t5 encoding.max_distance=16", "max_distance=16"),
        ("encoding=t5 encoding.num_buckets=1", "num_buckets=1"),
        ("encoding=fire encoding.hidden=0", "hidden=0"),
        ("encoding=fire encoding.init_c=0", "init_c=0"),
        ("encoding=learned encoding.init_std=-1", "init_std=-1"),
        ("encoding=kerple +encoding.slopes=1", "no setting slopes"),
        ("encoding=kerple encoding.param=exp", "param='exp'"),
        ("encoding=t5 encoding.init=zeros", "init='zeros'"),
        ("encoding=sinusoidal encoding.form=half", "form='half'"),
    ],
)
def test_bad_settings_name_the_value(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_model(typed_config(["+experiment=tiny", *override.split()]), VOCAB_SIZE)


def test_t5_with_hugging_face_s_initialisation_and_its_own_logits() -> None:
    """`init: hf`: W ~ N(0, d_model^-1/2), no gain (Hugging Face's T5); `scale_logits: false`: attention's
    logits are q . k, the queries multiplied by sqrt(d_head) before the model divides by it."""
    import math

    from posab.encodings.base import Dims, Positions
    from posab.encodings.t5 import T5Bias

    dims = Dims(d_model=256, n_heads=4)
    torch.manual_seed(0)
    hf = T5Bias(dims, init="hf")
    assert hf.gain == 1.0 and abs(hf.table.std().item() - 256**-0.5) < 0.25 * 256**-0.5
    q, k = torch.randn(1, 4, 5, 64), torch.randn(1, 4, 5, 64)
    own = T5Bias(dims, scale_logits=False).rotate(q, k, Positions.build(5))
    assert torch.equal(own[0], q * math.sqrt(64)) and own[1] is k
    plain = T5Bias(dims).rotate(q, k, Positions.build(5))
    assert plain[0] is q and plain[1] is k
