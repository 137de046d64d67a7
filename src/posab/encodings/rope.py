"""RoPE (Su et al., 2021): rotate each (q, k) channel pair by angle p * base^(-2i/D).

Applied over the first `rotary_dim` channels of each head (the full head dimension by default). The
cos/sin table is cached and grown to the largest position seen; it is indexed by position value, so
offset positions are honoured.

p-RoPE (Barbero et al., ICLR 2025, "Round and Round We Go! What makes Rotary Positional Encodings
useful?", section 6, `apply_p_rope`): `fraction` p keeps the int(p R / 2) highest frequencies of the full
spectrum, theta_c = base^(-2c/R) for c < int(p R / 2), and sets the others to 0, so their channels are not
rotated (NoPE channels beside RoPE ones). Unlike a smaller `rotary_dim`, which spreads a whole spectrum
over fewer channels, the kept frequencies are RoPE's own. p = 1 is RoPE.

Context extension at evaluation (`RoPE.scaled`), with s the scale factor (evaluation length / training
length), R = rotary_dim, theta_c = base^(-2c/R) for c = 0 .. R/2 - 1 and L the training length:

- `pi`, Position Interpolation (Chen et al., 2023, arXiv:2306.15595): f'(x, m) = f(x, m L / L'), i.e.
  positions m / s, i.e. every frequency theta_c / s.
- `ntk`, NTK-aware scaling (bloc97, 2023; as written in YaRN, Sec. 3.1): base' = base * s^(R / (R - 2)),
  theta'_c = base'^(-2c/R): the lowest frequency is interpolated by s, the highest is left as it is.
- `yarn` (Peng et al., 2023, "YaRN: Efficient Context Window Extension of Large Language Models",
  arXiv:2309.00071), the published formulas, with the paper's alpha = 1, beta = 32:
  NTK-by-parts (Sec. 3.2): wavelength lambda_c = 2 pi / theta_c, ratio r(c) = L / lambda_c,
  ramp gamma(r) = 0 if r < alpha, 1 if r > beta, (r - alpha) / (beta - alpha) otherwise, and
  h(theta_c) = (1 - gamma(r(c))) theta_c / s + gamma(r(c)) theta_c;
  attention scaling (Sec. 3.4): softmax(q^T k / (t sqrt(D))) with sqrt(1/t) = 0.1 ln(s) + 1, applied by
  multiplying q and k (all head channels) by sqrt(1/t), so the logits are scaled by (0.1 ln s + 1)^2.
  The ramp is linear in r, as in the paper (the reference code ramps linearly over dimension indices
  between rounded correction dimensions, which gives slightly different frequencies).

At s = 1 every method is plain RoPE exactly: theta / 1, base * 1^x, theta / 1 + gamma (theta - theta) and
0.1 ln 1 + 1 = 1 are exact in floating point.

Trained with a scaling (`scaling`, `scaling_factor`, `original_len`: the context-extension stage, a run
continued at s times its length, `train.init_from`): the method's frequencies and attention factor are the
encoding's own from the start, computed for the first stage's length L = `original_len`, as PI and YaRN
fine-tune (Chen et al., 2023, section 3; Peng et al., 2023, section 4); such an encoding offers no
evaluation-time variants.
"""

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from posab.encodings.base import CONTEXT_EXTENSIONS, Dims, Encoding, Kind, Positions
from posab.errors import ConfigError

SCALINGS = ("none", *CONTEXT_EXTENSIONS)
YARN_ALPHA = 1.0  # ramp start, in rotations per training window (the paper's value)
YARN_BETA = 32.0  # ramp end


def rope_frequencies(base: float, rotary_dim: int) -> Tensor:
    """theta_c = base^(-2c/R), c = 0 .. R/2 - 1: (R/2,) float64."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
    return base**-exponents


def kept_frequencies(fraction: float, rotary_dim: int) -> Tensor:
    """p-RoPE's mask (R/2,) float64: 1 for the int(p R / 2) highest frequencies (c below it), 0 for the
    rest (the reference's `rope_angles = int(rope_percentage * head_dim // 2)`)."""
    kept = int(fraction * rotary_dim // 2)
    return (torch.arange(rotary_dim // 2) < kept).double()


def ntk_base(base: float, factor: float, rotary_dim: int) -> float:
    """NTK-aware base: base * s^(R / (R - 2)) (R > 2)."""
    return base * factor ** (rotary_dim / (rotary_dim - 2))


def yarn_ramp(ratio: Tensor, alpha: float = YARN_ALPHA, beta: float = YARN_BETA) -> Tensor:
    """gamma(r): 0 below alpha, 1 above beta, linear in between."""
    return ((ratio - alpha) / (beta - alpha)).clamp(0.0, 1.0)


def scaled_frequencies(kind: str, factor: float, base: float, rotary_dim: int, train_len: int) -> Tensor:
    """The frequencies (R/2,) float64 of a context-extension method at scale factor s (module docstring)."""
    theta = rope_frequencies(base, rotary_dim)
    if kind == "pi":
        return theta / factor
    if kind == "ntk":  # with R = 2 the one frequency is base^0 = 1 whatever the base
        return theta if rotary_dim == 2 else rope_frequencies(ntk_base(base, factor, rotary_dim), rotary_dim)
    if kind == "yarn":
        gamma = yarn_ramp(train_len * theta / (2 * math.pi))  # r = L / lambda, lambda = 2 pi / theta
        return theta / factor + gamma * (theta - theta / factor)  # = (1 - gamma) theta / s + gamma theta
    return theta


def attention_factor(kind: str, factor: float) -> float:
    """sqrt(1/t), the factor q and k are multiplied by: 0.1 ln(s) + 1 for YaRN, 1 otherwise."""
    return 0.1 * math.log(factor) + 1.0 if kind == "yarn" else 1.0


def check_scaling(scaling: str, factor: float) -> None:
    """A ConfigError unless `scaling` names a method (or none) and `factor` is >= 1."""
    if scaling not in SCALINGS or isinstance(factor, bool) or factor < 1:
        raise ConfigError(
            f"rope scaling={scaling!r}, scaling_factor={factor!r}: use a scaling of {', '.join(SCALINGS)} "
            "(the frequencies trained with: a context-extension stage) and a factor >= 1"
        )


def check_fraction(fraction: float, rotary_dim: int) -> None:
    """A ConfigError unless p-RoPE's `fraction` is in (0, 1] and keeps at least one frequency."""
    if isinstance(fraction, bool) or not 0 < fraction <= 1 or int(fraction * rotary_dim // 2) < 1:
        raise ConfigError(
            f"rope fraction={fraction!r}: the share of RoPE's frequencies p-RoPE keeps, in (0, 1], keeping "
            f"at least one of {rotary_dim // 2} (p >= {2 / rotary_dim:g}; the paper's: 0.25, 0.75; RoPE: 1)"
        )


class RoPE(Encoding):
    kind = Kind.ROTARY
    relative_only = True  # up to floating-point rounding of the angles
    variants = tuple(kind for kind in SCALINGS if kind != "none")  # context extensions at evaluation

    def __init__(
        self,
        dims: Dims,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        fraction: float = 1.0,
        scaling: str = "none",
        scaling_factor: float = 1.0,
        original_len: int | None = None,
    ) -> None:
        super().__init__(dims)
        self.rotary_dim = dims.head_dim if rotary_dim is None else rotary_dim
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= dims.head_dim:
            raise ConfigError(
                f"rope needs an even rotary dimension in (0, head_dim={dims.head_dim}], got {self.rotary_dim}"
                " (head_dim = model.d_model / model.n_heads)"
            )
        check_fraction(fraction, self.rotary_dim)
        check_scaling(scaling, scaling_factor)
        self.base, self.fraction, self.scaling = base, fraction, scaling
        length = dims.train_len if original_len is None else original_len  # YaRN's L: the first stage's
        self.attention_factor = attention_factor(scaling, scaling_factor)  # sqrt(1/t): YaRN's, else 1
        if scaling != "none":  # a scaling trained with (the extension stage): no evaluation-time variants
            self.variants = ()
        mask = kept_frequencies(fraction, self.rotary_dim)  # (R/2,): p-RoPE's kept frequencies
        self.register_buffer("frequency_mask", mask, persistent=False)
        frequencies = scaled_frequencies(scaling, scaling_factor, base, self.rotary_dim, length) * mask
        self.register_buffer("inv_freq", frequencies, persistent=False)  # (R/2,)
        self.register_buffer("cos_cached", torch.empty(0, self.rotary_dim), persistent=False)
        self.register_buffer("sin_cached", torch.empty(0, self.rotary_dim), persistent=False)

    @contextmanager
    def variant(self, kind: str, factor: float, train_len: int | None = None) -> Iterator[None]:
        """Run with a context-extension method (`none`, `pi`, `ntk` or `yarn`) at scale factor `factor`.

        Swaps in the method's frequencies and attention factor and an empty cos/sin cache; on exit the
        original frequencies, factor and cache are put back, so no table outlives the settings it was
        computed for. `train_len` (YaRN's L) defaults to the model's training length.
        """
        if kind not in SCALINGS:
            raise ValueError(f"unknown rope scaling {kind!r}; use one of {', '.join(SCALINGS)}")
        if self.scaling != "none":
            raise ValueError(f"rope trained with scaling={self.scaling!r}: its frequencies are its own")
        if factor < 1:
            raise ValueError(f"rope scaling factor {factor} must be >= 1")
        saved = self.inv_freq, self.cos_cached, self.sin_cached, self.attention_factor
        length = self.dims.train_len if train_len is None else train_len
        frequencies = scaled_frequencies(kind, factor, self.base, self.rotary_dim, length)
        frequencies = frequencies * self.frequency_mask.cpu()  # p-RoPE's removed frequencies stay 0
        self.inv_freq = frequencies.to(self.inv_freq.device)
        self.cos_cached = self.cos_cached[:0]  # (0, R)
        self.sin_cached = self.sin_cached[:0]  # (0, R)
        self.attention_factor = attention_factor(kind, factor)
        try:
            yield
        finally:
            self.inv_freq, self.cos_cached, self.sin_cached, self.attention_factor = saved

    def _grow(self, max_position: int) -> None:
        """Extend the tables to cover positions 0 .. max_position (doubling, to amortise growth)."""
        size = max(max_position + 1, 2 * self.cos_cached.shape[0])
        positions = torch.arange(size, dtype=torch.float64, device=self.inv_freq.device)
        angles = positions[:, None] * self.inv_freq[None, :]  # (P, R/2)
        self.cos_cached = torch.cat([angles.cos(), angles.cos()], dim=-1).float()  # (P, R)
        # the sign of rotate_half is folded into the table: rotate_half(x) * sin == roll(x) * signed_sin
        self.sin_cached = torch.cat([-angles.sin(), angles.sin()], dim=-1).float()  # (P, R)

    def tables(self, positions: Tensor, max_position: int | None = None) -> tuple[Tensor, Tensor]:
        """positions: (T,) non-negative, the largest `max_position` (read from `positions` when not given: a
        host synchronisation on an accelerator) -> cos, sin: (T, R)."""
        max_position = int(positions.max()) if max_position is None else max_position
        if max_position >= self.cos_cached.shape[0]:
            self._grow(max_position)
        return self.cos_cached[positions], self.sin_cached[positions]

    def rotate(self, q: Tensor, k: Tensor, pos: Positions, layer: int = 0) -> tuple[Tensor, Tensor]:
        cos, sin = self.tables(pos.token, pos.last)
        q, k = self._rotated(q, cos, sin), self._rotated(k, cos, sin)
        if self.attention_factor == 1.0:
            return q, k
        return q * self.attention_factor, k * self.attention_factor

    def _rotated(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """x: (B, H, T, D); cos, sin: (T, R)."""
        r = self.rotary_dim
        rot, rest = x[..., :r], x[..., r:]
        # x * cos + rotate_half(x) * sin, with rotate_half(x) = (-x2, x1) = roll(x) * (-1, +1)
        rotated = torch.addcmul(rot * cos.to(x.dtype), rot.roll(r // 2, dims=-1), sin.to(x.dtype))
        return torch.cat([rotated, rest], dim=-1) if rest.shape[-1] else rotated
