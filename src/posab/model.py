"""A GPT-style decoder: token embedding, N pre-norm blocks, final norm, tied LM head.

The model never names an encoding nor an attention form: it calls the encoding's `embed` and `rotate`,
and attends with the form the encoding gives for the pass (`Encoding.attention_form`, per layer `layer_form`),
built once per forward pass and shared by all layers. There is no length cap: a model trained at 512 runs
at any length. With a `KVCache` the model decodes: each call adds its tokens to the cache, and their
queries attend to every cached key through the same encoding's form over all the keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posab.cache import KVCache, LayerCache
from posab.encodings import INIT_STD, Encoding, Positions
from posab.encodings.base import READS_POSITIONS, reads_given_positions
from posab.errors import ConfigError, require, require_positive
from posab.forms import AttentionInputs, Form
from posab.layers import CANON_PLACES, Canon, ScalableSoftmax, canon_at

BACKENDS = ("sdpa", "flex")
Observer = Callable[[AttentionInputs], None]  # called by each layer, in order, with what it attends from


@dataclass
class ModelConfig:
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4
    dropout: float = 0.0
    attention: str = "sdpa"  # CPU: sdpa | flex (FlexAttention in evaluation); elsewhere each form's own path
    window: int | None = None  # sliding-window attention in every layer (each query sees W keys), or None
    ssmax: bool = False  # scalable softmax in every layer (`layers.ScalableSoftmax`), with any encoding
    canon: str = ""  # Canon layers at these places of every block, a subset of "ABCD" (`layers.Canon`)
    canon_kernel: int = 4  # the tokens each Canon layer mixes (the reference's default)

    def validate(self) -> None:
        require_positive("model", self, ("d_model", "n_layers", "n_heads", "mlp_ratio"))
        require(self.attention in BACKENDS, f"model.attention={self.attention!r}: use sdpa or flex")
        require(
            self.d_model % self.n_heads == 0,
            f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}",
        )
        require(0 <= self.dropout < 1, f"model.dropout={self.dropout} must be in [0, 1)")
        window_ok = self.window is None or (isinstance(self.window, int) and self.window >= 1)
        require(
            window_ok, f"model.window={self.window!r}: use null (full causal attention) or an integer >= 1"
        )
        places = str(self.canon or "")
        require(
            set(places) <= set(CANON_PLACES) and len(set(places)) == len(places),
            f"model.canon={self.canon!r}: name each place at most once, from {CANON_PLACES} (A: before "
            "attention, B: on q, k, v, C: before the MLP, D: inside it), e.g. AC or ABCD; empty for none",
        )
        require(self.canon_kernel >= 2, f"model.canon_kernel={self.canon_kernel}: use an integer >= 2 (4)")


@dataclass
class LayerContext:
    """What every layer's attention shares in one forward pass: built once by `DecoderLM.forward`."""

    encoding: Encoding  # rotates each layer's queries and keys; gives each layer its form
    pos: Positions  # of this call's tokens (in a cached decoding step: the new ones)
    form: Form  # how position enters attention in this pass (`Encoding.attention_form`)
    observe: Observer | None  # called by each layer with its `AttentionInputs`, or None


def attention_dtype(x: Tensor) -> torch.dtype:
    """The dtype q and k will have: the autocast dtype when autocast is on, else x's (also on a device
    autocast does not know, such as `meta`)."""
    kind = x.device.type
    if torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return x.dtype


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int, train_len: int) -> None:
        super().__init__()
        self.index = index  # the layer's place in the stack (an encoding may hold a module per layer)
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.dropout = cfg.dropout
        self.backend = cfg.attention
        self.ssmax = ScalableSoftmax(cfg.n_heads, train_len, cfg.window) if cfg.ssmax else None
        self.canon = canon_at("B", cfg.canon, 3 * cfg.d_model, cfg.canon_kernel)  # on q, k and v

    def queries_keys_values(
        self, x: Tensor, encoding: Encoding, pos: Positions, cache: LayerCache | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x: (B, T, C) -> q, k (rotated by the encoding) and v: 3 x (B, H, T, D)."""
        b, t, c = x.shape
        qkv = self.qkv(x)  # (B, T, 3C)
        if self.canon is not None:
            qkv = self.canon(qkv, cache)
        qkv = qkv.view(b, t, 3, self.n_heads, c // self.n_heads)  # (B, T, 3C) -> (B, T, 3, H, D)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, T, D)
        q, k = encoding.rotate(q, k, pos, self.index)
        return q, k, v

    def forward(self, x: Tensor, layer: LayerContext, cache: LayerCache | None = None) -> Tensor:
        """x: (B, c, C) -> (B, c, C); with a `cache`, the new keys and values are appended to it and the
        queries attend to all of them. `layer.observe`, when set, receives q, k and the layer's form."""
        b, t, c = x.shape
        q, k, v = self.queries_keys_values(x, layer.encoding, layer.pos, cache)  # 3 x (B, H, c, D)
        if cache is not None:
            cache.extend(k, v)
        form = layer.encoding.layer_form(layer.form, self.index, x, cache)  # may rewrite the cached keys
        if cache is not None:
            k, v = cache.cached()  # 2 x (B, H, n, D)
        if self.ssmax is not None:
            q = self.ssmax(q, k.shape[-2])
        if layer.observe is not None:
            layer.observe(AttentionInputs(q, k, form))
        dropout = self.dropout if self.training else 0.0
        y = form.attend(q, k, v, dropout, self.backend)  # (B, H, c, D)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))  # (B, H, c, D) -> (B, c, C)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=False)
        self.down = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=False)
        self.canon = canon_at("D", cfg.canon, cfg.mlp_ratio * cfg.d_model, cfg.canon_kernel)  # before GELU

    def forward(self, x: Tensor, cache: LayerCache | None = None) -> Tensor:
        hidden = self.up(x)  # (B, T, 4C)
        if self.canon is not None:
            hidden = self.canon(hidden, cache)
        return self.down(F.gelu(hidden))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int, train_len: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg, index, train_len)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        self.canon_a = canon_at("A", cfg.canon, cfg.d_model, cfg.canon_kernel)  # before attention
        self.canon_c = canon_at("C", cfg.canon, cfg.d_model, cfg.canon_kernel)  # before the MLP

    def forward(self, x: Tensor, layer: LayerContext, cache: LayerCache | None = None) -> Tensor:
        x = x + self.drop(self.attn(mixed(self.canon_a, self.norm1(x), cache), layer, cache))
        return x + self.drop(self.mlp(mixed(self.canon_c, self.norm2(x), cache), cache))


def mixed(canon: Canon | None, x: Tensor, cache: LayerCache | None) -> Tensor:
    """x through a Canon layer, or x where there is none."""
    return x if canon is None else canon(x, cache)


class DecoderLM(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int, encoding: Encoding) -> None:
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, cfg.d_model)
        self.encoding = encoding
        train_len = encoding.dims.train_len
        self.blocks = nn.ModuleList(Block(cfg, index, train_len) for index in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        self.head.weight = self.embed.weight  # tied
        self._init_weights()
        self._form_cache: dict[tuple[int, torch.dtype, torch.device], Form] = {}

    def _init_weights(self) -> None:
        """GPT-2 initialisation (std INIT_STD); residual projections scaled by 1/sqrt(2 * n_layers)."""
        for name, param in self.named_parameters():
            if name.startswith("encoding."):
                continue
            if name.endswith("proj.weight") or name.endswith("down.weight"):
                nn.init.normal_(param, std=INIT_STD / math.sqrt(2 * self.cfg.n_layers))
            elif param.dim() == 2:
                nn.init.normal_(param, std=INIT_STD)

    def forward(
        self,
        tokens: Tensor,
        sentence: Tensor | None = None,
        paragraph: Tensor | None = None,
        offset: int | None = None,
        observe: Observer | None = None,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """tokens, sentence, paragraph: (B, c) -> logits (B, c, V). `offset`: the position of the first token
        (default 0, or with a non-empty `cache` the position after its last token); `observe` is called by
        every layer, in order, with the inputs of its attention (`AttentionInputs`); with a `cache` the
        tokens follow the cached ones and are added to it (cached decoding). `positions`: (c,) the tokens'
        positions, shared by the batch, instead of an offset (a task's coupled positions; encodings that
        read each token's position: `reads_given_positions`)."""
        pos = self._positions(tokens, sentence, paragraph, offset, cache, positions)
        x = self.encoding.embed(self.embed(tokens), pos)  # (B, c, C)
        keys = pos if cache is None else cache.keys_for(pos)
        layer = LayerContext(self.encoding, pos, self._form(keys, pos.length, attention_dtype(x)), observe)
        for index, block in enumerate(self.blocks):
            x = block(x, layer, None if cache is None else cache.layer(index))
        if cache is not None:
            cache.positions = keys
        return self.head(self.norm(x))

    def _positions(
        self,
        tokens: Tensor,
        sentence: Tensor | None,
        paragraph: Tensor | None,
        offset: int | None,
        cache: KVCache | None,
        given: Tensor | None,
    ) -> Positions:
        """The positions of `tokens` (`forward`): offset + arange(c), or `given`."""
        if given is None:
            start = self._offset(offset, cache)
            return Positions.build(tokens.shape[1], tokens.device, start, sentence, paragraph)
        name = type(self.encoding).__name__
        require(
            reads_given_positions(self.encoding),
            f"positions given to a {name} model ({self.encoding.kind} encoding): only encodings that read "
            f"each token's own position take them (kinds {', '.join(READS_POSITIONS)}, not wrapped: "
            "sinusoidal, learned, rope, xpos)",
        )
        require(offset is None, f"offset={offset} with positions given: give one of them")
        require(
            given.shape == tokens.shape[1:],
            f"positions of shape {tuple(given.shape)} for {tokens.shape[1]} tokens: give one per token, (c,)",
        )
        token, host = given.to(tokens.device), given.cpu()
        first, largest = int(host[0]), int(host.max())
        return Positions(token=token, first=first, sentence=sentence, paragraph=paragraph, largest=largest)

    @staticmethod
    def _offset(offset: int | None, cache: KVCache | None) -> int:
        """The first new token's position: `offset`, else 0 or the one after the cache's last."""
        following = 0 if cache is None or cache.positions is None else cache.positions.last + 1
        if offset is not None and cache is not None and cache.positions is not None and offset != following:
            raise ConfigError(
                f"offset={offset}: the cache's tokens end at position {following - 1}, so the next token is "
                f"at {following}; pass offset=None (or {following}) to continue, or start a new KVCache"
            )
        return following if offset is None else offset

    def _form(self, keys: Positions, queries: int, dtype: torch.dtype) -> Form:
        """The pass's attention form; without gradients, over a whole window, that of an encoding whose form
        depends only on the length (`static_form`) is cached per length (cleared by `train()`)."""
        if not self.encoding.static_form or torch.is_grad_enabled() or queries != keys.length:
            return self.encoding.attention_form(keys, queries, dtype)
        key = (queries, dtype, keys.token.device)
        if key not in self._form_cache:
            self._form_cache[key] = self.encoding.attention_form(keys, queries, dtype)
        return self._form_cache[key]

    def train(self, mode: bool = True) -> DecoderLM:
        self._form_cache.clear()  # the parameters may change: never serve a stale bias
        return super().train(mode)

    def parameter_counts(self) -> dict[str, int]:
        """Total, encoding and non-embedding parameter counts (tied head counted once)."""
        total = sum(p.numel() for p in self.parameters())
        encoding = sum(p.numel() for p in self.encoding.parameters())
        return {"total": total, "encoding": encoding, "non_embedding": total - self.embed.weight.numel()}
