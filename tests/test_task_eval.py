"""The task evaluator (`eval.task`, posab.evaluate.task): cached greedy decoding equals step-by-step
full-forward decoding on task prompts for every encoding; exact match reads known outputs (a model that
memorised its examples scores 1, one that does not stop scores 0); the greedy and teacher-forced verdicts
agree; the run writes the table, figure and keys; a run of every kind of task through train.py's path."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import ENCODINGS, run_main, typed_config
from posab.build import build_model
from posab.catalog import task as task_columns
from posab.data import prepare_data
from posab.data.streams import Batch
from posab.data.tasks import TaskStream, TaskTokenizer, TaskTracker, example_batch
from posab.data.tasks.vocab import EOS
from posab.decoding import generate, step_by_step_full
from posab.errors import ConfigError
from posab.evaluate import EvalContext, run_evaluator
from posab.evaluate.task import RAN_LONG, RIGHT, STOPPED_EARLY, WRONG_TOKEN, error_class
from posab.keys import format_key, parse_key
from posab.model import DecoderLM
from posab.run.summary import summary_text
from posab.training.losses import scored_loss, token_losses

CPU = torch.device("cpu")


def task_config(name: str, encoding: str = "nope", *overrides: str):
    return typed_config(["+experiment=tiny", "data=task", f"task={name}", f"encoding={encoding}", *overrides])


def task_model(name: str, encoding: str = "nope", *overrides: str, scale: float = 0.0) -> DecoderLM:
    """A tiny model for a task's vocabulary; `scale` > 0 draws its layers' weights larger, so that its
    choices depend on the context (as tests/test_decoding.py's `context_model`)."""
    torch.manual_seed(0)
    model = build_model(task_config(name, encoding, *overrides), TaskTokenizer.vocab_size).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param_name, weight in model.named_parameters():
            if (
                scale
                and weight.dim() == 2
                and not param_name.startswith("encoding.")
                and param_name != "embed.weight"
            ):
                weight.normal_(0, scale / weight.shape[1] ** 0.5, generator=generator)
    return model


SAMPLED = "encoding.eval_positions=sampled"  # randomized positions as the reference evaluates them


@pytest.mark.parametrize(
    ("encoding", "override"), [(name, None) for name in ENCODINGS] + [("randomized_rope", SAMPLED)]
)
def test_cached_greedy_decoding_equals_step_by_step_full_decoding_on_task_prompts(
    encoding: str, override: str | None
) -> None:
    """Prompts of the task format past the training length (copy, n = 30: 32 prompt tokens, 31 written;
    the tiny preset trains at 128, so also n = 70), with the task's structure tracked token by token. With
    sampled positions both decoders draw the same plan (the evaluation draws restart before each)."""
    model = task_model("copy", encoding, *([override] if override else []), scale=4.0)
    stream = TaskStream(
        prepare_data(task_config("copy").data).streams["test"].task, "test", (1, 70), 0, 2**48
    )
    chosen: set[int] = set()
    for n in (30, 70):
        prompt = torch.from_numpy(np.stack([e.prompt_tokens for e in stream.examples_at(n, 2)]))  # (2, n + 2)
        model.train().eval()
        cached = generate(model, prompt, n + 1, structure=[TaskTracker(), TaskTracker()])
        model.train().eval()
        full = step_by_step_full(model, prompt, n + 1, structure=[TaskTracker(), TaskTracker()])
        assert torch.equal(cached, full), (encoding, n)
        chosen |= set(full.flatten().tolist())
    assert len(chosen) > 2, "a degenerate reference: the choices ignore the context"


def memorise(model: DecoderLM, batch: Batch, steps: int = 300) -> DecoderLM:
    """Train `model` on `batch` alone until it writes its scored targets (the answers and EOS)."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for _ in range(steps):
        optimizer.zero_grad()
        scored_loss(token_losses(model, batch), batch).backward()
        optimizer.step()
    return model.eval()


def context(model: DecoderLM, name: str, *overrides: str) -> EvalContext:
    cfg = task_config(name, "nope", *overrides)
    stream = prepare_data(cfg.data).streams["test"]
    return EvalContext(model, TaskTokenizer(), stream, CPU, None, cfg.train.seq_len, cfg.eval, "nope")


EVAL = [
    "data.task.test_lengths=[1,3]",
    "data.task.train_lengths=[1,2]",
    "data.task.seq_len=5",
    "eval.task.examples=3",
]


def test_exact_match_reads_known_outputs() -> None:
    """A model that memorised the 9 test examples of parity (n = 1..3, 3 each) writes every answer and its
    EOS: exact 1 at every length, seen (n <= 2) and unseen (n = 3) alike; the untrained model scores 0."""
    untrained = task_model("parity")
    ctx = context(untrained, "parity", *EVAL)
    examples = [e for n in (1, 2, 3) for e in ctx.valid.examples_at(n, 3)]
    before = run_evaluator(ctx, "task").scalars
    assert before["task/exact_seen"] == before["task/exact_unseen"] == 0.0
    ctx.model = memorise(task_model("parity", "rope"), example_batch(examples, 7))  # tiny NoPE cannot
    output = run_evaluator(ctx, "task")
    scalars = output.scalars
    assert {key: scalars[key] for key in ("task/exact@1", "task/exact@2", "task/exact@3")} == dict.fromkeys(
        ("task/exact@1", "task/exact@2", "task/exact@3"), 1.0
    )
    assert (
        scalars["task/exact_seen"] == scalars["task/exact_unseen"] == 1.0 and scalars["task/tf_disagree"] == 0
    )
    assert output.tables["task_accuracy"].rows == [  # no wrong answer of any kind; right by the oracle too
        [1, True, 3, 1.0, 1.0, 0, 0.0, 0.0, 0.0, 1.0],
        [2, True, 3, 1.0, 1.0, 0, 0.0, 0.0, 0.0, 1.0],
        [3, False, 3, 1.0, 1.0, 0, 0.0, 0.0, 0.0, 1.0],
    ]
    assert all(format_key(parse_key(key)) == key for key in scalars if key.startswith("task/"))
    assert "task_accuracy_vs_length" in output.figures


def test_a_model_that_does_not_stop_is_wrong() -> None:
    """Memorised answers followed by '1' instead of EOS: the answer is written, EOS is not, so exact 0 by
    both verdicts; every answer ran long, and the oracle-length reading (EOS suppressed, the answer's tokens
    alone) finds them all right."""
    ctx = context(task_model("parity"), "parity", *EVAL)
    examples = [e for n in (1, 2, 3) for e in ctx.valid.examples_at(n, 3)]
    batch = example_batch(examples, 7)
    eos = batch.targets == 2  # the EOS targets
    batch.targets[eos] = TaskTokenizer().encode("1", document=False).tokens[0].item()
    ctx.model = memorise(task_model("parity", "rope"), batch)
    output = run_evaluator(ctx, "task")
    scalars = output.scalars
    assert scalars["task/exact_seen"] == scalars["task/exact_unseen"] == 0.0
    assert scalars["task/tf_disagree"] == 0
    assert all(
        scalars[f"task/ran_long@{n}"] == 1.0 and scalars[f"task/oracle_exact@{n}"] == 1.0 for n in (1, 2, 3)
    )
    assert scalars["task/oracle_exact_seen"] == scalars["task/oracle_exact_unseen"] == 1.0
    assert set(output.arrays["task_examples"]["error"]) == {RAN_LONG}
    assert set(output.arrays["task_examples"]["first_wrong"]) == {1}  # parity's answer is one digit


def test_flip_flop_is_also_scored_on_its_sparse_and_dense_test_distributions() -> None:
    """The task's further test distributions (`Task.tests`) are scored greedily at every length, from the
    same seeds, under their own keys; those keys parse, and the report's catalog offers their columns."""
    overrides = ["data.task.test_lengths=[2,4]", "data.task.train_lengths=[2,3]", "data.task.seq_len=8"]
    ctx = context(task_model("flipflop"), "flipflop", *overrides, "eval.task.examples=4")
    scalars = run_evaluator(ctx, "task").scalars
    for test in ("sparse", "dense"):
        per_length = [scalars[f"task@{test}/exact@{n}"] for n in (2, 3, 4)]
        assert all(0.0 <= v <= 1.0 for v in per_length)
        assert scalars[f"task@{test}/exact_unseen"] == per_length[2]
        assert scalars[f"task@{test}/exact_seen"] == pytest.approx(np.mean(per_length[:2]))
    assert all(format_key(parse_key(key)) == key for key in scalars if key.startswith("task"))
    headers = [c.header for c in task_columns.report_columns(set(scalars))]
    assert {"exact unseen sparse", "exact unseen dense"} <= set(headers)
    sparse = ctx.valid.examples_at(30, 50, "sparse")
    dense = ctx.valid.examples_at(30, 50, "dense")
    ignores = [sum(e.prompt.count(k) for e in group) for group, k in ((sparse, "i"), (dense, "i"))]
    assert ignores[0] > 5 * ignores[1]  # 0.98 against 0.1 of the middle instructions


def test_a_wrong_answer_is_classed_by_its_first_wrong_token() -> None:
    """Hand-worked: the answer 5 7 and EOS (2) against what decoding wrote."""
    wanted = np.array([9, 11, EOS])
    cases = {
        (9, 11, EOS, 0): (RIGHT, -1),  # right; what follows EOS is not read
        (9, EOS, 11, EOS): (STOPPED_EARLY, 1),  # EOS after one token
        (EOS, 9, 11, EOS): (STOPPED_EARLY, 0),
        (9, 12, EOS, 0): (WRONG_TOKEN, 1),
        (10, 11, EOS, 0): (WRONG_TOKEN, 0),
        (9, 11, 11, EOS): (RAN_LONG, 2),  # the answer, then no EOS
    }
    for written, expected in cases.items():
        assert error_class(np.array(written), wanted) == expected, written


def test_decoding_never_writes_a_suppressed_id() -> None:
    """`generate(suppress=...)`: greedy decoding picks the best of the other ids; none suppressed, as
    before."""
    model = task_model("parity", "rope")
    prompt = torch.tensor([[1, 5, 6, 3]])
    free = generate(model, prompt, 6)
    banned = tuple(int(t) for t in set(free[0].tolist()))
    held = generate(model, prompt, 6, suppress=banned)
    assert not set(held[0].tolist()) & set(banned)
    assert torch.equal(generate(model, prompt, 6, suppress=()), free)


def test_decoding_feeds_the_given_ids_and_chooses_the_rest_as_the_full_forward_pass() -> None:
    """`generate(given=...)`: at a given step the id fed is the given one, whatever the model prefers; at
    the others the id written is the full forward pass's argmax over the prompt and the ids so far."""
    model = task_model("mqar", "rope", scale=4.0)
    prompt = torch.tensor([[1, 5, 6, 7, 8], [1, 9, 10, 11, 12]])  # (2, 5)
    free = generate(model, prompt, 6)
    given = torch.full((2, 6), -1)
    given[:, 0::2] = (free[:, 0::2] + 1) % TaskTokenizer.vocab_size  # never what the model would write
    written = generate(model, prompt, 6, given=given)
    assert torch.equal(written[:, 0::2], given[:, 0::2])
    read = torch.cat([prompt, written[:, :-1]], dim=1)  # (2, 10)
    with torch.no_grad():
        argmax = model(read)[:, prompt.shape[1] - 1 :].argmax(-1)  # (2, 6)
    assert torch.equal(written[:, 1::2], argmax[:, 1::2])
    assert not torch.equal(written, free)  # the fed ids changed what followed, or the test shows nothing
    with pytest.raises(ConfigError, match=r"given of shape \(2, 5\)"):
        generate(model, prompt, 6, given=given[:, :5])


def test_mqar_scores_its_values_alone_greedy_and_teacher_forced_alike() -> None:
    """MQAR's query keys are given: fed in decoding, not in the loss. Memorised on a third of the examples:
    some right, some wrong, each with the same verdict from cached greedy decoding (keys fed) and from the
    teacher-forced argmax over the values and EOS alone."""
    ctx = context(task_model("mqar"), "mqar", "data.task.test_lengths=[1,4]", "eval.task.examples=6")
    examples = [e for n in range(1, 5) for e in ctx.valid.examples_at(n, 6)]
    batch = example_batch(examples[::3], 18)
    scored = [
        TaskTokenizer().decode(row[mask], show_special=True)
        for row, mask in zip(batch.targets, batch.loss_mask, strict=True)
    ]
    assert scored == [e.answer[1::2] + "<eos>" for e in examples[::3]]  # the values, not the keys
    ctx.model = memorise(task_model("mqar"), batch, steps=120)
    output = run_evaluator(ctx, "task")
    rows = output.tables["task_accuracy"].rows
    exact = [row[3] for row in rows]
    assert 0 < np.mean(exact) < 1, f"not a mixed model: {exact}"
    assert output.scalars["task/tf_disagree"] == 0 and [row[4] for row in rows] == exact


def test_greedy_and_teacher_forced_verdicts_agree_on_a_half_learned_model() -> None:
    """Memorised on a third of the examples for a few steps: some right, some wrong, and each example gets
    the same verdict from cached greedy decoding and from the teacher-forced argmax (fp32)."""
    ctx = context(task_model("copy"), "copy", "data.task.test_lengths=[1,6]", "eval.task.examples=6")
    examples = [e for n in range(1, 7) for e in ctx.valid.examples_at(n, 6)]
    ctx.model = memorise(task_model("copy"), example_batch(examples[::3], 14), steps=120)
    output = run_evaluator(ctx, "task")
    rows = output.tables["task_accuracy"].rows
    exact = [row[3] for row in rows]
    assert 0 < np.mean(exact) < 1, f"not a mixed model: {exact}"
    assert output.scalars["task/tf_disagree"] == 0 and [row[4] for row in rows] == exact


def test_sampled_positions_score_greedy_and_teacher_forced_at_one_plan() -> None:
    """Randomized RoPE evaluated `sampled`, memorised on its examples at sampled training positions: each
    batch's decoding and teacher-forced pass share one plan, so the verdicts agree example by example."""
    model = task_model("parity", "randomized_rope", SAMPLED)
    ctx = context(model, "parity", *EVAL)
    examples = [e for n in (1, 2, 3) for e in ctx.valid.examples_at(n, 3)]
    ctx.model = memorise(model, example_batch(examples, 7), steps=300)
    output = run_evaluator(ctx, "task")
    exact = [row[3] for row in output.tables["task_accuracy"].rows]
    assert (
        output.scalars["task/tf_disagree"] == 0
        and [row[4] for row in output.tables["task_accuracy"].rows] == exact
    )
    assert max(exact) > 0  # some right: the verdicts agree on more than failures


def test_the_evaluator_needs_task_data() -> None:
    cfg = typed_config(["+experiment=tiny"])
    data = prepare_data(cfg.data)
    model = build_model(cfg, data.vocab_size)
    ctx = EvalContext(model, data.tokenizer, data.streams["valid"], CPU, None, 128, cfg.eval, "rope")
    with pytest.raises(ConfigError, match="data=task task=NAME"):
        run_evaluator(ctx, "task")


def test_report_columns_follow_the_keys() -> None:
    columns = task_columns.report_columns(["task/exact_seen", "task/exact_unseen", "task/exact@3"])
    assert [c.key for c in columns] == ["task/exact_seen", "task/exact_unseen"]
    assert task_columns.report_columns(["ppl/512"]) == []


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("copy", ()),
        ("addition", ()),
        ("parity", ()),
        ("mqar", ()),  # its query keys given
        ("addition_reversed", ("data.task.curriculum=4",)),  # a length curriculum
    ],
)
def test_a_task_run_trains_on_answers_and_writes_its_accuracy(
    name: str, extra: tuple[str, ...], tmp_path: Path
) -> None:
    """train.py's path in process: `data=task task=NAME` at a tiny budget writes results.json with every
    test length's key, the table and the figure; the validation loss is finite."""
    overrides = [
        *extra,
        "data=task",
        f"task={name}",
        "model=tiny",
        "train.steps=6",
        "train.batch_size=4",
        "train.warmup_steps=1",
        "train.val_every=3",
        "train.checkpoint_every=6",
        "train.progress=false",
        "eval.progress=false",
        "eval.task.examples=2",
    ]
    results = run_main(overrides, tmp_path)
    cfg = typed_config(overrides)
    low, high = cfg.data.task.test_lengths
    assert results["status"] == "finished" and math.isfinite(results["val_loss"])
    assert {f"task/exact@{n}" for n in range(low, high + 1)} <= set(results["eval"])
    assert {"task/exact_seen", "task/exact_unseen", "task/tf_disagree"} <= set(results["eval"])
    assert (tmp_path / "task_accuracy.csv").is_file() and (tmp_path / "task_accuracy_vs_length.png").is_file()
    examples = np.load(tmp_path / "task_examples.npz")
    assert examples["length"].tolist() == [n for n in range(low, high + 1) for _ in range(2)]
    for n in range(low, high + 1):
        assert examples["exact"][examples["length"] == n].mean() == results["eval"][f"task/exact@{n}"]
    assert not any(key.startswith(("ppl/", "needle/", "shift/", "audit/")) for key in results["eval"])
    summary = summary_text(results, tmp_path)
    assert "task exact match: seen lengths" in summary and "needle" not in summary
