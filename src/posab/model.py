"""A GPT-style decoder: token embedding, N pre-norm blocks, final norm, tied LM head.

The model never names an encoding: it calls the encoding's `embed`, `rotate` and `bias` hooks. The
attention mask (causal mask plus the encoding's bias) is built once per forward pass and shared by all
layers. There is no length cap: a model trained at 512 runs at any length.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posab.attention import AttentionInputs, attention, causal_mask, full_mask
from posab.encodings import INIT_STD, BiasFactors, Encoding, Positions
from posab.errors import require, require_positive

BACKENDS = ("sdpa", "flex")
Observer = Callable[[AttentionInputs], None]  # called by each layer, in order, with what it attends from


@dataclass
class ModelConfig:
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4
    dropout: float = 0.0
    attention: str = "sdpa"  # sdpa | flex (FlexAttention on GPUs, and in evaluation on the CPU)

    def validate(self) -> None:
        require_positive("model", self, ("d_model", "n_layers", "n_heads", "mlp_ratio"))
        require(self.attention in BACKENDS, f"model.attention={self.attention!r}: use sdpa or flex")
        require(
            self.d_model % self.n_heads == 0,
            f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}",
        )
        require(0 <= self.dropout < 1, f"model.dropout={self.dropout} must be in [0, 1)")


@dataclass
class LayerContext:
    """What every layer's attention shares in one forward pass: built once by `DecoderLM.forward`."""

    encoding: Encoding
    pos: Positions
    mask: Tensor | None  # (1|B, H, T, T) additive, causal part included, or None (causal only)
    scale: Tensor | None  # (1|B, H, T, T) multiplies q.k / sqrt(D) before the mask, or None
    factors: BiasFactors | None  # a per-sample bias of low rank (the hierarchical levels), or None
    whole: Tensor | None  # (B, H, T, T) mask + the factors' product, no gradient (with factors only)
    observe: Observer | None  # called by each layer with its `AttentionInputs`, or None


def attention_mask(bias: Tensor | None, length: int, dtype: torch.dtype) -> Tensor | None:
    """Additive float mask (1|B, H, T, T) holding the causal mask and the bias; None when there is no bias."""
    if bias is None:
        return None
    return (bias + causal_mask(length, bias.device)).to(dtype)


def attention_dtype(x: Tensor) -> torch.dtype:
    """The dtype q and k will have: the autocast dtype when autocast is on, else x's."""
    device_type = x.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int) -> None:
        super().__init__()
        self.index = index  # the layer's place in the stack (an encoding may hold a module per layer)
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.dropout = cfg.dropout
        self.backend = cfg.attention

    def queries_keys_values(
        self, x: Tensor, encoding: Encoding, pos: Positions
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x: (B, T, C) -> q, k (rotated by the encoding) and v: 3 x (B, H, T, D)."""
        b, t, c = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.n_heads, c // self.n_heads)  # (B, T, 3C) -> (B, T, 3, H, D)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, T, D)
        q, k = encoding.rotate(q, k, pos)
        return q, k, v

    def forward(self, x: Tensor, layer: LayerContext) -> Tensor:
        """x: (B, T, C) -> (B, T, C); `layer.observe`, when set, receives q, k, the whole mask and scale."""
        b, t, c = x.shape
        q, k, v = self.queries_keys_values(x, layer.encoding, layer.pos)  # 3 x (B, H, T, D)
        mixer = layer.encoding.score_mixer(self.index)  # None but for DAPE
        if layer.observe is not None:
            mask = layer.mask if layer.whole is None else layer.whole
            layer.observe(AttentionInputs(q, k, mask, layer.scale, mixer))
        dropout = self.dropout if self.training else 0.0
        y = attention(
            q, k, v, layer.mask, dropout, self.backend, layer.scale, layer.factors, layer.whole, mixer
        )  # (B, H, T, D)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))  # (B, H, T, D) -> (B, T, C)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=False)
        self.down = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg, index)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, layer: LayerContext) -> Tensor:
        x = x + self.drop(self.attn(self.norm1(x), layer))
        return x + self.drop(self.mlp(self.norm2(x)))


class DecoderLM(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int, encoding: Encoding) -> None:
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, cfg.d_model)
        self.encoding = encoding
        self.blocks = nn.ModuleList(Block(cfg, index) for index in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        self.head.weight = self.embed.weight  # tied
        self._init_weights()
        self._mask_cache: dict[tuple[int, torch.dtype, torch.device], Tensor] = {}

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
        offset: int = 0,
        observe: Observer | None = None,
    ) -> Tensor:
        """tokens, sentence, paragraph: (B, T) -> logits (B, T, V). `offset` shifts every token position;
        `observe` is called by every layer, in order, with the inputs of its attention (`AttentionInputs`)."""
        _, t = tokens.shape
        pos = Positions.build(t, tokens.device, offset, sentence, paragraph)
        x = self.encoding.embed(self.embed(tokens), pos)  # (B, T, C)
        mask = self._mask(pos, attention_dtype(x))
        scale = self.encoding.score_scale(pos)  # (1|B, H, T, T) or, for most encodings, None
        factors = self.encoding.bias_factors(pos)  # None but for the hierarchical bias
        with torch.no_grad():  # built once for every layer; gradients reach the factors in `attention`
            whole = None if factors is None else full_mask(mask, factors, attention_dtype(x))
        layer = LayerContext(self.encoding, pos, mask, scale, factors, whole, observe)
        for block in self.blocks:
            x = block(x, layer)
        return self.head(self.norm(x))

    def _mask(self, pos: Positions, dtype: torch.dtype) -> Tensor | None:
        """The attention mask, built once per forward pass; without gradients, an encoding whose bias depends
        only on the length (`static_bias`) has its mask cached per length (cleared by `train()`)."""
        if not self.encoding.static_bias or torch.is_grad_enabled():
            return attention_mask(self.encoding.bias(pos), pos.length, dtype)
        key = (pos.length, dtype, pos.token.device)
        if key not in self._mask_cache:
            self._mask_cache[key] = attention_mask(self.encoding.bias(pos), pos.length, dtype)
        return self._mask_cache[key]

    def train(self, mode: bool = True) -> DecoderLM:
        self._mask_cache.clear()  # the parameters may change: never serve a stale bias
        return super().train(mode)

    def parameter_counts(self) -> dict[str, int]:
        """Total, encoding and non-embedding parameter counts (tied head counted once)."""
        total = sum(p.numel() for p in self.parameters())
        encoding = sum(p.numel() for p in self.encoding.parameters())
        return {"total": total, "encoding": encoding, "non_embedding": total - self.embed.weight.numel()}
