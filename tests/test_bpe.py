"""Tests of the byte-level BPE tokenizer (posab.data.bpe) and `data.tokenizer=bpe` in prepare_data."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import pre_tokenizers

import posab.data.pipeline
from conftest import run_main, typed_config
from posab.data import CorpusData, DataConfig, SyntheticConfig, prepare_data
from posab.data.bpe import BYTE_CHARS, TOKENIZER_FILE, BPETokenizer
from posab.data.corpora import corpus_identity
from posab.data.streams import CACHE_FORMAT, cache_key
from posab.data.synthetic import SyntheticSpec, generate_corpus
from posab.data.tokenizer import BOS, EOS, PARA, SENT, ByteTokenizer, Encoded
from posab.errors import ConfigError
from posab.passkey.examples import QUERY, filler_length, make_passkey_example

SMALL = SyntheticConfig(vocab_size=300, train_docs=4, valid_docs=2, test_docs=2)
# non-ASCII text, a '.' inside a number, closing quotes, blank lines with spaces, anchor names as text
EXTRA = [
    'Über café, très bien? He said "fine." 日本語もある!\n\nPi is 3.14159 or so. Call 0123456789.\n',
    "One line\nsame sentence. <para> and <sent> are text here!\n \t\nLast paragraph 2024.\n",
]


def bpe_config(tmp_path: Path, **overrides) -> DataConfig:
    fields = {"tokenizer": "bpe", "vocab_size": 400, "cache_dir": str(tmp_path / "cache"), "synthetic": SMALL}
    return DataConfig(source="synthetic", **{**fields, **overrides})


@pytest.fixture(scope="module")
def docs() -> dict[str, list[str]]:
    return generate_corpus(SyntheticSpec(vocab_size=300, train_docs=4, valid_docs=2, test_docs=2))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> CorpusData:
    return prepare_data(bpe_config(tmp_path_factory.mktemp("bpe")))


@pytest.fixture(scope="module")
def tokenizer(docs: dict[str, list[str]]) -> BPETokenizer:
    return BPETokenizer.train(docs["train"] + EXTRA, 400)


def sentence_runs(encoded: Encoded) -> list[tuple[int, int]]:
    """(sentence, paragraph) of each run of equal sentence indices, in order."""
    pairs = np.stack([encoded.sentence, encoded.paragraph], axis=1)
    keep = np.concatenate([[True], np.any(np.diff(pairs, axis=0) != 0, axis=1)])
    return [tuple(p) for p in pairs[keep].tolist()]


# ---------------------------------------------------------------- the tokenizer


def test_byte_chars_are_the_byte_level_alphabet() -> None:
    assert len(set(BYTE_CHARS)) == 256
    assert set(BYTE_CHARS) == set(pre_tokenizers.ByteLevel.alphabet())


def test_ids_below_260_are_bytes_and_anchors(tokenizer: BPETokenizer) -> None:
    assert 260 < tokenizer.vocab_size <= 400
    assert tokenizer.pieces[:256] == [bytes([b]) for b in range(256)]
    assert tokenizer.pieces[256:260] == [None] * 4
    assert tokenizer.hf.token_to_id("<para>") == PARA and tokenizer.hf.token_to_id("<bos>") == BOS


@pytest.mark.parametrize("anchors", [True, False])
def test_decode_round_trips_the_text(
    tokenizer: BPETokenizer, docs: dict[str, list[str]], anchors: bool
) -> None:
    tokenizer = BPETokenizer(tokenizer.hf, anchors)
    for text in [*EXTRA, *docs["valid"], "", "x", "Emoji 🙂 unseen. Tab\tend.\n\n\n"]:
        encoded = tokenizer.encode(text)
        assert tokenizer.decode(encoded.tokens) == text
        assert tokenizer.decode(encoded.tokens.tolist()) == text
        assert encoded.tokens.dtype == np.uint16
        assert encoded.sentence.dtype == encoded.paragraph.dtype == np.int32


def test_subwords_are_shorter_than_bytes(tokenizer: BPETokenizer, docs: dict[str, list[str]]) -> None:
    text = docs["valid"][0]
    assert len(tokenizer.encode(text)) < 0.8 * len(ByteTokenizer().encode(text))


@pytest.mark.parametrize("anchors", [True, False])
@pytest.mark.parametrize("document", [True, False])
def test_structure_matches_the_byte_tokenizer(
    tokenizer: BPETokenizer, docs: dict[str, list[str]], anchors: bool, document: bool
) -> None:
    """Same anchors, the same (sentence, paragraph) runs, and each sentence holds the same text."""
    tokenizer = BPETokenizer(tokenizer.hf, anchors)
    for text in [*EXTRA, *docs["valid"]]:
        bpe, byte = tokenizer.encode(text, document), ByteTokenizer(anchors).encode(text, document)
        for anchor in (BOS, EOS, PARA, SENT):
            assert (bpe.tokens == anchor).sum() == (byte.tokens == anchor).sum()
        assert sentence_runs(bpe) == sentence_runs(byte)
        for s in range(int(byte.sentence[-1]) + 1):
            assert tokenizer.decode(bpe.tokens[bpe.sentence == s]) == ByteTokenizer().decode(
                byte.tokens[byte.sentence == s]
            )
        anchor_at = np.flatnonzero(np.isin(bpe.tokens, [PARA, SENT]))
        assert np.array_equal(bpe.tokens[anchor_at], byte.tokens[np.isin(byte.tokens, [PARA, SENT])])
        assert np.all(bpe.sentence[anchor_at] == bpe.sentence[anchor_at + 1])  # an anchor's indices: next


def test_digits_are_single_tokens(tokenizer: BPETokenizer) -> None:
    trained = BPETokenizer.train(["Call 12345 or 12345, 1234512345 and 2024. " * 50], 400)
    for tok in (tokenizer, trained):
        encoded = tok.encode("Keys 48213, 12345 and 0123456789.", document=False)
        digits = [int(t) for t in encoded.tokens if any(48 <= b <= 57 for b in tok.pieces[t] or b"")]
        assert bytes(digits) == b"48213123450123456789"  # each digit is its own token, with its byte's id


def test_anchor_names_in_the_text_stay_text(tokenizer: BPETokenizer) -> None:
    encoded = tokenizer.encode("<bos> <para> <sent> <eos>", document=False)
    assert encoded.tokens.tolist().count(PARA) == 1 and not np.isin(encoded.tokens, [BOS, EOS, SENT]).any()


# ---------------------------------------------------------------- prepare_data and the cache


def test_prepare_data_builds_bpe_streams(data: CorpusData, docs: dict[str, list[str]]) -> None:
    assert isinstance(data.tokenizer, BPETokenizer)
    assert data.vocab_size == data.tokenizer.vocab_size and 260 < data.vocab_size <= 400
    assert (data.cache_dir / TOKENIZER_FILE).is_file()
    for split, stream in data.streams.items():
        assert int(stream.tokens.max()) < data.vocab_size
        assert data.tokenizer.decode(stream.tokens) == "".join(docs[split])
        assert (stream.tokens == BOS).sum() == (stream.tokens == EOS).sum() == len(docs[split])


def test_second_prepare_data_reuses_the_trained_tokenizer(
    data: CorpusData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: object) -> None:
        raise AssertionError("trained or loaded again instead of read from the cache")

    monkeypatch.setattr(BPETokenizer, "train", fail)
    monkeypatch.setattr(posab.data.pipeline, "load_documents", fail)
    again = prepare_data(bpe_config(data.cache_dir.parents[1]))
    assert again.cache_dir == data.cache_dir
    assert again.tokenizer.hf.get_vocab() == data.tokenizer.hf.get_vocab()
    assert np.array_equal(again.streams["train"].tokens, data.streams["train"].tokens)


def test_byte_and_bpe_caches_differ(data: CorpusData) -> None:
    root = data.cache_dir.parents[1]
    byte = prepare_data(bpe_config(root, tokenizer="bytes"))
    other_size = prepare_data(bpe_config(root, vocab_size=300))
    assert len({data.cache_dir, byte.cache_dir, other_size.cache_dir}) == 3
    assert byte.vocab_size == 260 and isinstance(byte.tokenizer, ByteTokenizer)
    assert len(data.streams["train"]) < len(byte.streams["train"])
    assert data.tokenizer.decode(data.streams["train"].tokens) == byte.tokenizer.decode(
        byte.streams["train"].tokens
    )


def test_byte_cache_key_is_unchanged() -> None:
    cfg = DataConfig(synthetic=SMALL)
    identity = corpus_identity(cfg)
    before = {"format": CACHE_FORMAT, "corpus": identity, "tokenizer": "bytes", "anchors": True}
    expected = hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()[:16]
    assert cache_key(identity, posab.data.tokenizer_settings(cfg)) == expected


def test_passkey_example_with_bpe(data: CorpusData) -> None:
    tokenizer, valid = data.tokenizer, data.streams["valid"]
    assert filler_length(tokenizer, 200, 5) < 200 - 30  # the fixed part is shorter than in bytes
    for depth in (0.0, 0.5, 1.0):
        ex = make_passkey_example(valid, tokenizer, 200, depth, np.random.default_rng(3), key_digits=5)
        assert len(ex) == 200 and ex.key_start == 195
        assert [tokenizer.decode([t]) for t in ex.tokens[-5:]] == list(ex.key)
        assert tokenizer.decode(ex.tokens).endswith("\n\n" + QUERY.format(key=ex.key))


# ---------------------------------------------------------------- configuration and the command line


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("data.tokenizer=words", "data.tokenizer='words': use one of bytes, bpe"),
        ("data.vocab_size=100", "data.vocab_size=100 must be in [261, 65536]"),
        ("data.vocab_size=70000", "data.vocab_size=70000 must be in [261, 65536]"),
    ],
)
def test_bad_values_are_config_errors(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        typed_config([override])
    assert expected in str(info.value)


def test_prepare_data_rejects_an_unknown_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="data.tokenizer='words': use bytes or bpe"):
        prepare_data(bpe_config(tmp_path, tokenizer="words"))


def test_train_runs_end_to_end_with_bpe(tmp_path: Path) -> None:
    """A whole run (data, training, evaluation) in-process, with the tokenizer trained into the cache."""
    args = ["+experiment=tiny", "data.tokenizer=bpe", "data.vocab_size=400"]
    run_main([*args, f"data.cache_dir={tmp_path / 'cache'}"], tmp_path / "run")
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["status"] == "finished"
    assert any((tmp_path / "cache").glob(f"tokens-*/{TOKENIZER_FILE}"))
