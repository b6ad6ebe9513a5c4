"""The profiler's KV cache: every token's keys and values written once, in place.

    KVCache()        a transformers DynamicCache whose layers are GrowLayer
    GrowLayer        keys/values live in one buffer per layer with spare capacity; `update` writes the new
                     tokens into it and returns a view, `crop` shortens the view

transformers' DynamicLayer concatenates on every `update`, so each decode step and each prefill chunk
copies the whole cache (at 32K tokens, 18 layers of Gemma 3: 1.2 GB per step). Here a token's keys are
written once; the buffer doubles when full (amortised one copy). A crop only shortens the view, so the
tokens written after it overwrite the dropped ones: a view taken before a crop must not be read after the
next update (the profiler reads the cache only between steps, through `layer.keys` / `layer.values`).
"""

from __future__ import annotations

from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

_MIN_CAPACITY = 256


class GrowLayer(DynamicLayer):
    """A DynamicLayer whose keys and values are views of a buffer with spare capacity."""

    def lazy_initialization(self, key_states, value_states) -> None:
        super().lazy_initialization(key_states, value_states)
        self._kbuf = self._vbuf = None
        self._len = 0

    def _grow(self, need: int, key_states, value_states) -> None:
        cap = max(_MIN_CAPACITY, need, 2 * (0 if self._kbuf is None else self._kbuf.shape[-2]))
        kb = key_states.new_empty((*key_states.shape[:-2], cap, key_states.shape[-1]))
        vb = value_states.new_empty((*value_states.shape[:-2], cap, value_states.shape[-1]))
        if self._len:
            kb[..., :self._len, :].copy_(self._kbuf[..., :self._len, :])
            vb[..., :self._len, :].copy_(self._vbuf[..., :self._len, :])
        self._kbuf, self._vbuf = kb, vb

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self._len + key_states.shape[-2]
        if self._kbuf is None or n > self._kbuf.shape[-2]:
            self._grow(n, key_states, value_states)
        self._kbuf[..., self._len:n, :].copy_(key_states)
        self._vbuf[..., self._len:n, :].copy_(value_states)
        self._len = n
        self.keys, self.values = self._kbuf[..., :n, :], self._vbuf[..., :n, :]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._len if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens to remove, got {tokens_to_remove}")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        self._len = max(0, self._len + tokens_to_remove)
        self.keys, self.values = self._kbuf[..., :self._len, :], self._vbuf[..., :self._len, :]

    def reset(self) -> None:
        self._kbuf = self._vbuf = None
        self._len = 0
        super().reset()


class KVCache(DynamicCache):
    """DynamicCache() with GrowLayer layers (every layer full: a dual-token step must drop its speculative token
    from every layer, which a sliding-window layer cannot)."""

    def __init__(self):
        Cache.__init__(self, layer_class_to_replicate=GrowLayer)
