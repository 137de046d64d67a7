"""Device placement without a GPU: every encoding's forward, backward and cached decoding with the model on
torch's `meta` device. There a tensor made on the CPU inside the model meets the model's meta tensors and
is an error, and so is any read of a tensor on the host (`int(t)`, `t.item()`: on a GPU, a
synchronisation in every forward pass), so passing here means neither happens in the model.

One path has no meta kernel and reads back on purpose: the multi-scale bias's `input=fire` past the
training length runs its MLP on the distinct (query, distance) inputs (`torch.unique`); it is an
evaluation-only path and is checked on the CPU (tests/test_cache_equivalence.py)."""

from __future__ import annotations

import pytest
import torch

from conftest import CASES, text_like, tiny_model
from posab.cache import KVCache
from posab.model import attention_dtype

META = torch.device("meta")


def on_meta(encoding: str, override: str | None) -> torch.nn.Module:
    return tiny_model(encoding, *([override] if override else [])).to(META)


@pytest.mark.parametrize(("encoding", "override"), CASES)
def test_forward_backward_and_cached_decoding_on_the_meta_device(encoding: str, override: str | None) -> None:
    model = on_meta(encoding, override)
    tokens, sentence, paragraph = (t.to(META) for t in text_like(40))
    model.train()
    logits = model(tokens, sentence, paragraph)  # (B, T, V)
    logits.float().logsumexp(-1).mean().backward()
    assert logits.device == META and logits.shape[:2] == (2, 40)
    assert all(p.grad is not None and p.grad.device == META for p in model.parameters() if p.requires_grad)
    model.eval()
    with torch.no_grad():
        cache = KVCache()
        model(tokens[:, :30], sentence[:, :30], paragraph[:, :30], offset=5, cache=cache)
        step = model(tokens[:, 30:31], sentence[:, 30:31], paragraph[:, 30:31], cache=cache)
        assert step.device == META and cache.length == 31
        if override != "encoding.input=fire":  # torch.unique past the training length (module docstring)
            assert model(tokens, sentence, paragraph, offset=1000).device == META


def test_a_cpu_tensor_inside_the_model_is_an_error_on_meta() -> None:
    """What the test above relies on: a CPU tensor meeting a meta tensor fails (it is not silently moved)."""
    with pytest.raises((RuntimeError, NotImplementedError)):
        torch.zeros(3, device=META) + torch.ones(3)
    with pytest.raises((RuntimeError, NotImplementedError)):
        int(torch.zeros(3, device=META).max())


def test_attention_dtype_on_a_device_autocast_does_not_know() -> None:
    assert attention_dtype(torch.zeros(2, device=META, dtype=torch.float16)) == torch.float16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert attention_dtype(torch.zeros(2)) == torch.bfloat16
