"""Every encoding at its reference parametrisation (issue 13): what each starts at, how fast AdamW moves
its parameters, which of them are decayed, and that runs made before the change still build and load."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import CONF, ENCODINGS, tiny_model, typed_config
from posab.build import build_model
from posab.data.tokenizer import VOCAB_SIZE
from posab.encodings import Dims, EncodingOptimizer, Positions, encoding_optimizer
from posab.encodings.kerple import FLOOR
from posab.encodings.learned import Learned
from posab.encodings.sinusoidal import Sinusoidal
from posab.errors import ConfigError
from posab.forms import Additive, LowRank
from posab.model import DecoderLM
from posab.paths import encoding_options
from posab.sweep_lists import has_parameters
from posab.training.trainer import TrainConfig, lr_multiplier, train_optimizer
from tolerances import assert_close_to_scale

# Known to change x in `embed` (a guard: each must keep doing so); any encoding that does is held to the
# same range, listed here or not, so a new one needs no entry.
ADDS_TO_EMBEDDINGS = {"sinusoidal", "learned"}
# The encodings whose yaml builds trainable parameters (posab.sweep_lists, as tune_lr's lr_mult grid)
HAS_PARAMETERS = [name for name in ENCODINGS if has_parameters(encoding_options(name, CONF))]


def default_model(encoding: str, *overrides: str, seed: int = 0) -> DecoderLM:
    """The default model (d=128, 4 heads, training length 512) at initialisation."""
    cfg = typed_config([f"encoding={encoding}", "eval.lengths=[512]", *overrides])
    torch.manual_seed(seed)
    return build_model(cfg, VOCAB_SIZE).eval()


def token_embeddings(model: DecoderLM, length: int) -> torch.Tensor:
    """The model's own initial embeddings of random tokens: (4, length, C)."""
    tokens = torch.randint(0, VOCAB_SIZE, (4, length), generator=torch.Generator().manual_seed(0))
    return model.embed(tokens).detach()


# ------------------------------------------------------------------------------ item 1: absolute positions


@torch.no_grad()
@pytest.mark.parametrize("name", ENCODINGS)
def test_position_signal_has_the_token_signal_s_size_at_initialisation(name: str) -> None:
    """||embed(x) - x|| / ||x|| in [0.5, 2] at every position 0..train_len - 1 (norms over the batch), x the
    model's initial token embeddings; the encodings that do not add to the embeddings leave x as it is."""
    model = default_model(name)
    length = model.encoding.dims.train_len
    x = token_embeddings(model, length)  # (B, T, C)
    position = model.encoding.embed(x, Positions.build(length)) - x  # (B, T, C)
    if torch.equal(position, torch.zeros_like(x)):
        assert name not in ADDS_TO_EMBEDDINGS, f"{name} no longer adds to the embeddings"
        return
    ratio = position.norm(dim=(0, 2)) / x.norm(dim=(0, 2))  # (T,)
    assert 0.5 <= float(ratio.min()) and float(ratio.max()) <= 2, (float(ratio.min()), float(ratio.max()))


@torch.no_grad()
@pytest.mark.parametrize(
    ("form", "low", "high"), [("scaled", 0.8, 1.25), ("paper", 2.5, 4), ("unscaled", 28, 45)]
)
def test_sinusoidal_forms_position_to_token_ratio(form: str, low: float, high: float) -> None:
    """||position signal|| / ||token signal|| at initialisation, d=128: ~1 scaled, sqrt(d/2) / (0.02 d) =
    3.1 for the paper's x sqrt(d) + PE, sqrt(d/2) / (0.02 sqrt(d)) = 35 unscaled (the runs before)."""
    model = default_model("sinusoidal", f"encoding.form={form}")
    enc = model.encoding
    assert isinstance(enc, Sinusoidal)
    x = token_embeddings(model, 512)
    token = x * enc.token_scale
    position = enc.embed(x, Positions.build(512)) - token
    ratio = float(position.norm() / token.norm())
    assert low <= ratio <= high


# --------------------------------------------------------------------- item 2: learned biases, optimizer


@torch.no_grad()
@pytest.mark.parametrize(("init", "std"), [("xtransformers", math.sqrt(32)), ("gpt2", 0.02)])
def test_t5_bias_starts_at_its_reference_range(init: str, std: float) -> None:
    """xtransformers: W ~ N(0, 1) times sqrt(d_head) = sqrt(32); gpt2: N(0, 0.02^2), as the runs before."""
    model = default_model("t5", f"encoding.init={init}")
    bias = model.encoding.dense_bias(Positions.build(256))[0]  # (H, L, L): every bucket is reached within 256
    values = bias[:, 255, :].flatten()  # each head's values at distances 0..255
    table = model.encoding.table.detach()
    assert set(values.unique().tolist()) <= set((table * model.encoding.gain).flatten().tolist())
    measured = float((table * model.encoding.gain).std())  # 32 buckets x 4 heads
    assert 0.75 * std <= measured <= 1.25 * std


def kerple_step(param: str, lr: float = 0.01) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """p before, p after one AdamW step at `lr` on a tiny model's loss, and raw_p before."""
    model = tiny_model("kerple", f"encoding.param={param}").train()
    enc = model.encoding
    with torch.no_grad():
        enc.raw_p.copy_(enc.to_raw(torch.tensor([1.0, 1.5])))  # away from the floor
    optimizer = train_optimizer(model, TrainConfig(lr=lr))
    tokens = torch.randint(0, VOCAB_SIZE, (2, 33), generator=torch.Generator().manual_seed(0))
    before, raw_before = enc.p.detach().clone(), enc.raw_p.detach().clone()
    F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
    optimizer.step()
    return before, enc.p.detach().clone(), raw_before


def test_kerple_parameters_take_full_adam_steps() -> None:
    """Adam's first step moves every parameter by lr (its update is lr * g / |g|): p itself under clamp,
    raw_p under softplus, so p by only lr * sigmoid(raw_p) there (0.73 lr and 0.82 lr here)."""
    before, after, _ = kerple_step("clamp")
    assert_close_to_scale((after - before).abs(), torch.full((2,), 0.01), rel=1e-3)
    before, after, raw = kerple_step("softplus")
    assert_close_to_scale((after - before).abs(), 0.01 * torch.sigmoid(raw), rel=0.01)  # 2nd order: ~0.3%


def test_kerple_is_clamped_after_every_optimizer_step() -> None:
    model = tiny_model("kerple").train()
    with torch.no_grad():
        model.encoding.raw_p.fill_(-1.0)  # far below the floor: one step of 0.01 cannot bring it back
    optimizer = train_optimizer(model, TrainConfig(lr=0.01))
    model(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
    optimizer.step()
    assert torch.equal(model.encoding.raw_p.detach(), torch.full((2,), FLOOR))


def test_fire_c_starts_at_the_paper_s_value() -> None:
    c = float(tiny_model("fire").encoding.c.detach())
    assert c == pytest.approx(0.1, rel=1e-6)  # Li et al. 2023, the paper's code


@pytest.mark.parametrize("width", [8, 7])  # 7: one draw of a (P, 7) table is not row-stable in torch
def test_learned_rows_do_not_depend_on_the_table_size(width: int) -> None:
    small = Learned(Dims(d_model=width, n_heads=1, train_len=8, max_positions=16, seed=3))
    large = Learned(Dims(d_model=width, n_heads=1, train_len=8, max_positions=64, seed=3))
    assert torch.equal(large.weight[:16], small.weight)
    other_seed = Learned(Dims(d_model=width, n_heads=1, train_len=8, max_positions=16, seed=4))
    assert not torch.equal(other_seed.weight, small.weight)


def test_learned_table_leaves_the_global_rng_and_the_rest_of_the_model_alone() -> None:
    torch.manual_seed(0)
    Learned(Dims(d_model=8, n_heads=2, max_positions=100))
    after = torch.rand(4)
    torch.manual_seed(0)
    assert torch.equal(torch.rand(4), after)
    short, long = tiny_model("learned"), tiny_model("learned", "eval.lengths=[128,2048]")
    assert long.encoding.num_rows > short.encoding.num_rows
    long_params = dict(long.named_parameters())
    for name, param in short.named_parameters():
        rows = param.shape[0]  # the learned table: its first rows
        assert torch.equal(long_params[name][:rows], param), name


def test_learned_summary_reports_rows_trained_and_allocated() -> None:
    enc = tiny_model("learned").encoding
    assert enc.summary() == {"learned/rows_allocated": enc.num_rows, "learned/rows_trained": 128}
    assert enc.num_rows > 128  # tiny: trained at 128, evaluated up to 1000 + 512 (conftest)
    assert tiny_model("alibi").encoding.summary() == {}


def groups_of(model: DecoderLM, cfg: TrainConfig, enc: EncodingOptimizer | None = None) -> dict[int, dict]:
    """id(parameter) -> its AdamW group."""
    optimizer = train_optimizer(model, cfg, enc)
    return {id(p): group for group in optimizer.param_groups for p in group["params"]}


@pytest.mark.parametrize("name", HAS_PARAMETERS)
def test_no_encoding_parameter_is_decayed_by_default(name: str) -> None:
    model = tiny_model(name)
    cfg = TrainConfig(weight_decay=0.1, lr=0.002)
    groups = groups_of(model, cfg, encoding_optimizer(typed_config([f"encoding={name}"]).encoding))
    encoding = {id(p) for p in model.encoding.parameters()}
    assert encoding and all(groups[i]["weight_decay"] == 0.0 and groups[i]["lr"] == 0.002 for i in encoding)
    own = [p for p in model.parameters() if id(p) not in encoding]
    assert all(groups[id(p)]["weight_decay"] == (0.1 if p.dim() >= 2 else 0.0) for p in own)
    assert set(groups) == {id(p) for p in model.parameters()}  # every parameter in one group


def test_encoding_group_learns_at_lr_times_lr_mult_through_the_schedule() -> None:
    cfg = typed_config(["+experiment=tiny", "encoding=t5", "encoding.lr_mult=3"])
    model = build_model(cfg, VOCAB_SIZE)
    optimizer = train_optimizer(model, cfg.train, encoding_optimizer(cfg.encoding))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_multiplier(s, cfg.train))
    table = id(model.encoding.table)
    for step in range(5):  # warmup (2 steps in tiny), then cosine: each group's own lr times the schedule
        lrs = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
        expected = cfg.train.lr * lr_multiplier(step, cfg.train)
        assert lrs[id(model.embed.weight)] == pytest.approx(expected)
        assert lrs[table] == pytest.approx(3 * expected)
        optimizer.step()
        scheduler.step()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("encoding.lr_mult=0", "encoding.lr_mult=0: use a number > 0"),
        ("encoding.lr_mult=-1.5", "encoding.lr_mult=-1.5: use a number > 0"),
        ("encoding.lr_mult=true", "encoding.lr_mult=True: use a number > 0"),
        ("encoding.weight_decay=-0.1", "encoding.weight_decay=-0.1: use a number >= 0"),
        ("encoding.weight_decay=null", "encoding.weight_decay=None: use a number >= 0"),
    ],
)
def test_bad_optimizer_settings_are_config_errors_naming_them(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        typed_config(["encoding=nope", override])


def test_optimizer_settings_are_read_from_the_encoding_node() -> None:
    node = typed_config(["encoding=kerple", "encoding.lr_mult=2", "encoding.weight_decay=0.1"]).encoding
    assert encoding_optimizer(node) == EncodingOptimizer(2.0, 0.1)
    assert encoding_optimizer(typed_config(["encoding=alibi"]).encoding) == EncodingOptimizer(1.0, 0.0)


# ------------------------------------------------------------------------------ hierarchical's mix


def test_a_per_head_constant_bias_does_not_change_the_model() -> None:
    """Why `mix_bias` went: softmax over the keys ignores a constant added to a query row's scores."""
    model = tiny_model("hierarchical")
    tokens = torch.randint(0, VOCAB_SIZE, (2, 24), generator=torch.Generator().manual_seed(0))
    sentence, paragraph = torch.arange(24).div(5, rounding_mode="floor").expand(2, 24), torch.zeros(2, 24)
    plain = model(tokens, sentence, paragraph.long())
    original = model.encoding.attention_form
    constant = torch.tensor([3.0, -2.0])[None, :, None, None]  # (1, H, 1, 1)
    shifted_forms: list[LowRank] = []

    def with_constant(pos: Positions, queries: int, dtype: torch.dtype) -> LowRank:
        """The token level plus the constant, beside the same sentence and paragraph factors."""
        form = original(pos, queries, dtype)
        assert isinstance(form, LowRank) and form.shared is not None
        token = Additive(form.shared.dense_bias() + constant, dtype)
        shifted_forms.append(LowRank(token, form.factors, dtype))
        return shifted_forms[-1]

    model.encoding.attention_form = with_constant  # type: ignore[method-assign]
    shifted = model(tokens, sentence, paragraph.long())
    assert shifted_forms  # the model attended with the shifted bias
    # float32 rounding of scores ~3 in size: a few EPS32 of the logits; 1e-5 = 84 EPS32
    assert_close_to_scale(shifted, plain, rel=1e-5)


def test_hierarchical_has_no_per_head_constant_and_its_mix_starts_as_the_sum() -> None:
    model = tiny_model("hierarchical")
    assert not any(name.endswith("mix_bias") for name in model.state_dict())
    assert torch.equal(model.encoding.mix, torch.eye(model.cfg.n_heads).repeat(3, 1, 1))
