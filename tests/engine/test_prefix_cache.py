"""The schema-prefix KV cache: an LRU keyed by token ids, bounded by entries and bytes."""

from __future__ import annotations

import numpy as np
import pytest

from pcd_tools.engine.host.blas import import_mlx
from pcd_tools.engine.passes.prefix_cache import PrefixCache
from pcd_tools.schema import compile_schema

pytestmark = pytest.mark.engine

mx = import_mlx()


def kv(fill: float, tokens: int = 3, layers: int = 2) -> list[tuple[object, object]]:
    """Per layer (keys, values) of shape (1, 2, tokens, 4), float32: 96 bytes each."""
    a = mx.full((1, 2, tokens, 4), fill, dtype=mx.float32)
    return [(a, a + 1) for _ in range(layers)]


def test_hit_after_put_returns_the_stored_values():
    cache = PrefixCache(max_entries=4)
    assert cache.get([1, 2, 3]) is None
    cache.put([1, 2, 3], kv(0.5))
    got = cache.get((1, 2, 3))  # any sequence of the same ids is the same key
    assert got is not None and len(got) == 2
    k, v = got[0]
    assert np.array_equal(np.asarray(k), np.full((1, 2, 3, 4), 0.5, dtype=np.float32))
    assert np.array_equal(np.asarray(v), np.full((1, 2, 3, 4), 1.5, dtype=np.float32))
    assert cache.get([1, 2]) is None  # a shorter prefix is another key
    assert len(cache) == 1


def test_put_stores_compact_copies_of_a_slice():
    whole = mx.arange(2 * 10 * 4, dtype=mx.float32).reshape(1, 2, 10, 4)
    cache = PrefixCache()
    cache.put([7], [(whole[:, :, :3], whole[:, :, :3])])
    k, _ = cache.get([7])[0]
    assert k.shape == (1, 2, 3, 4)
    assert np.array_equal(np.asarray(k), np.asarray(whole)[:, :, :3])
    assert cache.nbytes() == 2 * 2 * 3 * 4 * 4


def test_the_least_recently_used_prefix_is_evicted_first():
    cache = PrefixCache(max_entries=2)
    cache.put([1], kv(1))
    cache.put([2], kv(2))
    assert cache.get([1]) is not None  # [1] is now the most recent, [2] the oldest
    cache.put([3], kv(3))
    assert [1] in cache and [3] in cache and [2] not in cache
    cache.put([4], kv(4))
    assert [3] in cache and [4] in cache and [1] not in cache
    assert len(cache) == 2


def test_a_put_of_a_cached_prefix_refreshes_it():
    cache = PrefixCache(max_entries=2)
    cache.put([1], kv(1))
    cache.put([2], kv(2))
    cache.put([1], kv(9))
    cache.put([3], kv(3))
    assert [2] not in cache and [1] in cache
    assert float(np.asarray(cache.get([1])[0][0]).max()) == 9.0


def test_the_byte_budget_evicts_but_keeps_the_newest_prefix():
    one = 2 * 2 * (1 * 2 * 3 * 4) * 4  # layers x (k, v) x elements x 4 bytes = 384
    cache = PrefixCache(max_entries=16, max_bytes=2 * one)
    cache.put([1], kv(1))
    cache.put([2], kv(2))
    assert len(cache) == 2 and cache.nbytes() == 2 * one
    cache.put([3], kv(3))
    assert [1] not in cache and len(cache) == 2
    cache.put([4], kv(4, tokens=30))  # alone over the budget: still kept, the rest go
    assert [4] in cache and len(cache) == 1


def test_clear_drops_everything():
    cache = PrefixCache()
    cache.put([1], kv(1))
    cache.put([2], kv(2))
    cache.clear()
    assert len(cache) == 0 and cache.get([1]) is None and cache.nbytes() == 0


def test_the_engine_fills_and_clears_its_prefix_cache(tiny):
    tiny.engine.clear_cache()
    schema = compile_schema({"ok": {"type": "boolean"}})
    tiny.decide(schema, "first")
    assert tiny.engine.plan(schema).head_ids in tiny.engine.prefix_cache
    tiny.engine.clear_cache()
    assert len(tiny.engine.prefix_cache) == 0
