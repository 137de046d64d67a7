"""CoPE (contextual position encoding): the chunked kernel and its backward against an all-pairs float64
reference written from the paper's equations, a block of queries over a longer prefix, the clamp at
npos - 1 and the interpolation on hand-worked examples, the audit's position counts, and the encoding's
wiring (per-layer tables, npos default, cached decoding with trained-looking tables, errors)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from conftest import text_like, tiny_model
from posab.cache import KVCache
from posab.encodings import Dims, build_encoding
from posab.encodings.cope import CoPE
from posab.encodings.cope_kernel import COUNT_CHUNK, Counted
from posab.errors import ConfigError
from posab.forms import AttentionInputs
from tolerances import EPS32, assert_close_to_scale

HEADS, DIM = 3, 4
COPE = {"_target_": "posab.encodings.cope.CoPE", "name": "cope"}
LONG = COUNT_CHUNK + 9  # a length past one query chunk of the kernel


def all_pairs_counts(q: Tensor, k: Tensor) -> Tensor:
    """p_ij = sum_{t=j..i} sigmoid(q_i.k_t / sqrt(D)) over the keys t <= i, by a matrix product with the
    indicator [t >= j] (not a cumulative sum), unclamped: (B, H, c, n); 0 at future keys. The queries are
    the last c of the n keys."""
    n, c = k.shape[-2], q.shape[-2]
    rows = torch.arange(n - c, n)[:, None]  # query positions i: (c, 1)
    keys = torch.arange(n)
    visible = (keys[None, :] <= rows).to(q.dtype)  # (c, n)
    gates = torch.sigmoid(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])) * visible
    from_j = (keys[:, None] >= keys[None, :]).to(q.dtype)  # (t, j): [t >= j]
    return gates @ from_j


def cope_all_pairs(q: Tensor, k: Tensor, v: Tensor, table: Tensor, scale_positions: bool = True) -> Tensor:
    """The paper's equations on every pair: positions clamped at npos - 1, q.e[p] interpolated with the hat
    weights max(0, 1 - |p - t|) over all integer positions t (linear interpolation between floor(p) and
    ceil(p)), added to q.k before (RAM's default) or after (`--cope-nodiv`) the division by sqrt(D)."""
    npos, d = table.shape[0], q.shape[-1]
    counts = all_pairs_counts(q, k).clamp(max=npos - 1)  # (B, H, c, n)
    hat = F.relu(1 - (counts[..., None] - torch.arange(npos, dtype=q.dtype)).abs())  # (B, H, c, n, npos)
    position = torch.einsum("bhcnt,bhcd,td->bhcn", hat, q, table)  # q_i . e[p_ij]
    dot = q @ k.transpose(-1, -2)
    scores = (dot + position) / math.sqrt(d) if scale_positions else dot / math.sqrt(d) + position
    n, c = k.shape[-2], q.shape[-2]
    future = torch.arange(n)[None, :] > torch.arange(n - c, n)[:, None]  # (c, n)
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v


def leaves(length: int, npos: int, seed: int = 0) -> list[Tensor]:
    """float64 leaves q, k, v (2, H, L, D) and a table (npos, D) with entries of order 1."""
    g = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(2, HEADS, length, DIM, generator=g, dtype=torch.float64) for _ in range(3)]
    tensors.append(torch.randn(npos, DIM, generator=g, dtype=torch.float64) * 2)
    return [t.requires_grad_() for t in tensors]


def output_and_gradients(path: str, length: int, npos: int, scale_positions: bool) -> list[Tensor]:
    q, k, v, table = leaves(length, npos)
    form = Counted(table, 1 / math.sqrt(DIM) if scale_positions else 1.0)
    if path == "kernel":
        out = form.attend(q, k, v)  # the chunked forward and the core's backward (`Counting`)
    elif path == "form reference":
        out = form.reference(q, k, v)  # the form's all pairs, through autograd
    else:
        out = cope_all_pairs(q, k, v, table, scale_positions)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out.backward(grad_out)
    return [out.detach(), *(t.grad for t in (q, k, v, table))]


@pytest.mark.parametrize("scale_positions", [True, False])
@pytest.mark.parametrize(("length", "npos"), [(7, 8), (LONG, LONG + 1), (LONG, 5)])
@pytest.mark.parametrize("path", ["kernel", "form reference"])
def test_cope_equals_the_all_pairs(path: str, length: int, npos: int, scale_positions: bool) -> None:
    """Output and every gradient (q, k, v, the table) in float64, with npos = L + 1 (the default: no count
    reaches the clamp) and npos = 5 (most do). The paths differ from the reference only in the order of
    their sums (~1e-15 of the scale); a wrong chunk boundary, term, clamp or scale is off by ~1e-1."""
    fast = output_and_gradients(path, length, npos, scale_positions)
    slow = output_and_gradients("all pairs", length, npos, scale_positions)
    for name, a, b in zip(["out", "dq", "dk", "dv", "dtable"], fast, slow, strict=True):
        assert a is not None and b is not None, name
        assert_close_to_scale(a, b, rel=1e-12, msg=name)


def test_a_block_of_queries_over_a_longer_prefix_equals_the_reference_rows() -> None:
    """Cached decoding and chunked evaluation: the last c queries against all n keys (the block path, and
    `scores` from a row inside the block) are the reference's rows; no state is kept between steps."""
    q, k, v, table = (t.detach() for t in leaves(COUNT_CHUNK + 20, 9))
    form = Counted(table, 1 / math.sqrt(DIM))
    rows = 13
    block = form.attend(q[:, :, -rows:], k, v)  # (B, H, rows, D)
    assert_close_to_scale(block, cope_all_pairs(q, k, v, table)[:, :, -rows:], rel=1e-12)
    scores = form.scores(q[:, :, -rows:], k, 4, rows)  # rows 4.. of the block: (B, H, rows - 4, n)
    probs = torch.softmax(scores, dim=-1)
    assert_close_to_scale(probs @ v, cope_all_pairs(q, k, v, table)[:, :, -rows + 4 :], rel=1e-12)


def saturated(length: int, npos: int, table: Tensor) -> tuple[Tensor, Tensor, Counted]:
    """q = k = (10, 10) at every position (q.k / sqrt(2) = 141: every gate is 1.0 in float64), D = 2."""
    qk = torch.full((1, 1, length, 2), 10.0, dtype=torch.float64)
    return qk, qk.clone(), Counted(table, 1 / math.sqrt(2))


def test_the_clamp_at_npos_minus_one_by_hand() -> None:
    """Every gate 1: p_ij = i - j + 1, clamped at npos - 1 = 3; with e[t] = (t, 0), q.e[p] = 10 p, so row i
    of the scores is (q.k + 10 min(i - j + 1, 3)) / sqrt(2) exactly, and the audit counts i + 1 keys, of
    which i + 1 - 3 pass the clamp."""
    table = torch.stack([torch.arange(4.0), torch.zeros(4)], dim=1).double()  # e[t] = (t, 0)
    q, k, form = saturated(6, 4, table)
    expected_counts = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [2, 1, 0, 0, 0, 0],
            [3, 2, 1, 0, 0, 0],
            [3, 3, 2, 1, 0, 0],  # p_30 = 4, clamped to 3
            [3, 3, 3, 2, 1, 0],
            [3, 3, 3, 3, 2, 1],
        ],
        dtype=torch.float64,
    )
    expected = (200.0 + 10.0 * expected_counts) / math.sqrt(2)
    expected = expected.masked_fill(torch.ones(6, 6).triu(1).bool(), float("-inf"))
    assert torch.equal(form.scores(q, k, 0, 6)[0, 0], expected)
    counts = form.position_counts(q, k)
    rows = torch.arange(6.0)
    assert torch.equal(counts.largest[0, 0], rows + 1) and counts.limit.tolist() == [3]
    assert torch.equal(counts.past[0, 0], (rows + 1 - 3).clamp(min=0) / (rows + 1))
    assert torch.equal(counts.mean[0, 0], (rows + 2) / 2)  # mean of 1 .. i + 1


def test_interpolation_is_exact_at_integers_and_linear_between() -> None:
    """Every gate 1/2 (q orthogonal to k): p_ij = (i - j + 1) / 2, an integer for odd i - j and a half
    between; with e[t] = (t^2, 0) and q = (1, 0) the position logit is t^2 at an integer and (floor^2 +
    ceil^2) / 2 between (not p^2: the interpolation is linear in e)."""
    table = torch.stack([torch.arange(8.0) ** 2, torch.zeros(8)], dim=1).double()
    q = torch.tensor([1.0, 0.0], dtype=torch.float64).expand(1, 1, 8, 2)
    k = torch.tensor([0.0, 1.0], dtype=torch.float64).expand(1, 1, 8, 2)
    scores = Counted(table, 1.0).scores(q, k, 0, 8)[0, 0]
    for i in range(8):
        for j in range(i + 1):
            p = (i - j + 1) / 2
            expected = p**2 if p.is_integer() else (math.floor(p) ** 2 + math.ceil(p) ** 2) / 2
            assert scores[i, j] == expected, (i, j)
    # the gradients there too: at an integer count floor(p) = ceil(p) gives the count no gradient (the
    # reference's ceil; the hat weights' kinks, likewise), between two it is the spread of the two logits
    v = torch.randn(1, 1, 8, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    grads = []
    for attend in (lambda *a: Counted(table, 1.0).attend(*a), lambda *a: cope_all_pairs(*a, table, False)):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        attend(*inputs).square().sum().backward()
        grads.append([t.grad for t in inputs])
    for name, a, b in zip(["dq", "dk", "dv"], *grads, strict=True):
        assert_close_to_scale(a, b, rel=1e-12, msg=name)


def test_position_counts_equal_the_reference_counts_over_a_longer_prefix() -> None:
    q, k, _, table = (t.detach() for t in leaves(COUNT_CHUNK + 20, 6))
    rows = COUNT_CHUNK + 3
    counts = Counted(table, 1.0).position_counts(q[:, :, -rows:], k)
    reference = all_pairs_counts(q[:, :, -rows:], k)  # (B, H, rows, n), 0 at future keys
    seen = torch.arange(k.shape[-2] - rows + 1, k.shape[-2] + 1, dtype=torch.float64)  # keys per row
    assert_close_to_scale(counts.largest, reference[..., 0], rel=100 * EPS32)  # float32 sums of ~50 gates
    assert_close_to_scale(counts.mean, reference.sum(-1) / seen, rel=100 * EPS32)
    assert_close_to_scale(counts.past, (reference > 5).sum(-1) / seen, rel=1e-6)
    heads = torch.tensor([1.0, 4.0, 20.0])  # a limit per head
    per_head = Counted(table, 1.0).position_counts(q[:, :, -rows:], k, heads).past
    assert_close_to_scale(per_head, (reference > heads[:, None, None]).sum(-1) / seen, rel=1e-6)


def bf16_training_step(autocast: bool) -> list[Tensor]:
    """CoPE's attention from bf16 q, k, v (as autocast's projections give them) with or without bf16
    autocast around the forward; the backward runs outside it, as in `Trainer.step`."""
    q, k, v, table = (t.detach() for t in leaves(COUNT_CHUNK + 3, 12))
    q, k, v = (t.bfloat16().requires_grad_() for t in (q, k, v))
    table = table.float().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = Counted(table, 0.5).attend(q, k, v)
    out.float().square().sum().backward()
    return [out.detach(), *(t.grad for t in (q, k, v, table))]


def test_autocast_does_not_reach_the_scores_forward_or_backward() -> None:
    """train.precision=bf16: the scores run in float32 in the forward as in the backward's recomputation
    (else the backward's probabilities would not match the forward's log-sum-exp)."""
    for name, a, b in zip(
        ["out", "dq", "dk", "dv", "dtable"], bf16_training_step(True), bf16_training_step(False), strict=True
    ):
        assert a is not None and b is not None and torch.equal(a, b), name


def test_the_encoding_has_one_zero_table_per_layer_and_npos_train_len_plus_one() -> None:
    dims = Dims(d_model=12, n_heads=HEADS, train_len=20, n_layers=3)
    cope = build_encoding(COPE, dims)
    assert isinstance(cope, CoPE) and cope.relative_only
    assert cope.table.shape == (3, 21, 12 // HEADS) and not cope.table.detach().any()  # the reference's zeros
    forms = [cope.layer_form(cope.attention_form(None, 5, torch.float32), layer) for layer in range(3)]  # type: ignore[arg-type]
    assert all(isinstance(f, Counted) and f.scale == 1 / math.sqrt(4) for f in forms)
    assert [f.table.data_ptr() for f in forms] == [cope.table[i].data_ptr() for i in range(3)]
    assert build_encoding({**COPE, "npos": 7, "scale_positions": False}, dims).table.shape == (3, 7, 4)
    assert CoPE.same_in_training("npos", None, 21, 20) and not CoPE.same_in_training("npos", None, 64, 20)


def randomised(model: torch.nn.Module) -> torch.nn.Module:
    """The tiny model with tables of a trained size (its zero init would make CoPE NoPE in these tests)."""
    with torch.no_grad():
        model.encoding.table.normal_(generator=torch.Generator().manual_seed(3)).mul_(3.0)
    return model


@torch.no_grad()
def test_cached_decoding_and_a_position_offset_with_nonzero_tables() -> None:
    """The suite's cache and shift tests run CoPE at its zero init; here the tables are random: decoding
    one token at a time past the training length (128) equals the full forward, and an offset changes
    nothing (no token position enters). Float32 rounding only (the suite's 1e-5 = 84 EPS32 budget)."""
    model = randomised(tiny_model("cope"))
    tokens, sentence, paragraph = text_like(150, seed=1)
    full = model(tokens, sentence, paragraph)
    assert_close_to_scale(model(tokens, sentence, paragraph, offset=1000), full, rel=1e-5)
    cache = KVCache()
    steps = [model(tokens[:, :140], cache=cache)]
    steps += [model(tokens[:, t : t + 1], cache=cache) for t in range(140, 150)]
    assert_close_to_scale(torch.cat(steps, dim=1), full, rel=1e-5)
    zero = tiny_model("cope")(tokens, sentence, paragraph)
    assert (zero - full).abs().max() > 1e-2 * full.abs().max()  # the tables do change the model


def test_the_model_observes_the_layers_counted_forms() -> None:
    model = randomised(tiny_model("cope"))
    seen: list[AttentionInputs] = []
    model(text_like(20)[0], observe=seen.append)
    assert [inputs.form.table.data_ptr() for inputs in seen] == [t.data_ptr() for t in model.encoding.table]
    counts = seen[0].form.position_counts(seen[0].q, seen[0].k)
    assert counts.largest.shape == (2, model.cfg.n_heads, 20) and counts.limit.tolist() == [128]
    audit = seen[0].form.content_statistics(seen[0].q, seen[0].k)  # the extrapolation audit's part 4
    names = ("cope_count_last", "cope_count_mean", "cope_count_max", "cope_clamped")
    assert {name: tuple(value.shape) for name, value in audit.items()} == {
        name: (model.cfg.n_heads,) for name in names
    }
    assert torch.equal(audit["cope_count_max"], counts.largest.amax((0, 2)))


def test_the_audit_reads_counts_past_the_largest_seen_at_the_training_length() -> None:
    """`cope_past_trained`: the share of pairs whose count passes each head's largest count over the
    window at the training length, by hand from the counts."""
    model = randomised(tiny_model("cope"))
    seen: list[AttentionInputs] = []
    model(text_like(60)[0], observe=seen.append)
    short = seen[0].form.content_statistics(seen[0].q[..., :20, :], seen[0].k[..., :20, :])
    audit = seen[0].form.content_statistics(seen[0].q, seen[0].k, short)
    q, k = seen[0].q.double(), seen[0].k.double()
    gates = torch.sigmoid(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).tril()  # (B, H, 60, 60)
    counts = gates.flip(-1).cumsum(-1).flip(-1)  # p_ij = sum_{t=j..i} g_it
    limit = short["cope_count_max"].double()[:, None, None]
    mask = torch.ones(60, 60, dtype=torch.bool).tril()

    def share(margin: float) -> Tensor:  # (H,): pairs past limit + margin, as a share of each row's keys
        return (((counts > limit + margin) & mask).sum(-1).double() / mask.sum(-1)).mean((0, 2))

    found = audit["cope_past_trained"].double()  # float32 counts: a pair within rounding may go either way
    assert (share(1e-4) - 1e-6 <= found).all() and (found <= share(-1e-4) + 1e-6).all()  # float32 means
    assert (share(-1e-4) - share(1e-4)).max() < 2e-3  # ties are few: the bounds pin it down
    assert audit["cope_past_trained"].max() > 0.1  # three times the length: many counts pass the limit


@pytest.mark.parametrize(
    ("spec", "message"),
    [({"npos": 0}, "npos=0"), ({"npos": 2.5}, "npos=2.5"), ({"scale_positions": "yes"}, "scale_positions")],
)
def test_bad_cope_settings_are_named(spec: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_encoding({**COPE, **spec}, Dims(16, 2))


def test_a_window_and_attention_dropout_are_refused() -> None:
    with pytest.raises(ConfigError, match="model.window=8"):
        build_encoding(COPE, Dims(16, 2, window=8))
    q, k, v, table = leaves(5, 6)
    with pytest.raises(ValueError, match="dropout=0.1"):
        Counted(table, 1.0).attend(q, k, v, dropout=0.1)
