"""T5 relative position bias (Raffel et al., 2020), causal bucketing.

b_h(i, j) = W[bucket(i - j), h] * g, with W a learned (num_buckets, H) table. `init`:
- `xtransformers` (default): W ~ N(0, 1) and g = sqrt(d_head), x-transformers' RelativePositionBias
  (lucidrains/x-transformers, `scale = dim_head ** 0.5`): the biases start at std sqrt(d_head) (5.7 at
  d_head 32, ALiBi's order) and each Adam step moves them by up to ~lr * sqrt(d_head).
- `gpt2`: W ~ N(0, INIT_STD^2) and g = 1, the form every run used before `init` existed: under Adam a
  bias moves at most ~lr per step (~0.33 summed over a 200-step schedule), far from ALiBi's range.
- `hf` (issue 58): W ~ N(0, d_model^-1/2) and g = 1, Hugging Face's T5 (`T5PreTrainedModel._init_weights`:
  `relative_attention_bias` normal with std factor * d_model ** -0.5, factor 1).
`scale_logits: false` (issue 58) drops the logits' 1/sqrt(d_head), as T5 itself does (Mesh TensorFlow's
attention, Hugging Face's `T5Attention`: scores = q k^T, the scale folded into q's initialisation): the
queries are multiplied by sqrt(d_head) before attention divides by it, so the logits are q . k. The model's
q, k, v initialisation stays GPT-2's (every encoding's), so this variant isolates the logits' scale.
bucket(n) for n = max(i - j, 0), as in the T5 code's `_relative_position_bucket(bidirectional=False)`:
with e = num_buckets // 2, n < e -> n (exact); otherwise
e + floor(ln(n / e) / ln(max_distance / e) * (num_buckets - e)), capped at num_buckets - 1 (every distance
from max_distance on shares the last bucket). Future distances (j > i, masked anyway) fall in bucket 0.
Buckets are computed on the 2L-1 distinct distances, then gathered into the (H, L, L) Toeplitz matrix.
"""

import math

import torch
from torch import Tensor, nn

from posab.encodings.base import INIT_STD, Dims, Encoding, Kind, Positions
from posab.errors import ConfigError
from posab.forms import Form

INITS = ("xtransformers", "gpt2", "hf")


def t5_buckets(distance: Tensor, num_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """(N,) query-minus-key distances i - j -> (N,) int64 bucket ids in [0, num_buckets)."""
    n = distance.clamp(min=0).float()  # future distances -> 0
    exact = num_buckets // 2
    # clamp inside the log only to avoid log(0) on the exact branch, which `where` discards
    scaled = torch.log(n.clamp(min=exact) / exact) / math.log(max_distance / exact) * (num_buckets - exact)
    large = (exact + scaled.long()).clamp(max=num_buckets - 1)
    return torch.where(n < exact, n.long(), large)


class T5Bias(Encoding):
    kind = Kind.DISTANCE_BIAS
    relative_only = True
    static_form = True

    def __init__(
        self,
        dims: Dims,
        num_buckets: int = 32,
        max_distance: int = 128,
        init: str = "xtransformers",
        scale_logits: bool = True,
    ) -> None:
        super().__init__(dims)
        if num_buckets < 2 or max_distance <= num_buckets // 2:
            raise ConfigError(
                f"t5 bias needs num_buckets >= 2 and max_distance > num_buckets // 2; "
                f"got num_buckets={num_buckets}, max_distance={max_distance}"
            )
        if init not in INITS:
            raise ConfigError(f"t5 init={init!r}: use one of {list(INITS)}")
        self.num_buckets, self.max_distance = num_buckets, max_distance
        std = {"xtransformers": 1.0, "gpt2": INIT_STD, "hf": dims.d_model**-0.5}[init]
        self.table = nn.Parameter(torch.randn(num_buckets, dims.n_heads) * std)  # (num_buckets, H)
        self.gain = math.sqrt(dims.head_dim) if init == "xtransformers" else 1.0  # g
        self.query_scale = 1.0 if scale_logits else math.sqrt(dims.head_dim)  # undoes attention's 1/sqrt(d)

    def rotate(self, q: Tensor, k: Tensor, pos: Positions, layer: int = 0) -> tuple[Tensor, Tensor]:
        """q times sqrt(d_head) with `scale_logits: false` (the logits q . k), else q and k as they are."""
        return (q, k) if self.query_scale == 1.0 else (q * self.query_scale, k)

    def attention_form(self, pos: Positions, queries: int, dtype: torch.dtype) -> Form:
        return self.distance_form(pos, queries, dtype)

    def distance_bias(self, distance: Tensor) -> Tensor:
        """(D,) query-minus-key distances -> (H, D) the bias W[bucket(d), h] * g (read by the audit)."""
        buckets = t5_buckets(distance, self.num_buckets, self.max_distance)  # (D,)
        return (self.table[buckets] * self.gain).transpose(0, 1)  # (D, H) -> (H, D)
