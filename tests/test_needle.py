"""Passkey examples (posab.passkey.examples) and the needle evaluation (posab.evaluate.needle)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from conftest import run_main, tiny_model
from posab.data import DataConfig, SyntheticConfig, TokenStream, prepare_data
from posab.data.tokenizer import PARA, VOCAB_SIZE, ByteTokenizer
from posab.errors import ConfigError
from posab.evaluate import EvalConfig, run_evaluator
from posab.evaluate.context import EvalContext
from posab.evaluate.needle import NeedleConfig, cell_examples, score_batch
from posab.outputs import EvalOutput
from posab.passkey.examples import (
    GAP,
    NEEDLE,
    QUERY,
    WORD_SEARCH,
    PasskeyExample,
    encode_paragraph,
    examples_batch,
    filler_length,
    make_passkey_example,
    passkey_batch,
    random_key,
    with_needle_key,
)
from posab.plots import png_bytes

DEPTHS = [0.0, 0.5, 1.0]
NEEDLE_PREFIX = b"The pass key is "
Corpus = tuple[ByteTokenizer, TokenStream]


@pytest.fixture(scope="module", params=[True, False], ids=["anchors", "no_anchors"])
def corpus(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    """(tokenizer, validation stream) of a small synthetic corpus, with anchors on and off."""
    synthetic = SyntheticConfig(vocab_size=300, train_docs=2, valid_docs=2, test_docs=1)
    cache = tmp_path_factory.mktemp("cache")
    data = prepare_data(DataConfig(cache_dir=str(cache), anchors=request.param, synthetic=synthetic))
    return data.tokenizer, data.streams["valid"]


def as_bytes(tokens: np.ndarray | list[int]) -> bytes:
    """Token ids as bytes, one per token (anchors become NUL), so byte offsets are token indices."""
    return bytes(int(t) if t < 256 else 0 for t in tokens)


def make_context(model: nn.Module, tokenizer: ByteTokenizer, valid: TokenStream, **needle) -> EvalContext:
    cfg = EvalConfig(lengths=[128, 192], batch_tokens=512, progress=False, needle=NeedleConfig(**needle))
    return EvalContext(model, tokenizer, valid, torch.device("cpu"), None, 64, cfg, "rope")  # type: ignore[arg-type]


def needle_output(ctx: EvalContext) -> EvalOutput:
    return run_evaluator(ctx, "needle")


def needle_eval(ctx: EvalContext) -> dict:
    return needle_output(ctx).results


# ---------------------------------------------------------------------------------------------- examples


@pytest.mark.parametrize("depth", DEPTHS)
def test_example_layout(corpus: Corpus, depth: float) -> None:
    tokenizer, valid = corpus
    ex = make_passkey_example(valid, tokenizer, 200, depth, np.random.default_rng(0), key_digits=5)
    assert len(ex.tokens) == len(ex.sentence) == len(ex.paragraph) == 200
    assert ex.tokens.dtype == ex.sentence.dtype == ex.paragraph.dtype == np.int64
    assert ex.key_start == 195 and tokenizer.decode(ex.tokens[ex.key_start :]) == ex.key
    assert len(ex.key) == 5 and ex.key.isdigit() and ex.key[0] != "0"
    query = QUERY.format(key=ex.key)
    assert tokenizer.decode(ex.tokens).endswith(f"\n\n{query}")
    # the needle follows the filler's first piece (none at depth 0) and its blank line, and (with anchors)
    # PARA; the cut is the word boundary nearest round(depth * filler), within WORD_SEARCH tokens
    needle_at = as_bytes(ex.tokens).index(NEEDLE_PREFIX)
    if tokenizer.anchors:
        assert ex.tokens[needle_at - 1] == PARA
    cut = needle_at - tokenizer.anchors - (len(GAP) if depth > 0 else 0)
    filler = filler_length(tokenizer, 200, 5) + (len(GAP) if depth in (0.0, 1.0) else 0)
    assert abs(cut - round(depth * filler)) <= WORD_SEARCH
    if depth == 0.5:  # both pieces of text end and start between words
        second = needle_at - tokenizer.anchors + len(encode_paragraph(tokenizer, NEEDLE, ex.key)) + len(GAP)
        before, after = tokenizer.decode(ex.tokens[:cut]), tokenizer.decode(ex.tokens[second:])
        assert before[-1].isspace() or not before[-1].isalnum() or after[0].isspace()
    rest = tokenizer.decode(ex.tokens[needle_at:])
    assert rest.startswith(NEEDLE.format(key=ex.key) + "\n\n")
    assert "\n\n\n\n" not in tokenizer.decode(ex.tokens[max(0, needle_at - 4) :])  # no run of blank lines
    if depth == 0.0:
        assert needle_at == tokenizer.anchors  # the example opens with the needle
    if depth == 1.0:
        assert rest == f"{NEEDLE.format(key=ex.key)}\n\n{query}"


@pytest.mark.parametrize("depth", DEPTHS)
def test_example_indices(corpus: Corpus, depth: float) -> None:
    """Indices start at 0 and grow by 0 or 1; the needle and the query are paragraphs of their own."""
    tokenizer, valid = corpus
    ex = make_passkey_example(valid, tokenizer, 200, depth, np.random.default_rng(1))
    for indices in (ex.sentence, ex.paragraph):
        assert indices[0] == 0 and set(np.diff(indices).tolist()) <= {0, 1}
    needle = encode_paragraph(tokenizer, NEEDLE, ex.key)
    needle_paragraph = ex.paragraph[as_bytes(ex.tokens).index(NEEDLE_PREFIX)]
    assert (ex.paragraph == needle_paragraph).sum() == len(needle) + len(GAP)  # its own blank line
    query = encode_paragraph(tokenizer, QUERY, ex.key)
    assert (ex.paragraph == ex.paragraph[-1]).sum() == len(query)
    assert np.array_equal(ex.sentence[-len(query) :] - ex.sentence[-len(query)], query.sentence)


def test_examples_are_deterministic(corpus: Corpus) -> None:
    tokenizer, valid = corpus
    a, b, c = (make_passkey_example(valid, tokenizer, 150, 0.3, np.random.default_rng(s)) for s in (7, 7, 8))
    for name in ("tokens", "sentence", "paragraph"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert a.key == b.key and not np.array_equal(a.tokens, c.tokens)


@pytest.mark.parametrize("depth", DEPTHS)
def test_the_control_differs_only_in_the_needles_key(corpus: Corpus, depth: float) -> None:
    tokenizer, valid = corpus
    ex = make_passkey_example(valid, tokenizer, 200, depth, np.random.default_rng(2))
    other = "1" * 5 if ex.key != "1" * 5 else "2" * 5
    control = with_needle_key(valid, tokenizer, ex, other)
    assert len(control) == len(ex) and control.key == ex.key and control.needle_key == other
    differs = np.flatnonzero(control.tokens != ex.tokens)
    needle_key_at = as_bytes(ex.tokens).index(NEEDLE_PREFIX) + len(NEEDLE_PREFIX)
    assert set(differs.tolist()) <= set(range(needle_key_at, needle_key_at + 5)) and len(differs) > 0
    assert np.array_equal(control.sentence, ex.sentence) and np.array_equal(control.paragraph, ex.paragraph)


def test_the_filler_starts_at_a_word(corpus: Corpus) -> None:
    tokenizer, valid = corpus
    for seed in range(10):
        ex = make_passkey_example(valid, tokenizer, 200, 1.0, np.random.default_rng(seed))
        first, previous = int(valid.tokens[ex.filler_start]), int(valid.tokens[ex.filler_start - 1])
        assert chr(previous).isspace() or chr(first).isspace() or previous >= 256 or first >= 256


def test_keys_have_exactly_the_digits_asked() -> None:
    rng = np.random.default_rng(0)
    for digits in (1, 3, 12):
        keys = [random_key(rng, digits) for _ in range(200)]
        assert all(len(k) == digits and k.isdigit() and k[0] != "0" for k in keys)
    assert {random_key(rng, 1) for _ in range(200)} == set("123456789")


def test_too_short_length_is_a_config_error(corpus: Corpus) -> None:
    tokenizer, valid = corpus
    minimum = 1000 - filler_length(tokenizer, 1000, 5) + 1
    make_passkey_example(valid, tokenizer, minimum, 0.5, np.random.default_rng(0))
    with pytest.raises(ConfigError, match=f"{minimum - 1} tokens is too short.*at least {minimum} tokens"):
        make_passkey_example(valid, tokenizer, minimum - 1, 0.5, np.random.default_rng(0))


def test_too_short_stream_is_a_config_error() -> None:
    tokenizer = ByteTokenizer()
    enc = tokenizer.encode("Some text. More text.\n\nAnother paragraph. " * 3)
    stream = TokenStream(enc.tokens, enc.sentence, enc.paragraph, split="valid")
    filler = filler_length(tokenizer, 500, 5) + len(GAP)  # the most an example takes (depth 0 or 1)
    with pytest.raises(
        ConfigError, match=f"valid split has {len(stream)} tokens.*the {filler} filler tokens"
    ):
        make_passkey_example(stream, tokenizer, 500, 0.5, np.random.default_rng(0))


def test_passkey_batch_is_a_training_batch(corpus: Corpus) -> None:
    tokenizer, valid = corpus
    batch = passkey_batch(valid, tokenizer, count=3, length=100, rng=np.random.default_rng(0), key_digits=4)
    for t in (batch.inputs, batch.targets, batch.sentence, batch.paragraph):
        assert t.shape == (3, 100) and t.dtype == torch.int64
    assert torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])
    assert (batch.sentence[:, 0] == 0).all() and (batch.paragraph[:, 0] == 0).all()
    for row in range(3):
        text = as_bytes(batch.inputs[row].tolist())
        key = text[text.index(NEEDLE_PREFIX) + len(NEEDLE_PREFIX) :][:4]
        assert as_bytes(batch.targets[row, -4:].tolist()) == key and key.isdigit()


# ------------------------------------------------------------------------------------------------ scorer


class OracleModel(nn.Module):
    """Reads the key after the needle's "The pass key is " and predicts it after the query's."""

    def __init__(self, key_digits: int) -> None:
        super().__init__()
        self.key_digits = key_digits

    def forward(
        self,
        tokens: Tensor,
        sentence: Tensor | None,
        paragraph: Tensor | None,
        offset: int = 0,
        observe: object = None,
    ) -> Tensor:
        logits = torch.zeros(*tokens.shape, VOCAB_SIZE)  # (B, T, V)
        for row, ids in enumerate(tokens.tolist()):
            text = as_bytes(ids)
            key_at = text.index(NEEDLE_PREFIX) + len(NEEDLE_PREFIX)
            answer_at = text.rindex(NEEDLE_PREFIX) + len(NEEDLE_PREFIX)
            for i, digit in enumerate(text[key_at : key_at + self.key_digits]):
                if answer_at - 1 + i < tokens.shape[1]:
                    logits[row, answer_at - 1 + i, digit] = 20.0
        return logits


class FixedDigitModel(nn.Module):
    """Always predicts the same digit."""

    def __init__(self, digit: str) -> None:
        super().__init__()
        self.token = ord(digit)

    def forward(
        self,
        tokens: Tensor,
        sentence: Tensor | None,
        paragraph: Tensor | None,
        offset: int = 0,
        observe: object = None,
    ) -> Tensor:
        logits = torch.zeros(*tokens.shape, VOCAB_SIZE)  # (B, T, V)
        logits[..., self.token] = 20.0
        return logits


def test_oracle_scores_everything(corpus: Corpus) -> None:
    ctx = make_context(OracleModel(4), *corpus, depths=DEPTHS, trials=3, key_digits=4)
    results = needle_eval(ctx)
    assert results["needle/acc"] == 1.0
    assert np.array_equal(results["needle/grid"]["acc"], np.ones((2, 3)))
    assert -1e-3 < results["needle/logprob"] <= 0
    # with another key in the needle the oracle predicts that key: at least one digit differs, ~-20 nats
    assert results["needle/gain"] > 15 and min(min(row) for row in results["needle/grid"]["gain"]) > 15


def test_fixed_digit_scores_nothing(corpus: Corpus) -> None:
    """Keys have no leading zero, so "00000" is never the key."""
    ctx = make_context(FixedDigitModel("0"), *corpus, depths=DEPTHS, trials=3)
    results = needle_eval(ctx)
    assert results["needle/acc"] == 0.0 and results["needle/logprob"] < -50
    assert results["needle/gain"] == 0.0  # the needle is never read: the control scores the same


def greedy_decode(model: nn.Module, ex: PasskeyExample, steps: int) -> list[int]:
    """Feed the prompt, append the argmax, repeat; new tokens stay in the prompt's last sentence."""
    tokens, sentence, paragraph = (a[: ex.key_start].tolist() for a in (ex.tokens, ex.sentence, ex.paragraph))
    for _ in range(steps):
        inputs, s, p = (torch.tensor([a]) for a in (tokens, sentence, paragraph))  # (1, T)
        with torch.no_grad():
            tokens.append(int(model(inputs, s, p)[0, -1].argmax()))
        sentence.append(sentence[-1])
        paragraph.append(paragraph[-1])
    return tokens[ex.key_start :]


def with_answer(ex: PasskeyExample, answer: list[int]) -> PasskeyExample:
    """The same example with other tokens after the query (the prompt, needle included, unchanged)."""
    tokens = np.concatenate([ex.tokens[: ex.key_start], answer])
    return PasskeyExample(tokens, ex.sentence, ex.paragraph, ex.key, ex.key_start)


def test_teacher_forced_scoring_equals_greedy_decoding(corpus: Corpus) -> None:
    """Trial by trial: correct iff greedy decoding returns the answer, for the key, the greedy output itself
    and the greedy output with one token changed."""
    model = tiny_model("hierarchical")
    ctx = make_context(model, *corpus, depths=DEPTHS, trials=2, key_digits=3)
    for ex in cell_examples(ctx, ctx.cfg.needle, 128, 1) + cell_examples(ctx, ctx.cfg.needle, 192, 2):
        greedy = greedy_decode(model, ex, 3)
        wrong = [(t + 1) % VOCAB_SIZE for t in greedy]
        answers = [
            [int(t) for t in ex.tokens[ex.key_start :]],
            greedy,
            wrong[:1] + greedy[1:],
            greedy[:2] + wrong[2:],
        ]
        batch = examples_batch([with_answer(ex, a) for a in answers])
        scores = score_batch(ctx, batch, 3)
        correct, logprob = scores.correct, scores.logprob
        assert correct.tolist() == [a == greedy for a in answers]
        assert (logprob <= 0).all()


def test_results_table_and_heatmap(corpus: Corpus) -> None:
    ctx = make_context(tiny_model("rope"), *corpus, depths=[0.0, 0.25, 1.0], trials=2)
    output = needle_output(ctx)
    results = output.results
    assert results == needle_eval(ctx)
    names = ("acc", "logprob", "gain")
    expected = {"needle/grid", *(f"needle/{name}" for name in names)}
    for length in (128, 192):
        expected |= {f"needle/{name}@{length}" for name in names}
        for label in ("depth0.0", "depth0.25", "depth1.0"):
            expected |= {f"needle/{name}@{length}/{label}" for name in names}
    expected |= {f"needle/digit_acc/d{d}" for d in range(5)} | {"needle/attention"}
    for length in (128, 192):
        expected |= {f"needle/digit_acc@{length}/d{d}" for d in range(5)}
        expected |= {f"needle/attn_{name}@{length}" for name in ("mass", "layer", "head")}
    assert set(results) == expected
    for key, value in results.items():
        if key.startswith("needle/acc"):
            assert 0.0 <= value <= 1.0
        elif key.startswith("needle/logprob"):
            assert value <= 0.0
    grid = json.loads(json.dumps(results["needle/grid"]))
    assert grid["lengths"] == [128, 192] and grid["depths"] == [0.0, 0.25, 1.0]
    assert np.shape(grid["acc"]) == np.shape(grid["logprob"]) == (2, 3)
    assert grid["acc"][1][1] == results["needle/acc@192/depth0.25"]
    table = output.tables["needle"]
    assert table.columns == ["length", "depth", "acc", "logprob", "gain"] and len(table.rows) == 6
    assert table.rows[4] == [192, 0.25, grid["acc"][1][1], grid["logprob"][1][1], grid["gain"][1][1]]
    heatmap = output.figures["needle_heatmap"]
    assert heatmap.axes[0].get_title() == "rope"
    png = png_bytes(heatmap)
    assert png.startswith(b"\x89PNG") and len(png) > 1000


def test_needle_eval_fails_clearly_on_bad_lengths(corpus: Corpus) -> None:
    tokenizer, valid = corpus
    ctx = make_context(FixedDigitModel("0"), tokenizer, valid, lengths=[128, 10**6])
    with pytest.raises(ConfigError, match=f"length 1000000.*valid split has {len(valid)} tokens"):
        needle_eval(ctx)
    ctx = make_context(FixedDigitModel("0"), tokenizer, valid, lengths=[16])
    with pytest.raises(ConfigError, match="length 16.*too short"):
        needle_eval(ctx)


def test_training_logs_the_key_token_loss_of_its_passkey_examples(tmp_path: Path) -> None:
    """`train/needle_loss` is the mean loss on the key digits of the interval's passkey rows: logged with
    passkey examples in the mix, absent without them."""
    for rate, logged in ((0.5, True), (0.0, False)):
        run = tmp_path / f"rate{rate}"
        args = ["+experiment=tiny", "encoding=nope", f"data.cache_dir={tmp_path / 'cache'}"]
        assert run_main([*args, f"data.needle_rate={rate}"], run)["status"] == "finished"
        lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        needle = [line["train/needle_loss"] for line in lines if "train/needle_loss" in line]
        if logged:  # 5-digit keys from an untrained model: near ln(10) per digit or worse, never 0
            assert len(needle) >= 3 and all(0 < v < 20 for v in needle)
        else:
            assert needle == []


def test_passkey_rows_mark_their_key_targets(corpus: Corpus) -> None:
    tokenizer, valid = corpus
    batch = passkey_batch(valid, tokenizer, count=3, length=100, rng=np.random.default_rng(0), key_digits=4)
    assert batch.key_mask is not None and batch.key_mask.shape == batch.targets.shape
    assert batch.key_mask[:, -4:].all() and not batch.key_mask[:, :-4].any()
    plain = valid.batch([0, 200], 100)
    joined = plain.cat(batch)
    assert joined.key_mask is not None and not joined.key_mask[:2].any() and joined.key_mask[2:, -4:].all()


def test_accuracy_per_key_digit(corpus: Corpus) -> None:
    oracle = needle_eval(make_context(OracleModel(4), *corpus, depths=DEPTHS, trials=2, key_digits=4))
    assert [oracle[f"needle/digit_acc/d{d}"] for d in range(4)] == [1.0] * 4
    zeros = needle_eval(make_context(FixedDigitModel("0"), *corpus, depths=DEPTHS, trials=3))
    assert zeros["needle/digit_acc/d0"] == 0.0  # keys never start with 0
    assert zeros["needle/digit_acc@128/d0"] == 0.0 and 0.0 <= zeros["needle/digit_acc/d3"] <= 1.0
    assert "needle/attn_mass@128" not in zeros  # a model without attention layers reports none


def test_attention_mass_on_the_needle_of_a_near_uniform_model(corpus: Corpus) -> None:
    """Untrained NoPE attends almost uniformly: from each key position (the last 5 queries of T) the mass on
    the needle's 5 key tokens is about 5 / T; the best head's is reported with its layer and head."""
    ctx = make_context(tiny_model("nope"), *corpus, depths=[0.0, 1.0], trials=2)
    results = needle_eval(ctx)
    for length in (128, 192):
        mass = results[f"needle/attn_mass@{length}"]
        assert 0.5 * 5 / length < mass < 2.0 * 5 / length
        assert results[f"needle/attn_layer@{length}"] in (0, 1) and results[f"needle/attn_head@{length}"] in (
            0,
            1,
        )
    grid = results["needle/attention"]
    assert grid["lengths"] == [128, 192] and np.shape(grid["mass"]) == (2, 2, 2)  # (lengths, layers, heads)
    assert results["needle/attn_mass@128"] == pytest.approx(np.max(grid["mass"][0]))


def test_needle_key_start_points_at_the_needles_digits(corpus: Corpus) -> None:
    tokenizer, valid = corpus
    for depth in DEPTHS:
        ex = make_passkey_example(valid, tokenizer, 200, depth, np.random.default_rng(3))
        at = ex.needle_key_start
        assert tokenizer.decode(ex.tokens[at : at + 5]) == ex.key
        assert as_bytes(ex.tokens[:at]).endswith(NEEDLE_PREFIX)
