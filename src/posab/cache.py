"""The key/value cache of decoding: every layer's decoding state (`LayerCache`: its rotated keys and values,
and what the encoding keeps of the layer, a typed `EncodingState`), and the positions of every cached token,
from which each step's attention form is built (`Encoding.attention_form` over all the keys): the bias by
distance, the sentence and paragraph levels, the query-dependent normalisers. Nothing about a form is
cached, so a step attends exactly as a full forward pass over the same tokens would.

Each step, the layer appends its new keys and values (`LayerCache.extend`) and then asks the encoding for
its form with the layer's `LayerCache` (`Encoding.layer_form`), so an encoding may read the cached keys,
rewrite them in place before the step attends (a method that transforms every cached key at each step),
and keep its own state over the keys in `state_for` (FoX: the running sums of its log forget gates)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from torch import Tensor

from posab.positions import Positions


class EncodingState:
    """What an encoding keeps of one layer between decoding steps, beside its keys and values: subclass it
    (a dataclass whose fields all have defaults) and read it with `LayerCache.state_for`."""


State = TypeVar("State", bound=EncodingState)


@dataclass
class LayerCache:
    """One layer's decoding state: its keys and values so far, in buffers that double when full (amortised
    O(1) copying per decoded token; growing by concatenation copies the whole cache at every step), the
    encoding's own state of the layer (`state_for`), and the block's Canon layers' last inputs
    (`posab.layers.Canon`)."""

    keys: Tensor | None = None  # (B, H, capacity, D)
    values: Tensor | None = None  # (B, H, capacity, D)
    length: int = 0  # the cached tokens: keys[:, :, :length]
    encoding_state: EncodingState | None = None  # the encoding's own (`state_for`), None until first used
    recent: dict[str, Tensor] = field(default_factory=dict)  # Canon layers' last inputs, by place (B, K-1, C)

    def state_for(self, kind: type[State]) -> State:
        """The encoding's state of this layer, of type `kind`: made (with its defaults) on first use."""
        if self.encoding_state is None:
            self.encoding_state = kind()
        if not isinstance(self.encoding_state, kind):
            raise TypeError(
                f"this layer's cache holds a {type(self.encoding_state).__name__}, not a {kind.__name__}"
            )
        return self.encoding_state

    def cached(self) -> tuple[Tensor, Tensor]:
        """Every key and value so far: (B, H, n, D) views of the buffers (writing to them rewrites the
        cache)."""
        if self.keys is None or self.values is None:
            raise ValueError("an empty layer cache: extend it first")
        return self.keys[:, :, : self.length], self.values[:, :, : self.length]

    def extend(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Append the new tokens' (B, H, c, D) keys and values; returns every key and value so far,
        (B, H, n, D) views of the buffers."""
        end = self.length + keys.shape[2]
        if self.keys is None or end > self.keys.shape[2]:
            self._grow(keys, values, max(end, 2 * self.length))
        self.keys[:, :, self.length : end] = keys
        self.values[:, :, self.length : end] = values
        self.length = end
        return self.cached()

    def _grow(self, keys: Tensor, values: Tensor, capacity: int) -> None:
        """New buffers of `capacity` tokens, shaped and typed as the new keys and values, holding the old."""
        shape = (*keys.shape[:2], capacity, keys.shape[3])  # (B, H, capacity, D)
        old_keys, old_values = self.keys, self.values
        self.keys = keys.new_empty(shape)
        self.values = values.new_empty((*shape[:3], values.shape[3]))
        if old_keys is not None and old_values is not None:
            self.keys[:, :, : self.length] = old_keys[:, :, : self.length]
            self.values[:, :, : self.length] = old_values[:, :, : self.length]


@dataclass
class KVCache:
    """What a decoder has seen: `DecoderLM.forward(tokens, cache=cache)` appends to it."""

    layers: list[LayerCache] = field(default_factory=list)
    positions: Positions | None = None  # of every cached token

    @property
    def length(self) -> int:
        return 0 if self.positions is None else self.positions.length

    def layer(self, index: int) -> LayerCache:
        while len(self.layers) <= index:
            self.layers.append(LayerCache())
        return self.layers[index]

    def keys_for(self, new: Positions) -> Positions:
        """The positions of every key of a step that adds the tokens at `new`."""
        return new if self.positions is None else self.positions.extend(new)

    def nbytes(self) -> int:
        """Bytes held by the key and value buffers (their capacity) and the positions."""
        tensors = [t for layer in self.layers for t in (layer.keys, layer.values) if t is not None]
        if self.positions is not None:
            pos = self.positions
            tensors += [t for t in (pos.token, pos.sentence, pos.paragraph) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)
