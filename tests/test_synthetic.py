import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from posab.data.synthetic import SyntheticSpec, generate_corpus, write_text_folder

SMALL = SyntheticSpec(
    seed=3,
    vocab_size=300,
    train_docs=6,
    valid_docs=3,
    test_docs=2,
    paragraphs_per_doc=(8, 12),
    entities_per_doc=3,
)

SENTENCE = r"[A-Z][a-z]*(?:,? [A-Za-z]+)*[.!?]"
PARAGRAPH = rf"{SENTENCE}(?: {SENTENCE})*"
DOCUMENT = re.compile(rf"{PARAGRAPH}(?:\n\n{PARAGRAPH})*\n")
# Introductions as the generator writes them: (name, place, thing) in some order, one template per entity.
NAME, PLACE, THING = r"(?P<name>[A-Z][a-z]+)", r"(?P<place>[A-Z][a-z]+)", r"an? (?P<thing>[a-z]+)"
INTRODUCTIONS = tuple(
    re.compile(pattern)
    for pattern in (
        rf"{NAME} lived in {PLACE} and kept {THING}\.",
        rf"{NAME} came from {PLACE} and carried {THING}\.",
        rf"In {PLACE} there lived {NAME}, who owned {THING}\.",
        rf"{NAME} was born in {PLACE} and was given {THING}\.",
    )
)


@pytest.fixture(scope="module")
def small_corpus() -> dict[str, list[str]]:
    return generate_corpus(SMALL)


def introductions(document: str) -> list[dict[str, str]]:
    first_paragraph = document.split("\n\n")[0]
    return [match.groupdict() for pattern in INTRODUCTIONS for match in pattern.finditer(first_paragraph)]


def test_same_spec_gives_identical_corpus_and_another_seed_differs(small_corpus):
    assert generate_corpus(SMALL) == small_corpus
    other = generate_corpus(replace(SMALL, seed=4))
    for split, documents in small_corpus.items():
        assert all(a != b for a, b in zip(other[split], documents, strict=True))


def test_split_sizes_and_valid_split_is_independent_of_train_docs(small_corpus):
    assert {split: len(docs) for split, docs in small_corpus.items()} == {"train": 6, "valid": 3, "test": 2}
    bigger = generate_corpus(replace(SMALL, train_docs=9))
    assert bigger["valid"] == small_corpus["valid"]
    assert bigger["test"] == small_corpus["test"]
    assert bigger["train"][:6] == small_corpus["train"]
    assert len(set(small_corpus["train"]) & set(small_corpus["valid"])) == 0


def test_documents_are_ascii_paragraphs_of_punctuated_sentences(small_corpus):
    for document in (doc for docs in small_corpus.values() for doc in docs):
        assert document.isascii()
        assert DOCUMENT.fullmatch(document), document[:300]
        assert "\n\n\n" not in document and not document.endswith("\n\n")
        assert 8 <= document.count("\n\n") + 1 <= 12


def test_word_frequencies_are_zipfian_and_paragraph_topics_repeat(small_corpus):
    words = re.findall(r"[a-z]+", " ".join(small_corpus["train"]).lower())
    counts = sorted(Counter(words).values(), reverse=True)
    assert counts[0] > 20 * counts[len(counts) // 2]
    # A paragraph repeats its topic words: most paragraphs use some word outside the corpus's 20 most
    # frequent words at least 3 times (without topics, fewer than 10% of paragraphs do).
    common = {word for word, _ in Counter(words).most_common(20)}
    paragraphs = [p for doc in small_corpus["train"] for p in doc.split("\n\n")[1:]]
    repeats = [Counter(w for w in re.findall(r"[a-z]+", p.lower()) if w not in common) for p in paragraphs]
    assert sum(max(r.values(), default=0) >= 3 for r in repeats) > 0.7 * len(paragraphs)


def test_entities_introduced_first_are_referred_to_with_their_attributes_at_the_end(small_corpus):
    for document in (doc for docs in small_corpus.values() for doc in docs):
        entities = introductions(document)
        assert len(entities) == SMALL.entities_per_doc
        last_quarter = document[3 * len(document) // 4 :]
        sentences = re.findall(r"[^.!?]*[.!?]", last_quarter)
        for entity in entities:
            about = [s for s in sentences if re.search(rf"\b{entity['name']}\b", s)]
            attribute = rf"\b({entity['place']}|{entity['thing']})\b"
            assert any(re.search(attribute, s) for s in about), entity


def test_every_later_paragraph_refers_to_an_introduced_entity(small_corpus):
    for document in small_corpus["train"]:
        names = [entity["name"] for entity in introductions(document)]
        for paragraph in document.split("\n\n")[1:]:
            assert any(re.search(rf"\b{name}\b", paragraph) for name in names), paragraph


def test_attributes_stay_consistent_throughout_the_document(small_corpus):
    for document in small_corpus["train"]:
        entities = introductions(document)
        places = {e["place"] for e in entities}
        for entity in entities:
            for sentence in re.findall(r"[^.!?]*[.!?]", document):
                if re.search(rf"\b{entity['name']}\b", sentence):
                    assert not (places - {entity["place"]}) & set(sentence.split()), sentence


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("vocab_size", 0),
        ("train_docs", -1),
        ("entities_per_doc", 0),
        ("seed", -5),
        ("zipf_exponent", -1.0),
        ("paragraphs_per_doc", (5, 3)),
        ("sentences_per_paragraph", (0, 2)),
        ("words_per_sentence", (4,)),
    ],
)
def test_invalid_spec_names_the_field_and_value(field, value):
    with pytest.raises(ValueError, match=rf"{field}={re.escape(repr(value))}.*expected"):
        SyntheticSpec(**{field: value})


def test_write_text_folder_writes_one_file_per_document(small_corpus, tmp_path: Path):
    root = write_text_folder(small_corpus, tmp_path / "corpus")
    assert root == tmp_path / "corpus"
    for split, documents in small_corpus.items():
        files = sorted((root / split).glob("*.txt"))
        assert [f.name for f in files] == [f"doc_{i:05d}.txt" for i in range(len(documents))]
        assert [f.read_bytes().decode("ascii") for f in files] == documents


def test_default_corpus_is_long_enough():  # its generation time is the benchmark's business, not a test's
    corpus = generate_corpus(SyntheticSpec())
    assert {split: len(docs) for split, docs in corpus.items()} == {"train": 400, "valid": 40, "test": 40}
    lengths = [len(doc) for docs in corpus.values() for doc in docs]
    assert min(lengths) > 4096
    assert 8_000 <= sum(lengths) / len(lengths) <= 20_000
    assert 4_000_000 <= sum(lengths) <= 8_000_000
