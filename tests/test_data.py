"""Tests of posab.data: tokenizer, corpora (synthetic, local text, offline hub), cached streams, batches."""

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import posab.data.pipeline
from posab.data import DataConfig, SyntheticConfig, TokenStream, TrainSampler, prepare_data
from posab.data.corpora import group_wikitext, load_documents, split_documents
from posab.data.synthetic import SyntheticSpec, generate_corpus, write_text_folder
from posab.data.tokenizer import BOS, EOS, PARA, SENT, ByteTokenizer, concatenate
from posab.errors import ConfigError

SMALL = SyntheticConfig(vocab_size=300, train_docs=6, valid_docs=3, test_docs=3)
TINY = SyntheticSpec(
    seed=1,
    vocab_size=100,
    train_docs=4,
    valid_docs=2,
    test_docs=2,
    paragraphs_per_doc=(2, 3),
    sentences_per_paragraph=(1, 3),
    words_per_sentence=(3, 6),
    entities_per_doc=1,
)
# Paragraphs of sentences: non-ASCII text, a closing quote after the mark, a '.' inside a number, a comma
# and a single newline inside a sentence (neither ends anything).
PARAGRAPHS = [
    ["Hello world.", "Pi is 3.14 or so!", "First line\nsecond line of the same sentence."],
    ["Über café, très bien?"],
    ['He said "fine."', "日本語もある!", "End."],
]
WIKITEXT_SPLITS = {
    "train": ["", " = Title One = \n", "", " Some text . More text .\n", "", " = = Section = = \n", "",
              " Other text .\n", "", " = Title Two = \n", "", " Second article .\n", ""],
    "validation": ["", " = Title Three = \n", "", " Valid text .\n", ""],
    "test": ["", " = Title Four = \n", "", " Test text .\n", ""],
}  # fmt: skip


def sentence_chunks(paragraphs: list[list[str]]) -> list[tuple[bytes, int, int, bool]]:
    """(bytes of a sentence and its separator, sentence index, paragraph index, first of its paragraph)."""
    chunks = []
    for p, sentences in enumerate(paragraphs):
        for k, sentence in enumerate(sentences):
            last_paragraph = p == len(paragraphs) - 1
            separator = " " if k < len(sentences) - 1 else "\n" if last_paragraph else "\n\n"
            chunks.append(((sentence + separator).encode(), len(chunks), p, k == 0))
    return chunks


def chunks_text(chunks: list[tuple[bytes, int, int, bool]]) -> str:
    return b"".join(c[0] for c in chunks).decode()


def data_config(tmp_path: Path, **overrides) -> DataConfig:
    return DataConfig(cache_dir=str(tmp_path / "cache"), synthetic=SMALL, **overrides)


def config_error(cfg: DataConfig) -> str:
    with pytest.raises(ConfigError) as info:
        prepare_data(cfg)
    return str(info.value)


def write_docs(folder: Path, texts: list[str], suffix: str = ".txt") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"doc_{i:02d}{suffix}" for i in range(len(texts))]
    for path, text in zip(paths, texts, strict=True):
        path.write_text(text, encoding="utf-8")
    return paths


def numbered_docs(count: int) -> list[str]:
    return [f"Document {i} starts. It goes on.\n\nIts second paragraph {i}.\n" for i in range(count)]


def write_wikitext(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for split, rows in WIKITEXT_SPLITS.items():
        pq.write_table(pa.table({"text": rows}), folder / f"{split}-00000-of-00001.parquet")
    return folder


def hub_config(tmp_path: Path, local_dir: Path, **overrides) -> DataConfig:
    return data_config(
        tmp_path,
        source="hub",
        hub_dataset="Salesforce/wikitext",
        hub_subset="wikitext-2-raw-v1",
        hub_local_dir=str(local_dir),
        **overrides,
    )


@pytest.fixture(scope="module")
def synthetic_docs() -> list[str]:
    return generate_corpus(TINY)["train"]


@pytest.fixture(scope="module")
def train_stream(tmp_path_factory: pytest.TempPathFactory) -> TokenStream:
    return prepare_data(data_config(tmp_path_factory.mktemp("streams"))).streams["train"]


# ---------------------------------------------------------------- tokenizer


@pytest.mark.parametrize("anchors", [True, False])
@pytest.mark.parametrize(
    "text", ["Plain ASCII. Two sentences!\n\nA paragraph.\n", chunks_text(sentence_chunks(PARAGRAPHS))]
)
def test_decode_round_trips_the_text(text: str, anchors: bool) -> None:
    tokenizer = ByteTokenizer(anchors=anchors)
    encoded = tokenizer.encode(text)
    assert tokenizer.decode(encoded.tokens) == text
    assert tokenizer.decode(encoded.tokens.tolist()) == text


def test_anchors_off_gives_bytes_and_structure_indices() -> None:
    chunks = sentence_chunks(PARAGRAPHS)
    encoded = ByteTokenizer(anchors=False).encode(chunks_text(chunks))
    assert encoded.tokens.tolist() == list(b"".join(c[0] for c in chunks))
    assert encoded.sentence.tolist() == [s for data, s, _, _ in chunks for _ in data]
    assert encoded.paragraph.tolist() == [p for data, _, p, _ in chunks for _ in data]


def test_anchors_on_mark_document_paragraphs_and_sentences() -> None:
    chunks = sentence_chunks(PARAGRAPHS)
    encoded = ByteTokenizer(anchors=True).encode(chunks_text(chunks))
    # each anchor takes the indices of the byte it precedes; BOS those of the first, EOS those of the last
    tokens, sentence, paragraph = [BOS], [0], [0]
    for data, s, p, first in chunks:
        tokens += [PARA if first else SENT, *data]
        sentence += [s] * (1 + len(data))
        paragraph += [p] * (1 + len(data))
    assert encoded.tokens.tolist() == [*tokens, EOS]
    assert encoded.sentence.tolist() == [*sentence, sentence[-1]]
    assert encoded.paragraph.tolist() == [*paragraph, paragraph[-1]]


def test_encode_without_document_has_no_bos_or_eos() -> None:
    encoded = ByteTokenizer(anchors=True).encode("One. Two.", document=False)
    assert encoded.tokens.tolist() == [PARA, *b"One. ", SENT, *b"Two."]


def test_blank_line_with_spaces_is_a_paragraph_break_and_single_newline_is_not() -> None:
    encoded = ByteTokenizer(anchors=False).encode("a b\nc d\n \t\ne f")
    assert encoded.paragraph.tolist() == [0] * 11 + [1] * 3
    assert encoded.sentence.tolist() == [0] * 11 + [1] * 3


def test_indices_step_by_one_exactly_at_sentence_and_paragraph_starts(synthetic_docs: list[str]) -> None:
    for doc in synthetic_docs:
        data = doc.encode()
        encoded = ByteTokenizer(anchors=False).encode(doc)
        paragraph_starts = {m.end() for m in re.finditer(rb"\n\n", data)}
        sentence_starts = paragraph_starts | {m.end() for m in re.finditer(rb"[.!?] ", data)}
        for index, starts in ((encoded.paragraph, paragraph_starts), (encoded.sentence, sentence_starts)):
            steps = np.diff(index)
            assert index[0] == 0 and set(steps.tolist()) <= {0, 1}
            assert set((np.flatnonzero(steps) + 1).tolist()) == starts


def test_anchors_on_and_off_give_the_same_indices_for_bytes(synthetic_docs: list[str]) -> None:
    for doc in synthetic_docs:
        on, off = ByteTokenizer(anchors=True).encode(doc), ByteTokenizer(anchors=False).encode(doc)
        is_byte = on.tokens < 256
        assert np.array_equal(on.tokens[is_byte], off.tokens)
        assert np.array_equal(on.sentence[is_byte], off.sentence)
        assert np.array_equal(on.paragraph[is_byte], off.paragraph)
        assert off.tokens.max() < 256
        assert (on.tokens == PARA).sum() == doc.count("\n\n") + 1
        assert (on.tokens == SENT).sum() == off.sentence[-1] + 1 - (off.paragraph[-1] + 1)


def test_concatenate_keeps_indices_growing_across_documents() -> None:
    tokenizer = ByteTokenizer(anchors=True)
    first, second = tokenizer.encode("A b. C d.\n\nE f.\n"), tokenizer.encode("G h.\n\nI j. K l.\n")
    joined = concatenate([first, tokenizer.encode("", document=False), second])
    n = len(first)
    assert len(joined) == n + len(second)
    assert np.array_equal(joined.tokens, np.concatenate([first.tokens, second.tokens]))
    assert joined.sentence[n] == first.sentence[-1] + 1 == 3
    assert joined.paragraph[n] == first.paragraph[-1] + 1 == 2
    assert np.array_equal(joined.sentence[n:], second.sentence + 3)
    assert np.all(np.diff(joined.sentence) >= 0) and np.all(np.diff(joined.paragraph) >= 0)


# ---------------------------------------------------------------- prepare_data and the cache


def test_prepare_data_builds_the_synthetic_streams(tmp_path: Path) -> None:
    data = prepare_data(data_config(tmp_path))
    corpus = generate_corpus(SyntheticSpec(vocab_size=300, train_docs=6, valid_docs=3, test_docs=3))
    assert data.vocab_size == 260
    assert set(data.streams) == {"train", "valid", "test"}
    assert data.cache_dir.parent == tmp_path / "cache"
    for split, stream in data.streams.items():
        assert len(stream.tokens) == len(stream.sentence) == len(stream.paragraph) == len(stream)
        assert data.tokenizer.decode(stream.tokens) == "".join(corpus[split])
        assert (stream.tokens == BOS).sum() == (stream.tokens == EOS).sum() == len(corpus[split])


def test_second_prepare_data_maps_the_cache_without_tokenizing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = prepare_data(data_config(tmp_path))

    def fail(cfg: DataConfig) -> None:
        raise AssertionError("the corpus was loaded again instead of read from the cache")

    monkeypatch.setattr(posab.data.pipeline, "load_documents", fail)
    second = prepare_data(data_config(tmp_path))
    assert second.cache_dir == first.cache_dir
    for split, stream in second.streams.items():
        for name in ("tokens", "sentence", "paragraph"):
            array = getattr(stream, name)
            assert isinstance(array, np.memmap)
            assert np.array_equal(array, getattr(first.streams[split], name))


def test_cache_folder_depends_on_anchors_and_seed(tmp_path: Path) -> None:
    base = prepare_data(data_config(tmp_path))
    no_anchors = prepare_data(data_config(tmp_path, anchors=False))
    other_seed = prepare_data(replace(data_config(tmp_path), synthetic=replace(SMALL, seed=1)))
    assert len({base.cache_dir, no_anchors.cache_dir, other_seed.cache_dir}) == 3
    assert no_anchors.streams["train"].tokens.max() < 256
    assert not np.array_equal(base.streams["train"].tokens[:500], other_seed.streams["train"].tokens[:500])


# ---------------------------------------------------------------- windows and batches


def test_batch_shifts_targets_and_restarts_indices(train_stream: TokenStream) -> None:
    starts, length = [0, 17, 5000], 64
    batch = train_stream.batch(starts, length)
    for t in (batch.inputs, batch.targets, batch.sentence, batch.paragraph):
        assert t.shape == (3, length) and t.dtype == torch.int64
    assert batch.num_tokens == 3 * length
    for row, start in enumerate(starts):
        window = slice(start, start + length)
        assert batch.inputs[row].tolist() == train_stream.tokens[start : start + length].tolist()
        assert batch.targets[row].tolist() == train_stream.tokens[start + 1 : start + length + 1].tolist()
        sentence, paragraph = train_stream.sentence[window], train_stream.paragraph[window]
        assert batch.sentence[row].tolist() == (sentence - sentence[0]).tolist()
        assert batch.paragraph[row].tolist() == (paragraph - paragraph[0]).tolist()
    assert batch.sentence[:, 0].tolist() == batch.paragraph[:, 0].tolist() == [0, 0, 0]
    assert batch.sentence[2, -1] > 0  # 64 tokens from 5000 on cross a sentence start


def test_fixed_windows_are_disjoint_in_bounds_and_repeatable(train_stream: TokenStream) -> None:
    length = 128
    starts = train_stream.fixed_windows(length, 10)
    assert len(starts) == 10
    assert np.all(np.diff(starts) >= length)
    assert starts[0] >= 0 and starts[-1] + length + 1 <= len(train_stream)
    assert np.array_equal(starts, train_stream.fixed_windows(length, 10))
    every = train_stream.fixed_windows(length, 10**9)
    assert len(every) == train_stream.windows_available(length) == (len(train_stream) - 1) // length


def tiny_stream(n: int) -> TokenStream:
    return TokenStream(np.arange(n, dtype=np.uint16), np.zeros(n, np.int32), np.zeros(n, np.int32), "valid")


def test_fixed_windows_fit_exactly_one_window_of_length_plus_one_tokens() -> None:
    assert tiny_stream(17).fixed_windows(16, 5).tolist() == [0]


def test_fixed_windows_on_a_too_small_split_names_both_sizes() -> None:
    with pytest.raises(ConfigError, match=r"valid split has 16 tokens.*window of 16 tokens.*needs 17"):
        tiny_stream(16).fixed_windows(16, 1)


def test_train_sampler_is_reproducible_from_its_seed(train_stream: TokenStream) -> None:
    def batches(seed: int) -> list[torch.Tensor]:
        sampler = TrainSampler(train_stream, seq_len=32, batch_size=4, seed=seed)
        return [sampler.next_batch().inputs for _ in range(3)]

    same, again, other = batches(0), batches(0), batches(1)
    assert all(torch.equal(a, b) for a, b in zip(same, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(same, other, strict=True))


def test_train_sampler_stays_in_bounds_and_rejects_a_too_small_split() -> None:
    sampler = TrainSampler(tiny_stream(9), seq_len=8, batch_size=5, seed=0)
    assert sampler.next_batch().targets.tolist() == [list(range(1, 9))] * 5
    with pytest.raises(ConfigError, match="8 tokens"):
        TrainSampler(tiny_stream(8), seq_len=8, batch_size=1, seed=0)


# ---------------------------------------------------------------- local text


@pytest.mark.parametrize("valid_name", ["valid", "validation"])
def test_text_folder_with_split_folders_gives_one_document_per_file(tmp_path: Path, valid_name: str) -> None:
    corpus = generate_corpus(TINY)
    root = write_text_folder(corpus, tmp_path / "corpus")
    (root / "valid").rename(root / valid_name)
    docs = load_documents(data_config(tmp_path, source="text", path=str(root)))
    assert {split: sorted(texts) for split, texts in docs.items()} == {
        split: sorted(texts) for split, texts in corpus.items()
    }


def test_text_cache_follows_the_file_contents(tmp_path: Path) -> None:
    root = write_text_folder(generate_corpus(TINY), tmp_path / "corpus")
    cfg = data_config(tmp_path, source="text", path=str(root))
    before = prepare_data(cfg)
    (root / "valid" / "doc_00000.txt").write_text("Changed. Entirely.\n")
    after = prepare_data(cfg)
    assert after.cache_dir != before.cache_dir
    assert after.tokenizer.decode(after.streams["valid"].tokens).startswith("Changed. Entirely.\n")
    assert np.array_equal(after.streams["train"].tokens, before.streams["train"].tokens)


def test_split_documents_holds_out_one_twentieth_of_documents() -> None:
    docs = numbered_docs(40)
    assert split_documents(docs) == {"train": docs[:36], "valid": docs[36:38], "test": docs[38:]}
    assert split_documents(docs[:3]) == {"train": docs[:1], "valid": docs[1:2], "test": docs[2:3]}


def test_split_documents_splits_a_single_document_by_paragraph_90_5_5() -> None:
    paragraphs = [f"Paragraph {i:03d} has some words." for i in range(100)]
    docs = split_documents(["\n\n".join(paragraphs) + "\n"])
    assert [len(docs[s]) for s in ("train", "valid", "test")] == [1, 1, 1]
    parts = [docs[s][0].split("\n\n") for s in ("train", "valid", "test")]
    assert [p.strip() for part in parts for p in part] == paragraphs
    sizes = np.array([len(part) for part in parts])
    assert np.all(np.abs(sizes - [90, 5, 5]) <= 1)  # cuts at 90% and 95% of the characters


def test_split_documents_splits_a_few_paragraphs_into_three_parts() -> None:
    docs = split_documents(["First part.\n\nSecond part.\n\nThird part.\n\nFourth part.\n"])
    assert all(len(docs[s]) == 1 for s in ("train", "valid", "test"))


def test_plain_text_folder_is_split_by_document(tmp_path: Path) -> None:
    texts = numbered_docs(4)
    write_docs(tmp_path / "plain", texts)
    docs = load_documents(data_config(tmp_path, source="text", path=str(tmp_path / "plain")))
    assert docs == {"train": texts[:2], "valid": texts[2:3], "test": texts[3:]}


def test_single_text_file_is_split_by_paragraph(tmp_path: Path) -> None:
    paragraphs = [f"Paragraph {i:02d}. It has two sentences." for i in range(40)]
    path = tmp_path / "book.txt"
    path.write_text("\n\n".join(paragraphs) + "\n")
    docs = load_documents(data_config(tmp_path, source="text", path=str(path)))
    assert all(len(docs[s]) == 1 and docs[s][0].strip() for s in ("train", "valid", "test"))
    joined = "\n\n".join(docs[s][0].strip() for s in ("train", "valid", "test"))
    assert joined.split("\n\n") == paragraphs


def test_glob_selects_only_matching_files(tmp_path: Path) -> None:
    texts = numbered_docs(4)
    write_docs(tmp_path / "texts", texts[:3])
    (tmp_path / "texts" / "notes.txt").write_text(texts[3])
    docs = load_documents(data_config(tmp_path, source="text", path=str(tmp_path / "texts" / "doc_*.txt")))
    assert docs == {"train": texts[:1], "valid": texts[1:2], "test": texts[2:3]}


# ---------------------------------------------------------------- hub (offline copy)


def test_group_wikitext_starts_an_article_at_each_title_line() -> None:
    lines = ["", " = A = \n", "", " Text a .", " = = Sub = = \n", " = = = Deeper = = = \n", " = B = ", " b ."]
    assert group_wikitext(lines) == [
        " = A = \n\n Text a .\n = = Sub = = \n = = = Deeper = = = \n",
        " = B = \n b .\n",
    ]


def test_hub_local_parquet_copy_is_regrouped_into_articles(tmp_path: Path) -> None:
    cfg = hub_config(tmp_path, write_wikitext(tmp_path / "wikitext"))
    docs = load_documents(cfg)
    assert docs == {
        "train": [
            " = Title One = \n\n Some text . More text .\n\n = = Section = = \n\n Other text .\n",
            " = Title Two = \n\n Second article .\n",
        ],
        "valid": [" = Title Three = \n\n Valid text .\n"],
        "test": [" = Title Four = \n\n Test text .\n"],
    }
    data = prepare_data(cfg)
    assert (data.streams["train"].tokens == BOS).sum() == 2


# ---------------------------------------------------------------- bad input


def test_missing_path_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-corpus"
    assert str(missing) in config_error(data_config(tmp_path, source="text", path=str(missing)))


def test_unset_path_is_reported(tmp_path: Path) -> None:
    assert "data.path" in config_error(data_config(tmp_path, source="text"))


def test_folder_without_text_files_is_named(tmp_path: Path) -> None:
    write_docs(tmp_path / "csv", ["a,b\n1,2\n"], suffix=".csv")
    assert str(tmp_path / "csv") in config_error(
        data_config(tmp_path, source="text", path=str(tmp_path / "csv"))
    )


def test_split_folders_of_only_empty_files_are_named(tmp_path: Path) -> None:
    write_docs(tmp_path / "corpus" / "train", ["", " \n\n"])
    write_docs(tmp_path / "corpus" / "valid", [""])
    message = config_error(data_config(tmp_path, source="text", path=str(tmp_path / "corpus")))
    assert str(tmp_path / "corpus") in message and "train" in message


def test_empty_text_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("")
    assert str(tmp_path / "empty.txt") in config_error(
        data_config(tmp_path, source="text", path=str(tmp_path / "empty.txt"))
    )


def test_folder_of_only_empty_files_is_named(tmp_path: Path) -> None:
    write_docs(tmp_path / "empties", ["", "\n\n", "   "])
    assert str(tmp_path / "empties") in config_error(
        data_config(tmp_path, source="text", path=str(tmp_path / "empties"))
    )


def test_binary_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "binary.txt"
    path.write_bytes(bytes(range(256)) * 10)
    message = config_error(data_config(tmp_path, source="text", path=str(path)))
    assert str(path) in message and "UTF-8" in message


def test_small_file_ending_in_an_invalid_byte_is_named(tmp_path: Path) -> None:
    write_docs(tmp_path / "corpus" / "train", numbered_docs(1))
    write_docs(tmp_path / "corpus" / "valid", numbered_docs(1))
    bad = tmp_path / "corpus" / "train" / "latin1.txt"
    bad.write_bytes("Caf\u00e9".encode("latin-1"))
    assert str(bad) in config_error(data_config(tmp_path, source="text", path=str(tmp_path / "corpus")))


def test_train_folder_without_valid_folder_is_named(tmp_path: Path) -> None:
    write_docs(tmp_path / "corpus" / "train", numbered_docs(2))
    write_docs(tmp_path / "corpus" / "test", numbered_docs(1))
    message = config_error(data_config(tmp_path, source="text", path=str(tmp_path / "corpus")))
    assert str(tmp_path / "corpus") in message and "valid/" in message


def test_hub_local_dir_that_is_not_a_folder_is_named(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "wikitext.parquet"
    not_a_folder.write_bytes(b"PAR1")
    message = config_error(hub_config(tmp_path, not_a_folder))
    assert f"data.hub_local_dir='{not_a_folder}'" in message


def test_hub_local_dir_without_validation_split_is_named(tmp_path: Path) -> None:
    folder = write_wikitext(tmp_path / "wikitext")
    (folder / "validation-00000-of-00001.parquet").unlink()
    message = config_error(hub_config(tmp_path, folder))
    assert str(folder) in message and "['test', 'train']" in message


def test_text_field_that_is_not_a_column_is_named(tmp_path: Path) -> None:
    message = config_error(hub_config(tmp_path, write_wikitext(tmp_path / "wikitext"), text_field="body"))
    assert "data.text_field='body'" in message and "'text'" in message
