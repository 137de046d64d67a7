"""A deterministic, English-like synthetic corpus of long documents; needs no download.

Structure of the text:

* Words come from a fixed vocabulary of `vocab_size` pronounceable pseudo-words made of syllables. They are
  drawn with Zipfian frequencies (probability of rank r proportional to r ** -zipf_exponent); the shortest
  words get the best ranks, as in natural language.
* A document is paragraphs separated by exactly one blank line and ends with a single newline. A paragraph
  is sentences separated by one space; a sentence starts with a capital letter and ends with '.', '?' or
  '!'. The text is pure ASCII, with no leading or trailing spaces.
* Local structure: every paragraph has a small topic (3 to 6 words of the vocabulary) whose words fill a
  good share of its word slots, so words repeat within a paragraph.
* Long-range structure: every document invents `entities_per_doc` entities, each a capitalised name with a
  place (capitalised) and a thing (lowercase), all pseudo-words disjoint from the vocabulary. The first
  paragraph introduces them ("Name lived in Place and kept a thing."). Every later paragraph refers back
  to one or two of them, and the last paragraph to all of them, with sentences that repeat the same
  attributes ("Later, Name returned to Place.", "Name still had the thing."), so predicting an attribute
  requires looking thousands of characters back.

The same spec gives byte-identical output: the lexicon and each split draw from their own sub-stream of
`numpy.random.SeedSequence(seed)`, so a split does not change when another split's size changes, and the
first documents of a split do not change when the split grows.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from posab.errors import ConfigError

SPLITS = ("train", "valid", "test")

# Repeated parts are drawn more often: simple onsets and vowels, open syllables.
_ONSETS = 2 * tuple("bcdfghjklmnprstvwz") + (
    "br",
    "cr",
    "dr",
    "fr",
    "gr",
    "pr",
    "tr",
    "bl",
    "cl",
    "fl",
    "gl",
    "pl",
    "sl",
    "st",
    "sh",
    "ch",
    "th",
)
_VOWELS = 3 * tuple("aeiou") + ("ai", "ea", "ou", "io", "ee")
_CODAS = 6 * ("",) + tuple("nrslmt") + ("nd", "st", "rk", "ng")
_SYLLABLES = np.array([onset + vowel + coda for onset in _ONSETS for vowel in _VOWELS for coda in _CODAS])

_INTRO_TEMPLATES = (
    "{name} lived in {place} and kept {a_thing}.",
    "{name} came from {place} and carried {a_thing}.",
    "In {place} there lived {name}, who owned {a_thing}.",
    "{name} was born in {place} and was given {a_thing}.",
)
_REFERENCE_TEMPLATES = (
    "Later, {name} returned to {place}.",
    "{name} still had the {thing}.",
    "Once again {name} walked back to {place} with the {thing}.",
    "Nobody in {place} had forgotten {name}.",
    "{name} put the {thing} on the table.",
    "Far from {place}, {name} thought of home.",
    "The {thing} that {name} kept was still there.",
    "{name} went home to {place}.",
)
_TEMPLATE_WORDS = frozenset(re.findall(r"[a-z]+", " ".join(_INTRO_TEMPLATES + _REFERENCE_TEMPLATES).lower()))

_MARKS = np.array([".", "?", "!"])
_MARK_PROBABILITIES = (0.86, 0.08, 0.06)
_TOPIC_SIZE = (3, 6)
_TOPIC_PROBABILITY = 0.25
_SECOND_REFERENCE_PROBABILITY = 0.4
_MIN_ENTITY_POOL = 256


@dataclass(frozen=True)
class SyntheticSpec:
    """Size and shape of the synthetic corpus; every range is (low, high), inclusive."""

    seed: int = 0
    vocab_size: int = 2000  # number of distinct ordinary words
    zipf_exponent: float = 1.1
    train_docs: int = 400
    valid_docs: int = 40
    test_docs: int = 40
    paragraphs_per_doc: tuple[int, int] = (20, 40)
    sentences_per_paragraph: tuple[int, int] = (3, 7)
    words_per_sentence: tuple[int, int] = (6, 16)
    entities_per_doc: int = 4

    def __post_init__(self) -> None:
        _validate(self)


@dataclass(frozen=True)
class _Lexicon:
    words: np.ndarray  # ordinary words, most frequent first
    cdf: np.ndarray  # cumulative Zipf probabilities, aligned with words
    names: np.ndarray
    places: np.ndarray
    things: np.ndarray


def generate_corpus(spec: SyntheticSpec) -> dict[str, list[str]]:
    """Return {'train': [...], 'valid': [...], 'test': [...]}, each a list of document strings."""
    lexicon_seed, *split_seeds = np.random.SeedSequence(spec.seed).spawn(1 + len(SPLITS))
    lexicon = _build_lexicon(spec, np.random.default_rng(lexicon_seed))
    counts = {"train": spec.train_docs, "valid": spec.valid_docs, "test": spec.test_docs}
    return {
        split: _generate_documents(spec, lexicon, np.random.default_rng(seed), counts[split])
        for split, seed in zip(SPLITS, split_seeds, strict=True)
    }


def write_text_folder(corpus: dict[str, list[str]], root: Path) -> Path:
    """Write root/{train,valid,test}/doc_00000.txt, one document per file; return root."""
    root = Path(root)
    for split, documents in corpus.items():
        folder = root / split
        folder.mkdir(parents=True, exist_ok=True)
        for index, document in enumerate(documents):
            (folder / f"doc_{index:05d}.txt").write_bytes(document.encode("ascii"))
    return root


# --- validation ------------------------------------------------------------------------------------------


def _validate(spec: SyntheticSpec) -> None:
    minimums = {
        "seed": 0,
        "vocab_size": 1,
        "train_docs": 1,
        "valid_docs": 1,
        "test_docs": 1,
        "entities_per_doc": 1,
    }
    for name, minimum in minimums.items():
        _check_count(name, getattr(spec, name), minimum)
    _check_zipf_exponent(spec.zipf_exponent)
    range_minimums = {"paragraphs_per_doc": 2, "sentences_per_paragraph": 1, "words_per_sentence": 1}
    for name, minimum in range_minimums.items():
        _check_range(name, getattr(spec, name), minimum)


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _check_count(name: str, value: object, minimum: int) -> None:
    if not _is_int(value) or value < minimum:
        raise ConfigError(f"SyntheticSpec.{name}={value!r} is invalid: expected an integer >= {minimum}")


def _check_zipf_exponent(value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"SyntheticSpec.zipf_exponent={value!r} is invalid: expected a finite number >= 0")


def _check_range(name: str, value: object, minimum: int) -> None:
    valid = (
        isinstance(value, tuple | list)
        and len(value) == 2
        and all(_is_int(v) for v in value)
        and minimum <= value[0] <= value[1]
    )
    if not valid:
        raise ConfigError(
            f"SyntheticSpec.{name}={value!r} is invalid: expected a pair (low, high) "
            f"of integers with {minimum} <= low <= high"
        )


# --- lexicon ---------------------------------------------------------------------------------------------


def _build_lexicon(spec: SyntheticSpec, rng: np.random.Generator) -> _Lexicon:
    taken = set(_TEMPLATE_WORDS)
    words = _unique_pseudo_words(rng, spec.vocab_size, (1, 3), taken)
    words = words[np.argsort(np.char.str_len(words), kind="stable")]
    pool = max(_MIN_ENTITY_POOL, 4 * spec.entities_per_doc)
    names = np.char.capitalize(_unique_pseudo_words(rng, pool, (2, 3), taken))
    places = np.char.capitalize(_unique_pseudo_words(rng, pool, (2, 3), taken))
    things = _unique_pseudo_words(rng, pool, (1, 2), taken)
    return _Lexicon(words, _zipf_cdf(spec.vocab_size, spec.zipf_exponent), names, places, things)


def _zipf_cdf(size: int, exponent: float) -> np.ndarray:
    weights = np.arange(1, size + 1, dtype=np.float64) ** -exponent
    cdf = np.cumsum(weights) / weights.sum()
    cdf[-1] = 1.0
    return cdf


def _unique_pseudo_words(
    rng: np.random.Generator, count: int, syllables: tuple[int, int], taken: set[str]
) -> np.ndarray:
    """Draw `count` distinct pseudo-words not in `taken`, in order of first draw, and add them to `taken`."""
    found: list[str] = []
    while len(found) < count:
        candidates = _random_pseudo_words(rng, count - len(found) + 16, syllables)
        fresh = [word for word in dict.fromkeys(candidates) if word not in taken][: count - len(found)]
        taken.update(fresh)
        found.extend(fresh)
    return np.array(found)


def _random_pseudo_words(rng: np.random.Generator, count: int, syllables: tuple[int, int]) -> list[str]:
    low, high = syllables
    lengths = rng.integers(low, high + 1, size=count)
    picks = _SYLLABLES[rng.integers(0, len(_SYLLABLES), size=(count, high))]
    words = picks[:, 0]
    for position in range(1, high):
        words = np.char.add(words, np.where(lengths > position, picks[:, position], ""))
    return words.tolist()


# --- documents -------------------------------------------------------------------------------------------


def _generate_documents(
    spec: SyntheticSpec, lexicon: _Lexicon, rng: np.random.Generator, count: int
) -> list[str]:
    return [_generate_document(spec, lexicon, rng) for _ in range(count)]


def _generate_document(spec: SyntheticSpec, lexicon: _Lexicon, rng: np.random.Generator) -> str:
    entities = _invent_entities(lexicon, rng, spec.entities_per_doc)
    paragraphs = _ordinary_paragraphs(spec, lexicon, rng)
    paragraphs[0][:0] = [_fill(rng, _INTRO_TEMPLATES, entity) for entity in entities]
    for paragraph in paragraphs[1:-1]:
        count = 1 + int(rng.random() < _SECOND_REFERENCE_PROBABILITY)
        _insert_references(rng, paragraph, [entities[i] for i in rng.integers(0, len(entities), size=count)])
    _insert_references(rng, paragraphs[-1], [entities[i] for i in rng.permutation(len(entities))])
    return "\n\n".join(" ".join(paragraph) for paragraph in paragraphs) + "\n"


def _invent_entities(lexicon: _Lexicon, rng: np.random.Generator, count: int) -> list[dict[str, str]]:
    names = rng.choice(lexicon.names, size=count, replace=False).tolist()
    places = rng.choice(lexicon.places, size=count, replace=False).tolist()
    things = rng.choice(lexicon.things, size=count, replace=False).tolist()
    return [
        {"name": name, "place": place, "thing": thing, "a_thing": _with_article(thing)}
        for name, place, thing in zip(names, places, things, strict=True)
    ]


def _with_article(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _fill(rng: np.random.Generator, templates: tuple[str, ...], entity: dict[str, str]) -> str:
    return templates[rng.integers(0, len(templates))].format(**entity)


def _insert_references(
    rng: np.random.Generator, paragraph: list[str], entities: list[dict[str, str]]
) -> None:
    for entity in entities:
        paragraph.insert(int(rng.integers(0, len(paragraph) + 1)), _fill(rng, _REFERENCE_TEMPLATES, entity))


def _ordinary_paragraphs(spec: SyntheticSpec, lexicon: _Lexicon, rng: np.random.Generator) -> list[list[str]]:
    """Draw a document's paragraphs of ordinary sentences, all words of the document at once."""
    n_paragraphs = int(rng.integers(spec.paragraphs_per_doc[0], spec.paragraphs_per_doc[1] + 1))
    sentence_counts = rng.integers(
        spec.sentences_per_paragraph[0], spec.sentences_per_paragraph[1] + 1, size=n_paragraphs
    )
    sentence_lengths = rng.integers(
        spec.words_per_sentence[0], spec.words_per_sentence[1] + 1, size=int(sentence_counts.sum())
    )
    word_paragraphs = np.repeat(np.repeat(np.arange(n_paragraphs), sentence_counts), sentence_lengths)
    words = lexicon.words[_draw_word_ids(lexicon, rng, word_paragraphs, n_paragraphs)].tolist()
    marks = rng.choice(_MARKS, size=len(sentence_lengths), p=_MARK_PROBABILITIES).tolist()
    ends = np.cumsum(sentence_lengths).tolist()
    sentences = [
        _sentence(words[end - length : end], mark)
        for end, length, mark in zip(ends, sentence_lengths.tolist(), marks, strict=True)
    ]
    bounds = np.cumsum(sentence_counts).tolist()
    return [sentences[end - count : end] for end, count in zip(bounds, sentence_counts.tolist(), strict=True)]


def _draw_word_ids(
    lexicon: _Lexicon, rng: np.random.Generator, word_paragraphs: np.ndarray, n_paragraphs: int
) -> np.ndarray:
    """Zipfian word ids, a share of them replaced by words of their paragraph's topic."""
    vocab_size = len(lexicon.words)
    zipf_ids = np.searchsorted(lexicon.cdf, rng.random(len(word_paragraphs)), side="right")
    topics = np.stack(
        [
            rng.choice(vocab_size, size=_TOPIC_SIZE[1], replace=vocab_size < _TOPIC_SIZE[1])
            for _ in range(n_paragraphs)
        ]
    )
    topic_sizes = rng.integers(_TOPIC_SIZE[0], _TOPIC_SIZE[1] + 1, size=n_paragraphs)
    slots = (rng.random(len(word_paragraphs)) * topic_sizes[word_paragraphs]).astype(np.int64)
    is_topic = rng.random(len(word_paragraphs)) < _TOPIC_PROBABILITY
    return np.where(is_topic, topics[word_paragraphs, slots], zipf_ids)


def _sentence(words: list[str], mark: str) -> str:
    text = " ".join(words)
    return text[0].upper() + text[1:] + mark
