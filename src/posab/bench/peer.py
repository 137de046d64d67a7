"""Section 4: posab's training step against x-transformers' (the `bench` extra) with the same sizes, both
through the same `Trainer.step`: rope vs rotary_pos_emb, alibi vs alibi_pos_bias, multiscale vs
dynamic_pos_bias; ratio posab / x-transformers."""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
from torch import Tensor, nn

from posab.bench.inputs import posab_model
from posab.bench.measure import median_times
from posab.bench.output import Result
from posab.bench.progress import Progress
from posab.bench.settings import Settings
from posab.bench.steps import training_step
from posab.config import Config
from posab.data.tokenizer import VOCAB_SIZE

PEERS = {"rope": "rotary_pos_emb", "alibi": "alibi_pos_bias", "multiscale": "dynamic_pos_bias"}


class TokensOnly(nn.Module):
    """A model that takes only tokens, called as posab's: model(inputs, sentence, paragraph) -> logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, inputs: Tensor, sentence: Tensor | None = None, paragraph: Tensor | None = None
    ) -> Tensor:
        return self.model(inputs)  # (B, T) -> (B, T, V)


def peer_model(option: str, cfg: Config) -> nn.Module:
    """x-transformers' decoder with posab's sizes: d, depth, heads, head dim, FF ratio, no FF bias, tied
    embedding, no absolute positions; `option` its positional encoding. Flash attention except for
    dynamic_pos_bias, which x-transformers does not allow with it. Rotary over the full head dimension,
    as posab's RoPE."""
    from x_transformers import Decoder, TransformerWrapper

    m = cfg.model
    head_dim = m.d_model // m.n_heads
    extra: dict[str, Any] = {"rotary_emb_dim": head_dim} if option == "rotary_pos_emb" else {}
    layers = Decoder(
        dim=m.d_model,
        depth=m.n_layers,
        heads=m.n_heads,
        attn_dim_head=head_dim,
        ff_mult=m.mlp_ratio,
        ff_no_bias=True,
        attn_flash=option != "dynamic_pos_bias",
        **{option: True},
        **extra,
    )
    torch.manual_seed(0)
    return TransformerWrapper(
        num_tokens=VOCAB_SIZE,
        max_seq_len=cfg.train.seq_len,
        attn_layers=layers,
        use_abs_pos_emb=False,
        tie_embedding=True,
    )


def peer_available() -> bool:
    """Whether x-transformers (the `bench` extra) is installed."""
    return importlib.util.find_spec("x_transformers") is not None


def section(settings: Settings, progress: Progress) -> Result:
    result = Result("section4_x_transformers", "4. Training step: posab vs x-transformers")
    if not peer_available():
        result.skipped = "x-transformers is not installed (pip install -e '.[bench]'); section 4 skipped"
        return result
    for name, option in progress.over(list(PEERS.items()), "section 4"):
        result.rows.append(peer_row(name, option, settings.config(name), settings))
    return result


def peer_row(name: str, option: str, cfg: Config, settings: Settings) -> dict[str, Any]:
    """Both libraries' training steps with encoding `name` and x-transformers' `option`, interleaved."""
    ours, theirs = posab_model(cfg), TokensOnly(peer_model(option, cfg))
    steps = [training_step(ours, cfg), training_step(theirs, cfg)]
    times = median_times(steps, settings.warmup, settings.repeats)
    return {
        "posab": name,
        "x_transformers": option,
        "posab_step_s": times[0],
        "x_transformers_step_s": times[1],
        "ratio": times[0] / times[1],
        "posab_params": sum(p.numel() for p in ours.parameters()),
        "x_transformers_params": sum(p.numel() for p in theirs.parameters()),
    }
