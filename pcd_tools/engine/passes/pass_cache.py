"""One layer's cache for a pass (`PassCache`: a fixed prefix, the pass's positions and
mask, the prefix's K/V parts handed to the attention kernel in place), and the size of the
pieces a long row's prefill runs in (`piece_tokens`)."""

from __future__ import annotations

from typing import Any

from ..host.blas import import_mlx
from .kv_parts import join_kv, kv_parts

mx = import_mlx()

__all__ = ["PIECE_TOKENS", "PassCache", "piece_tokens"]

# Tokens per prefill call of a long row (`Passes.prefill_pieces`): enough rows for the
# matrix products to run at full rate, few enough that a call's activations stay small.
PIECE_TOKENS = 1024


def piece_tokens(n: int) -> int:
    """The piece size for a row of `n` tokens: `PIECE_TOKENS`, or larger for rows so long
    that their pieces, the cached prefix and the call's own keys would pass the attention
    kernel's `MAX_PARTS` (12 pieces at most)."""
    return max(PIECE_TOKENS, -(-n // 12))


class PassCache:
    """One layer's cache for a pass: fixed prefix K/V, the pass's positions and mask.

    Args:
        k: Prefix keys, or None when the pass starts at position 0.
        v: Prefix values, or None.
        offset: The pass's positions: an int, or a (B, L) array (per-token RoPE).
        mask: What `make_mask` hands the attention: None, "causal" or an array.
        keep: Keep this layer's K/V after the call (a prefill); a fields pass drops
            them as soon as they are used.
        apart: Hand the attention this call's K/V alone and the prefix's parts in
            `prefix_apart`, instead of a copy of all (where the model's attention is
            `cpu_kernels.sdpa`, which reads the parts in place:
            `cpu_kernels.takes_prefix_apart`). With `keep`, `kept` joins the parts and
            this call's K/V lazily (`join_kv`).

    Attributes:
        prefix_apart: The prefix's K/V parts once `update_and_fetch` left them apart,
            else None.
    """

    def __init__(
        self, k: Any, v: Any, offset: Any, mask: Any, keep: bool = True, apart: bool = False
    ):
        self.pk, self.pv = k, v
        self.offset = offset
        self.mask = mask
        self.keep = keep
        self.apart = apart and k is not None
        self.prefix_apart: list[tuple[Any, Any]] | None = None
        self.own: tuple[Any, Any] | None = None
        self.keys: Any = None
        self.values: Any = None

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Any, Any]:
        """The prefix K/V followed by this call's (the mlx-lm cache protocol); this
        call's alone when the prefix is kept `apart`."""
        if self.apart:
            self.prefix_apart = kv_parts(self.pk, self.pv)
            if self.keep:  # `kept` joins them lazily on demand
                self.own = (keys, values)
            return keys, values
        if self.pk is not None:
            keys = mx.concatenate([self.pk, keys], axis=2)
            values = mx.concatenate([self.pv, values], axis=2)
        if self.keep:
            self.keys, self.values = keys, values
        return keys, values

    def kept(self, n: int, with_prefix: bool = True) -> tuple[Any, Any]:
        """The kept K/V of this call's first `n` tokens, after the prefix's unless not
        `with_prefix`; joined lazily when the prefix was apart. Only after a `keep` call."""
        p = 0 if self.pk is None else int(self.pk.shape[2])
        if self.own is None:
            lo = p if not with_prefix else 0
            return self.keys[:, :, lo : p + n], self.values[:, :, lo : p + n]
        own = (self.own[0][:, :, :n], self.own[1][:, :, :n])
        if not with_prefix:
            return own
        return join_kv([*(self.prefix_apart or []), own])

    def evaluate(self, n: int) -> list[Any]:
        """What to evaluate so that `kept(n)` is ready without copying the prefix."""
        if self.own is None:
            return list(self.kept(n))
        return [self.own[0][:, :, :n], self.own[1][:, :, :n]]

    def make_mask(self, n: int, return_array: bool = False, window_size: Any = None) -> Any:
        """The pass's mask; for a sliding-window layer (gemma3), also hiding every key
        `window_size` or more positions before its query, as mlx-lm's own caches do."""
        if window_size is None:
            return self.mask
        p = 0 if self.pk is None else int(self.pk.shape[2])
        if isinstance(self.offset, mx.array):
            q = self.offset.astype(mx.int32).reshape(-1, n)  # (B, n) per-token positions
        else:
            q = (mx.arange(n, dtype=mx.int32) + int(self.offset))[None]
        k = mx.concatenate(
            [mx.broadcast_to(mx.arange(p, dtype=mx.int32)[None], (q.shape[0], p)), q], 1
        )
        gap = q[:, :, None] - k[:, None, :]  # prefix keys sit at positions 0..p-1
        near = (gap < window_size)[:, None]  # (B, 1, n, p + n)
        if isinstance(self.mask, mx.array):
            if self.mask.dtype == mx.bool_:
                return self.mask & near
            return mx.where(near, self.mask, mx.finfo(self.mask.dtype).min)
        return (gap >= 0)[:, None] & near  # "causal", or None for one token
