"""Generation (posab.decoding, `posab generate`) and the decoding benchmark (`posab bench decoding`).

Greedy cached generation chooses the tokens full forward passes choose, for every encoding; sampling is
reproducible and stays in the top k; the structure tracker gives generated tokens the sentence and paragraph
indices the data pipeline gives the same tokens; `posab generate` continues a prompt as `generate` does.
(That every cached step's logits equal the full forward's is tests/test_cache_equivalence.py.)
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import posab.data.pipeline
from conftest import ENCODINGS, run_main, tiny_model
from posab.bench.cli import main as bench_main
from posab.build import build_model
from posab.config import load_config
from posab.data import DataConfig, SyntheticConfig, prepare_data, run_tokenizer
from posab.data.bpe import TOKENIZER_FILE, BPETokenizer
from posab.data.structure import StructureTracker
from posab.data.synthetic import SyntheticSpec, generate_corpus
from posab.data.tokenizer import BOS, EOS, ByteTokenizer, Tokenizer, concatenate
from posab.decoding import generate, step_by_step_full
from posab.errors import ConfigError
from posab.model import DecoderLM
from posab.run.directory import CHECKPOINTS, load_model_state
from posab.run.generate import main as generate_main

TRAIN_LEN = 128  # the tiny preset's train.seq_len: prompts of 40 and 160 tokens lie on both sides
STEPS = 12
BYTES = ByteTokenizer(anchors=True)
# closing quotes and brackets, '...', '?!', a newline inside a paragraph, blank lines with spaces and \r,
# several blank lines, trailing whitespace, non-ASCII text, a leading blank line
TEXTS = [
    'He said "Stop!" and left.  Then (quietly) she wrote: "Why?"\n\nA new paragraph... with dots. And '
    "more!\r\n \r\n\n  Third para? Yes.\nLine break, same sentence. Ünïcödé ok. End. ",
    "One.\n\nTwo",
    "\n\nLeading blank line. x",
    "No boundary at all",
]


def context_model(encoding: str) -> DecoderLM:
    """The tiny model with its layers' weights drawn larger. At initialisation its logits are dominated by
    the tied embedding of the input token (greedy decoding repeats the last token whatever the positions);
    here each choice depends on the context and on where it is."""
    model = tiny_model(encoding)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if weight.dim() == 2 and not name.startswith("encoding.") and name != "embed.weight":
                weight.normal_(0, 4 / weight.shape[1] ** 0.5, generator=generator)
    return model


def text_like(length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(2, length) byte tokens with sentence and paragraph indices that grow like text's."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 250, (2, length), generator=g)
    sentence = torch.cumsum(torch.rand(2, length, generator=g) < 0.15, dim=1)
    paragraph = torch.cumsum(torch.rand(2, length, generator=g) < 0.04, dim=1)
    return tokens, sentence, paragraph


def trackers(rows: int = 2, tokenizer: Tokenizer = BYTES) -> list[StructureTracker]:
    return [StructureTracker.for_tokenizer(tokenizer) for _ in range(rows)]


def assert_same_choices(
    model: DecoderLM, prompt: torch.Tensor, got: torch.Tensor, want: torch.Tensor
) -> None:
    """`got` == `want` (B, S); where they first differ, only as a float32 near-tie of the reference's two
    best logits (1e-5 of their scale) may excuse it, and the rest is not compared."""
    if torch.equal(got, want):
        return
    step = int((got != want).any(dim=0).nonzero()[0])
    with torch.no_grad():
        logits = model(torch.cat([prompt, want[:, :step]], dim=1))[:, -1]  # (B, V), no structure needed
    top = logits.topk(2, dim=-1).values  # (B, 2)
    gap = float((top[:, 0] - top[:, 1]).min())
    assert gap <= 1e-5 * float(logits.abs().max()), f"step {step}: {got.tolist()} != {want.tolist()}"


# ---------------------------------------------------------------- generate


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize(("length", "offset"), [(40, 0), (160, 0), (160, 37)])
def test_greedy_cached_generation_chooses_what_full_forwards_choose(
    encoding: str, length: int, offset: int
) -> None:
    model = context_model(encoding)
    prompt, sentence, paragraph = text_like(length, seed=length + offset)
    structure = {"sentence": sentence, "paragraph": paragraph, "offset": offset}
    cached = generate(model, prompt, STEPS, structure=trackers(), **structure)
    full = step_by_step_full(model, prompt, STEPS, structure=trackers(), **structure)
    assert cached.shape == (2, STEPS) and cached.dtype == torch.long
    assert len(set(full.flatten().tolist())) > 2, (
        "a degenerate reference: the choices do not depend on context"
    )
    assert_same_choices(model, prompt, cached, full)


@pytest.mark.parametrize("encoding", ["hierarchical", "learned", "alibi"])
def test_prefill_in_blocks_and_replayed_structure_give_the_same_tokens(encoding: str) -> None:
    """A prompt prefilled in blocks of 16 continues as one prefilled at once; the trackers' own replay of
    the prompt (no indices given) is used alike by both paths."""
    model = context_model(encoding)
    prompt = BYTES.encode(TEXTS[0]).tokens[None, :-1].astype("int64")  # (1, T): the document goes on
    tokens = torch.from_numpy(prompt)
    whole = generate(model, tokens, STEPS, structure=trackers(1), offset=3)
    blocks = generate(model, tokens, STEPS, structure=trackers(1), offset=3, prefill_block=16)
    full = step_by_step_full(model, tokens, STEPS, structure=trackers(1), offset=3)
    assert_same_choices(model, tokens, whole, full)
    assert_same_choices(model, tokens, blocks, full)


def test_sampling_is_reproducible_and_stays_in_the_top_k() -> None:
    model = context_model("hierarchical")
    prompt, sentence, paragraph = text_like(50, seed=3)

    def sample(seed: int, top_k: int | None = 5) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return generate(
            model, prompt, STEPS, temperature=1.5, top_k=top_k, generator=generator,
            structure=trackers(), sentence=sentence, paragraph=paragraph,
        )  # fmt: skip

    first = sample(0)
    assert torch.equal(first, sample(0))
    assert not torch.equal(first, sample(1)) and not torch.equal(sample(0, None), sample(1, None))
    sequence = torch.cat([prompt, first], dim=1)  # (2, T + S)
    replay = [tracker.extend(row) for tracker, row in zip(trackers(), sequence.tolist(), strict=True)]
    indices = [torch.tensor([row[level] for row in replay]) for level in (0, 1)]  # sentence, paragraph (2, n)
    with torch.no_grad():
        logits = model(sequence, *indices)[:, prompt.shape[1] - 1 : -1]  # (2, S, V): each step's logits
    allowed = logits.topk(5, dim=-1).indices  # (2, S, 5)
    assert (allowed == first[..., None]).any(dim=-1).all()
    assert len(set(first[0].tolist())) > 1


def test_generation_restores_the_training_mode_and_refuses_bad_requests() -> None:
    model = tiny_model("alibi").train()
    prompt = torch.zeros(1, 4, dtype=torch.long)
    generate(model, prompt, 2)
    assert model.training
    bad = [
        ({"steps": 0}, "steps=0"),
        ({"temperature": -1.0}, "temperature=-1.0"),
        ({"top_k": 0}, "top_k=0"),
        ({"offset": -1}, "offset=-1"),
        ({"sentence": torch.zeros(1, 4, dtype=torch.long)}, "pass structure="),
    ]
    for kwargs, message in bad:
        with pytest.raises(ConfigError, match=message):
            generate(model, prompt, **{"steps": 2, **kwargs})
    with pytest.raises(ConfigError, match="T >= 1"):
        generate(model, prompt[:, :0], 2)


# ---------------------------------------------------------------- the structure tracker


@pytest.fixture(scope="module")
def documents() -> list[str]:
    spec = SyntheticSpec(vocab_size=300, train_docs=3, valid_docs=1, test_docs=1)
    return [*TEXTS, *generate_corpus(spec)["train"]]


@pytest.fixture(scope="module")
def bpe(documents: list[str]) -> BPETokenizer:
    return BPETokenizer.train(documents, 400)


def tokenizers(bpe: BPETokenizer, anchors: bool) -> list[Tokenizer]:
    return [ByteTokenizer(anchors), BPETokenizer(bpe.hf, anchors)]


def replayed(tokenizer: Tokenizer, ids: list[int]) -> tuple[list[int], list[int]]:
    """The indices a fresh tracker gives `ids`, fed one token at a time."""
    tracker = StructureTracker.for_tokenizer(tokenizer)
    out = [tracker.extend([token]) for token in ids]
    return [s for (s,), _ in out], [p for _, (p,) in out]


def test_with_anchors_the_tracker_numbers_a_stream_of_documents_as_the_data_does(
    documents: list[str], bpe: BPETokenizer
) -> None:
    for tokenizer in tokenizers(bpe, anchors=True):
        stream = concatenate([tokenizer.encode(doc) for doc in documents])
        assert replayed(tokenizer, stream.tokens.tolist()) == (
            stream.sentence.tolist(),
            stream.paragraph.tolist(),
        )
        assert int(stream.paragraph[-1]) > len(documents)  # documents, paragraphs and sentences were counted


def test_without_anchors_the_tracker_numbers_each_document_as_the_data_does(
    documents: list[str], bpe: BPETokenizer
) -> None:
    """From the text alone: sentence and paragraph starts found as the bytes come, inside BPE tokens too."""
    for tokenizer in tokenizers(bpe, anchors=False):
        for doc in documents:
            encoded = tokenizer.encode(doc)
            got = replayed(tokenizer, encoded.tokens.tolist())
            assert got == (encoded.sentence.tolist(), encoded.paragraph.tolist()), repr(doc[:60])


def test_the_tracker_continues_seeded_indices_and_counts_starts_inside_a_token() -> None:
    encoded = BYTES.encode(TEXTS[0])
    half = len(encoded) // 2
    tracker = StructureTracker.for_tokenizer(BYTES)
    tracker.seed(
        encoded.tokens[:half].tolist(), encoded.sentence[:half].tolist(), encoded.paragraph[:half].tolist()
    )
    assert tracker.extend(encoded.tokens[half:].tolist()) == (
        encoded.sentence[half:].tolist(),
        encoded.paragraph[half:].tolist(),
    )
    # anchors: BOS after EOS opens a document, the PARA after BOS does not open another paragraph
    tracker = StructureTracker.for_tokenizer(BYTES)
    assert tracker.extend([BOS, 258, 65, 259, 66, EOS, BOS, 258, 67]) == (
        [0, 0, 0, 1, 1, 1, 2, 2, 2],
        [0, 0, 0, 0, 0, 0, 1, 1, 1],
    )
    # without anchors: one generated piece holding a sentence end and a paragraph break opens both
    pieces: list[bytes | None] = [b"Hi", b". A", b"\n\nB", b" c"]
    tracker = StructureTracker(pieces, anchors=False)
    assert tracker.extend([0, 1, 2, 3]) == ([0, 1, 2, 2], [0, 0, 1, 1])


def test_the_tokenizer_of_a_bpe_run_comes_from_its_cache_without_the_corpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = SyntheticConfig(vocab_size=300, train_docs=3, valid_docs=1, test_docs=1)
    cfg = DataConfig(tokenizer="bpe", vocab_size=320, cache_dir=str(tmp_path / "cache"), synthetic=small)
    built = prepare_data(cfg).tokenizer
    monkeypatch.setattr(
        posab.data.pipeline, "prepare_data", lambda cfg: pytest.fail("the corpus was prepared")
    )
    loaded = run_tokenizer(cfg)
    assert isinstance(loaded, BPETokenizer) and loaded.pieces == built.pieces
    assert isinstance(run_tokenizer(DataConfig(anchors=False)), ByteTokenizer)


# ---------------------------------------------------------------- posab generate

RUN_OVERRIDES = [
    "+experiment=tiny",
    "encoding=hierarchical",  # needs the sentence and paragraph indices of every generated token
    "train.steps=4",
    "eval.lengths=[128]",
    "eval.needle.enabled=false",
    "eval.shift.enabled=false",
    "eval.extrapolation.enabled=false",
]
PROMPT = 'The "river" ran.  It ran on!\n\nThen'


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny hierarchical run (in-process, under a second)."""
    tmp = tmp_path_factory.mktemp("generate")
    run_main([*RUN_OVERRIDES, f"data.cache_dir={tmp / 'cache'}"], tmp / "run")
    return tmp / "run"


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = generate_main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_posab_generate_continues_a_prompt_as_generate_does(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(
        [str(run_dir), "--prompt", PROMPT, "--steps", "10", "--device", "cpu", "--json"], capsys
    )
    assert code == 0
    shown = json.loads(out)
    cfg = load_config(OmegaConf.load(run_dir / "config.yaml"))  # type: ignore[arg-type]
    model = build_model(cfg, BYTES.vocab_size)
    load_model_state(cfg, model, run_dir / CHECKPOINTS["latest"])
    prompt = BYTES.encode(PROMPT).tokens.tolist()[:-1]  # BOS PARA ... without the EOS
    assert shown["prompt_ids"] == prompt and shown["prompt"] == PROMPT
    expected = generate(model.eval(), torch.tensor([prompt]), 10, structure=trackers(1))
    assert shown["ids"] == expected[0].tolist()
    assert shown["text"] == BYTES.decode(shown["ids"])
    ids = ",".join(map(str, prompt))
    code, text, _ = cli([str(run_dir), "--prompt-ids", ids, "--steps", "10", "--device", "cpu"], capsys)
    assert code == 0 and text == f"--- prompt ({len(prompt)} tokens)\n{PROMPT}\n" + (
        f"--- continuation (10 tokens, greedy)\n{shown['text']}\n"
    )


def test_a_bpe_run_s_folder_copied_elsewhere_generates_without_corpus_or_token_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A BPE run keeps its tokenizer in its folder: copied to a fresh directory, with its token cache gone
    and the corpus unreachable, the folder alone generates what the original did."""
    bpe = ["data.tokenizer=bpe", "data.vocab_size=300", f"data.cache_dir={tmp_path / 'cache'}"]
    run_main([*RUN_OVERRIDES, *bpe], tmp_path / "run")
    assert (tmp_path / "run" / TOKENIZER_FILE).is_file()
    capsys.readouterr()  # the run's own output
    args = ["--prompt", PROMPT, "--steps", "6", "--device", "cpu", "--json"]
    code, out, _ = cli([str(tmp_path / "run"), *args], capsys)
    assert code == 0
    shutil.copytree(tmp_path / "run", tmp_path / "elsewhere" / "run")
    shutil.rmtree(tmp_path / "cache")
    shutil.rmtree(tmp_path / "run")
    monkeypatch.setattr(
        posab.data.pipeline, "prepare_data", lambda cfg: pytest.fail("the corpus was prepared")
    )
    copied, again, _ = cli([str(tmp_path / "elsewhere" / "run"), *args], capsys)
    assert copied == 0 and json.loads(again)["ids"] == json.loads(out)["ids"]
    assert not (tmp_path / "cache").exists()  # nothing rebuilt the token cache


def test_posab_generate_samples_reproducibly(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(run_dir), "--prompt", PROMPT, "--steps", "8", "--temperature", "1", "--top-k", "20", "--json"]
    runs = [json.loads(cli([*args, "--seed", seed], capsys)[1])["ids"] for seed in ("1", "1", "2")]
    assert runs[0] == runs[1] != runs[2]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompt", ""], "--prompt is empty"),
        (["--prompt", "x", "--steps", "0"], "--steps 0"),
        (["--prompt", "x", "--temperature", "-0.5"], "--temperature -0.5"),
        (["--prompt", "x", "--checkpoint", "passkey"], "has no checkpoint_passkey.pt"),
        (["--prompt-ids", "1,x"], "comma-separated integers"),
        (["--prompt-ids", "999"], "outside the run's vocabulary"),
    ],
)
def test_posab_generate_refuses_bad_inputs(
    run_dir: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = cli([str(run_dir), *args], capsys)
    assert code == 2 and out == "" and err.startswith("error: ") and message in err, err


def test_posab_generate_needs_a_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli([str(tmp_path), "--prompt", "x"], capsys)
    assert code == 2 and "holds no config.yaml (is it a run directory?)" in err


# ---------------------------------------------------------------- posab bench decoding


def test_the_quick_decoding_benchmark_covers_every_encoding(tmp_path: Path) -> None:
    assert bench_main(["decoding", "--quick", "--out", str(tmp_path), "--no-progress"]) == 0
    with (tmp_path / "decoding.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert sorted({row["encoding"] for row in rows}) == ENCODINGS
    assert sorted(int(row["prompt"]) for row in rows) == sorted([32, 96] * len(ENCODINGS))
    for row in rows:
        assert float(row["max_rel_diff"]) < 1e-5, row  # cached logits = the full forward's (fp32)
        assert float(row["cached_ms"]) > 0 and float(row["full_ms"]) > 0 and int(row["decoded"]) == 4
        assert float(row["cache_mib"]) > 0 and float(row["full_peak_mib"]) > 0
    assert "| encoding | prompt |" in (tmp_path / "decoding.md").read_text()
