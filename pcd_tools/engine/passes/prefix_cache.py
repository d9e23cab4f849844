"""The schema-prefix KV cache: an LRU of per-layer keys and values, keyed by token ids.

The system part of the prompt depends only on the schema, so its K/V are kept across
requests and a warm request prefills only the context (DESIGN §2). The cache is bounded
by a number of prefixes and by a byte budget; the most recent prefix always stays.

A caller can keep its entries apart from everyone else's with `partition(key)` (the
server's `prompt_cache_key`): inside it, the calling thread reads and writes only the
entries stored under the same key.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..host.blas import import_mlx

mx = import_mlx()

__all__ = ["PrefixCache"]

# Per layer, (keys, values) of shape (1, kv_heads, prefix_tokens, head_dim).
LayerKV = list[tuple[Any, Any]]


class PrefixCache:
    """An LRU of schema-prefix K/V, keyed by the prefix's token ids. Not thread-safe: the
    engine calls it under its lock.

    Args:
        max_entries: Prefixes kept.
        max_bytes: Byte budget for the cached K/V.
    """

    def __init__(self, max_entries: int = 16, max_bytes: int = 1 << 30) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[Any, ...], LayerKV] = OrderedDict()
        self._local = threading.local()

    @contextmanager
    def partition(self, key: str | None) -> Iterator[None]:
        """Within the block, this thread's reads and writes use only the entries stored
        under `key` (None: the shared, unkeyed entries). All partitions share one LRU and
        one byte budget."""
        before = getattr(self._local, "key", None)
        self._local.key = key
        try:
            yield
        finally:
            self._local.key = before

    def _key(self, ids: Sequence[int]) -> tuple[Any, ...]:
        key = getattr(self._local, "key", None)
        return tuple(ids) if key is None else (("partition", key), *ids)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, ids: Sequence[int]) -> bool:
        return self._key(ids) in self._entries

    def get(self, ids: Sequence[int]) -> LayerKV | None:
        """The cached K/V of prefix `ids`, marked as most recently used; None on a miss."""
        key = self._key(ids)
        kv = self._entries.get(key)
        if kv is not None:
            self._entries.move_to_end(key)
        return kv

    def put(self, ids: Sequence[int], kv: LayerKV) -> None:
        """Stores compact, evaluated copies of `kv` under `ids`, then evicts the least
        recently used prefixes while over either budget (never the one just stored)."""
        # A lazy slice would keep the whole prompt's K/V alive and could only be
        # evaluated on the storing thread's stream.
        kv = [(mx.contiguous(k), mx.contiguous(v)) for k, v in kv]
        mx.eval([x for pair in kv for x in pair])
        key = self._key(ids)
        self._entries[key] = kv
        self._entries.move_to_end(key)
        while len(self._entries) > 1 and (
            len(self._entries) > self.max_entries or self.nbytes() > self.max_bytes
        ):
            self._entries.popitem(last=False)

    def nbytes(self) -> int:
        """Bytes held by the cached keys and values."""
        return sum(k.nbytes + v.nbytes for kvs in self._entries.values() for k, v in kvs)

    def clear(self) -> None:
        """Drops every cached prefix."""
        self._entries.clear()
