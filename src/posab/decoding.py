"""Generation with the key/value cache: prefill the prompt, then decode one token per call.

    tracker = structure_tracker(tokenizer)  # posab.data.structure: one per row, for the hierarchical encoding
    ids = generate(model, prompt, steps=64, structure=[tracker])  # (B, 64), greedy
    ids = generate(model, prompt, 64, temperature=0.8, top_k=40, generator=torch.Generator().manual_seed(0))

`generate` prefills the prompt into a `KVCache` in one call (or in blocks of `prefill_block` tokens, to
bound the memory of a long prompt) and then feeds each chosen token alone: every step attends to every
cached key through the encoding's form over all the keys, so a step's logits are the full forward's at that
position (tests/test_cache_equivalence.py). Both decoders fix the positions of the whole sequence first
(`Encoding.planned_positions`): a no-op but for randomized positions evaluated `sampled`, whose one sorted
sample then serves the prompt and every step. `step_by_step_full` decodes greedily without the cache, a full
forward pass over the whole sequence per token: the reference of the tests and of `posab bench decoding`.

Choosing a token: greedy (`temperature=0`) takes the argmax (the first of equal maxima); otherwise a token is
drawn from softmax(logits / temperature), over the `top_k` largest logits when given, by `torch.multinomial`
on the host with `generator`, so a seed gives the same ids on every device.

Sentence and paragraph indices (what the hierarchical encoding reads) of the tokens the model writes come
from a tracker per row (`posab.data.structure`), which assigns them by the data pipeline's own rule, one
token at a time, never changing an earlier token's indices.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from posab.cache import KVCache
from posab.data.tokenizer import IndexTracker
from posab.errors import ConfigError, require
from posab.model import DecoderLM

Indices = tuple[Tensor | None, Tensor | None]  # sentence, paragraph: (B, c) each, or None when unknown


def choose_next(
    logits: Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """logits (B, V) -> the next ids (B, 1): the argmax when `temperature` is 0, else a draw from
    softmax(logits / temperature) over the `top_k` largest (all when None), on the host with `generator`."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    scores = logits.float().cpu() / temperature  # (B, V), on the host: the draws do not depend on the device
    candidates = None
    if top_k is not None and top_k < scores.shape[-1]:
        scores, candidates = scores.topk(top_k, dim=-1)  # (B, k) each
    draw = torch.multinomial(scores.softmax(dim=-1), 1, generator=generator)  # (B, 1)
    ids = draw if candidates is None else candidates.gather(-1, draw)  # (B, 1)
    return ids.to(logits.device)


def prefill(
    model: DecoderLM,
    cache: KVCache,
    tokens: Tensor,
    indices: Indices = (None, None),
    offset: int = 0,
    block: int | None = None,
    positions: Tensor | None = None,
) -> Tensor:
    """Add the prompt `tokens` (B, T), from position `offset` (or at `positions`, (T,) or longer), to an
    empty `cache`, in one call or in blocks of `block` tokens; returns the logits of its last token (B, V)."""
    sentence, paragraph = indices
    length = tokens.shape[1]
    step = length if block is None else block
    logits = tokens.new_empty(0)
    for start in range(0, length, step):
        part = slice(start, min(length, start + step))
        logits = model(
            tokens[:, part],
            None if sentence is None else sentence[:, part],
            None if paragraph is None else paragraph[:, part],
            cache=cache,
            **placed(part, offset if start == 0 else None, positions),
        )
    return logits[:, -1]


def placed(part: slice, offset: int | None, positions: Tensor | None) -> dict[str, Any]:
    """Where the model reads the tokens `part` of a sequence: `offset` (None: after the cache's last), or
    their entries of the sequence's `positions`."""
    return {"offset": offset} if positions is None else {"positions": positions[part]}


@torch.inference_mode()
def generate(
    model: DecoderLM,
    prompt: Tensor,
    steps: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    structure: Sequence[IndexTracker] | None = None,
    sentence: Tensor | None = None,
    paragraph: Tensor | None = None,
    offset: int = 0,
    prefill_block: int | None = None,
    suppress: Sequence[int] = (),
    positions: Tensor | None = None,
    given: Tensor | None = None,
) -> Tensor:
    """Continue `prompt` (B, T) by `steps` tokens with cached decoding: returns the new ids (B, steps).

    `structure`: one tracker per row, extended by the prompt and every new token (the prompt's indices are
    `sentence`, `paragraph` (B, T) when given, seeded into the trackers, else the trackers' replay of it);
    without it no token has indices (every encoding but the hierarchical one). `offset`: the prompt's first
    position. `suppress`: ids never chosen (their logits set to -inf first: the task evaluator's oracle-length
    reading suppresses EOS). `positions`: (T + steps - 1,) or longer, the position of every token the model
    reads, shared by the batch, instead of `offset` (a task's coupled positions). `given`: (B, steps) ids
    fed in place of the model's choice where >= 0 (a task's given answer symbols: MQAR's query keys), -1
    where the model chooses. The model runs in eval mode (its mode is restored after)."""
    check_request(prompt, steps, temperature, top_k, offset, prefill_block, positions)
    check_given(prompt, steps, given)
    with evaluating(model), model.encoding.planned_positions(offset + prompt.shape[1] + steps):
        indices = prompt_indices(prompt, structure, sentence, paragraph)
        cache = KVCache()
        logits = prefill(model, cache, prompt, indices, offset, prefill_block, positions)  # (B, V)
        banned = torch.tensor(list(suppress), dtype=torch.long, device=logits.device)  # (S,), once
        chosen = []
        for step in range(steps):
            if len(banned):
                logits = logits.index_fill(-1, banned, float("-inf"))
            token = choose_next(logits, temperature, top_k, generator)  # (B, 1)
            if given is not None:
                fed = given[:, step : step + 1].to(token.device)  # (B, 1)
                token = torch.where(fed >= 0, fed, token)
            chosen.append(token)
            new = next_indices(token, structure)
            if step + 1 < steps:
                read = prompt.shape[1] + step  # the new token's place in the sequence
                where = placed(slice(read, read + 1), None, positions)
                logits = model(token, *new, cache=cache, **where)[:, -1]  # (B, 1, V) -> (B, V)
        return torch.cat(chosen, dim=1)  # (B, steps)


@torch.inference_mode()
def step_by_step_full(
    model: DecoderLM,
    prompt: Tensor,
    steps: int,
    *,
    structure: Sequence[IndexTracker] | None = None,
    sentence: Tensor | None = None,
    paragraph: Tensor | None = None,
    offset: int = 0,
    positions: Tensor | None = None,
) -> Tensor:
    """Greedy decoding without a cache, the reference: each step a full forward pass over the prompt and
    every token so far; returns the new ids (B, steps). Arguments as `generate`'s."""
    check_request(prompt, steps, 0.0, None, offset, None, positions)
    with evaluating(model), model.encoding.planned_positions(offset + prompt.shape[1] + steps):
        tokens = prompt
        sentence, paragraph = prompt_indices(prompt, structure, sentence, paragraph)
        for _ in range(steps):
            where = placed(slice(0, tokens.shape[1]), offset, positions)
            logits = model(tokens, sentence, paragraph, **where)[:, -1]  # (B, T, V) -> (B, V)
            token = choose_next(logits)  # (B, 1)
            tokens = torch.cat([tokens, token], dim=1)  # (B, n + 1)
            new_sentence, new_paragraph = next_indices(token, structure)
            sentence, paragraph = joined(sentence, new_sentence), joined(paragraph, new_paragraph)
        return tokens[:, prompt.shape[1] :]


def joined(old: Tensor | None, new: Tensor | None) -> Tensor | None:
    """Indices (B, n) followed by the new tokens' (B, c): (B, n + c); None when either is unknown."""
    return None if old is None or new is None else torch.cat([old, new], dim=1)  # (B, n + c)


def check_given(prompt: Tensor, steps: int, given: Tensor | None) -> None:
    """A ConfigError unless `given` is None or (B, steps) integer ids, -1 where the model chooses."""
    if given is None:
        return
    shape = (prompt.shape[0], steps)
    require(
        tuple(given.shape) == shape and not given.is_floating_point() and bool((given >= -1).all()),
        f"given of shape {tuple(given.shape)}, {given.dtype}: give {shape} integer ids, -1 where the model "
        "chooses",
    )


def check_request(
    prompt: Tensor,
    steps: int,
    temperature: float,
    top_k: int | None,
    offset: int,
    block: int | None,
    positions: Tensor | None = None,
) -> None:
    """A ConfigError for a request that cannot be decoded."""
    require(
        prompt.dim() == 2 and prompt.shape[1] > 0 and not prompt.is_floating_point(),
        f"the prompt must be (B, T) token ids with T >= 1; got {prompt.dtype} of shape {tuple(prompt.shape)}",
    )
    require(steps >= 1, f"steps={steps}: generate at least one token")
    require(temperature >= 0, f"temperature={temperature}: use 0 (greedy) or a positive temperature")
    require(top_k is None or top_k >= 1, f"top_k={top_k}: use a positive number, or None for all")
    require(offset >= 0, f"offset={offset}: positions start at 0 or later")
    require(block is None or block >= 1, f"prefill_block={block}: use a positive number, or None")
    if positions is not None:
        read = prompt.shape[1] + steps - 1  # the prompt and every token but the last the model writes
        require(offset == 0, f"offset={offset} with positions given: the positions say where each token is")
        require(
            positions.dim() == 1 and positions.shape[0] >= read,
            f"positions of shape {tuple(positions.shape)}: give (T + steps - 1,) = ({read},) or longer",
        )


def prompt_indices(
    prompt: Tensor,
    structure: Sequence[IndexTracker] | None,
    sentence: Tensor | None,
    paragraph: Tensor | None,
) -> Indices:
    """The prompt's sentence and paragraph indices (B, T), after seeding (given) or extending (replayed)
    every row's tracker with them; (None, None) without trackers."""
    given = sentence is not None or paragraph is not None
    if structure is None:
        require(not given, "prompt indices without trackers: pass structure=, else new tokens have none")
        return None, None
    require(len(structure) == prompt.shape[0], f"{len(structure)} trackers for {prompt.shape[0]} rows")
    if not given:
        replayed = [tracker.extend(ids) for tracker, ids in zip(structure, prompt.tolist(), strict=True)]
        return as_indices(replayed, prompt.device)
    if sentence is None or paragraph is None:
        raise ConfigError("pass both sentence and paragraph, or neither")
    require(sentence.shape == prompt.shape == paragraph.shape, "prompt indices: one per prompt token")
    rows = zip(structure, prompt.tolist(), sentence.tolist(), paragraph.tolist(), strict=True)
    for tracker, ids, s, p in rows:
        tracker.seed(ids, s, p)
    return sentence, paragraph


def next_indices(token: Tensor, structure: Sequence[IndexTracker] | None) -> Indices:
    """The new tokens' (B, 1) sentence and paragraph indices, from every row's tracker; None without."""
    if structure is None:
        return None, None
    rows = [tracker.extend(ids) for tracker, ids in zip(structure, token.tolist(), strict=True)]
    return as_indices(rows, token.device)


def as_indices(rows: list[tuple[list[int], list[int]]], device: torch.device) -> Indices:
    """Per-row (sentence, paragraph) lists -> two (B, c) long tensors on `device`."""
    sentence = torch.tensor([row[0] for row in rows], dtype=torch.long, device=device)  # (B, c)
    paragraph = torch.tensor([row[1] for row in rows], dtype=torch.long, device=device)  # (B, c)
    return sentence, paragraph


@contextlib.contextmanager
def evaluating(model: DecoderLM) -> Iterator[None]:
    """The model in eval mode for the block; back in training mode after, if it was."""
    training = model.training
    model.eval()
    try:
        yield
    finally:
        if training:
            model.train()


__all__ = ["choose_next", "generate", "prefill", "step_by_step_full"]
