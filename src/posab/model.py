"""A GPT-style decoder: token embedding, N pre-norm blocks, final norm, tied LM head.

The model never names an encoding: it calls the encoding's `embed`, `rotate` and `bias` hooks. The
attention mask (causal mask plus the encoding's bias) is built once per forward pass and shared by all
layers. There is no length cap: a model trained at 512 runs at any length.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posab.attention import attention, causal_mask
from posab.config import ModelConfig
from posab.encodings import Encoding, Positions


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
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.dropout = cfg.dropout
        self.backend = cfg.attention

    def forward(
        self, x: Tensor, encoding: Encoding, pos: Positions, mask: Tensor | None, scale: Tensor | None = None
    ) -> Tensor:
        b, t, c = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.n_heads, c // self.n_heads)  # (B, T, 3, H, D)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, T, D)
        q, k = encoding.rotate(q, k, pos)
        dropout = self.dropout if self.training else 0.0
        y = attention(q, k, v, mask, dropout, self.backend, scale)  # (B, H, T, D)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))  # (B, H, T, D) -> (B, T, C)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=False)
        self.down = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(
        self, x: Tensor, encoding: Encoding, pos: Positions, mask: Tensor | None, scale: Tensor | None = None
    ) -> Tensor:
        x = x + self.drop(self.attn(self.norm1(x), encoding, pos, mask, scale))
        return x + self.drop(self.mlp(self.norm2(x)))


class DecoderLM(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int, encoding: Encoding) -> None:
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, cfg.d_model)
        self.encoding = encoding
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        self.head.weight = self.embed.weight  # tied
        self._init_weights()
        self._mask_cache: dict[tuple[int, torch.dtype, torch.device], Tensor] = {}

    def _init_weights(self) -> None:
        """GPT-2 initialisation; residual projections scaled by 1/sqrt(2 * n_layers)."""
        for name, param in self.named_parameters():
            if name.startswith("encoding."):
                continue
            if name.endswith("proj.weight") or name.endswith("down.weight"):
                nn.init.normal_(param, std=0.02 / math.sqrt(2 * self.cfg.n_layers))
            elif param.dim() == 2:
                nn.init.normal_(param, std=0.02)

    def forward(
        self,
        tokens: Tensor,
        sentence: Tensor | None = None,
        paragraph: Tensor | None = None,
        offset: int = 0,
    ) -> Tensor:
        """tokens, sentence, paragraph: (B, T) -> logits (B, T, V). `offset` shifts every token position."""
        _, t = tokens.shape
        pos = Positions.build(t, tokens.device, offset, sentence, paragraph)
        x = self.encoding.embed(self.embed(tokens), pos)  # (B, T, C)
        mask = self._mask(pos, attention_dtype(x))
        scale = self.encoding.score_scale(pos)  # (1|B, H, T, T) or, for most encodings, None
        for block in self.blocks:
            x = block(x, self.encoding, pos, mask, scale)
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
