"""Exact attention, SwiGLU and RoPE for MLX's CPU backend, without MLX's scalar math.

On x86 Linux, MLX's CPU backend evaluates `exp` and `sigmoid` one element at a time:
about 85 M elements/s here, against about 2 G/s for numpy's SIMD `exp` and 4 G/s for
an AVX-512 one. Attention over a long prompt is mostly exponentials, so
`mx.fast.scaled_dot_product_attention` spends about 95 ms per layer on a 466-token pass
over 1,552 keys, of which the two matmuls take 12 ms.

Attention takes the first of these that applies, all in float32 (the same math, to
about 1e-6), except the scores of engines computing in int8 or bf16 on CPUs with AMX
(`active(bf16_scores=True)`): products of Q's and K's bf16 roundings on the tiles (the
kernel 1.6-1.7x faster at 2k-4k keys on a Xeon), far finer than the int8 activations after:

- `_cpu_kernels.c`, compiled once into the cache: per block of query rows, the scores
  (each its own SIMD chain over the features, the same wherever it falls: a BLAS's score
  moves in the last bit with the call's shape), a one-sweep SIMD softmax while they sit
  in L2, then per query the sum of its nonzero weights and their product with V, in key
  order over those weights only (SIMD over the features), on `threads` threads; a causal
  pass skips the masked keys. About 10 ms for that layer. A query's output is then
  bit-identical whatever masked keys share its call (`active(every_size=True)` keeps
  small calls on it too). Needs a C compiler, and is used only beside a bound fast BLAS
  (for MLX's matrix products); built and loaded by `native`.
- numpy: the matmuls in MLX, the softmax in numpy on the evaluated scores (21 ms).

SwiGLU (`silu(gate) * x`) runs in the same library in one SIMD sweep, else in numpy.

RoPE (`rope`, called by `passes.PerTokenRoPE`) looks each position up in a cos / sin
table probed from the module itself (as the native decode does) and repeats MLX's
rounded float32 products: bit-identical to MLX, about 4x faster (0.17 against 0.76 ms
for a 578-token prefill's queries). Native only; MLX's rope runs otherwise.

They are used only where they win and only when asked for: the dispatchers installed in
an mlx-lm model module call the original function unless the current thread is inside
`active(True)` and the call is large enough (a one-token decode step is not). GPU
engines never turn them on, and models used outside a PCD engine are unaffected.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..._lazy import mlx_lm_module
from ..host.blas import import_mlx
from .bindings import cpu_kernels_library
from .paths import PATHS

mx = import_mlx()
import mlx.nn as nn  # noqa: E402

__all__ = ["active", "install", "native_attention", "rope", "sdpa", "swiglu"]

# Work (score elements, gate elements) below which the original MLX op is faster than a
# round trip through numpy: one sync costs about 0.1 ms, MLX's exp about 12 ns/element.
MIN_SCORES = 32768
MIN_GATE = 32768
# Elements of a RoPE input below which MLX's own rope is used (one sync costs ~0.1 ms).
MIN_ROPE = 16384
_NEG = np.float32(np.finfo(np.float32).min)
# Query rows per block of the native kernel: 128 x 1,552 scores (776 KB) stay in L2.
BLOCK_ROWS = 128

# The most parts a call's keys may come in (`_cpu_kernels.c`'s MAX_PARTS, with the call's own).
MAX_PARTS = 16
_state = threading.local()
_install_lock = threading.Lock()
_ORIGINALS: dict[str, Any] = {}
# The library the dispatchers call; False once found unusable (tests set it to force numpy).
_native: Any = None


@contextlib.contextmanager
def active(
    on: bool = True, threads: int = 1, every_size: bool = False, bf16_scores: bool = False
) -> Iterator[None]:
    """Turns the kernels on (or off) for model calls made by this thread.

    Args:
        on: Use the kernels.
        threads: Threads the native attention may use.
        every_size: Attention and SwiGLU take the kernels at every call size, not only
            where they are faster (`MIN_SCORES`, `MIN_GATE`): a row's numbers then do not
            depend on the size of the call it is in. Engines over file-encoded (GGUF)
            matrices ask for it: they sync at every matrix product anyway, and in int8 or
            bf16 a float32-sized difference is rounded up to a whole activation step.
        bf16_scores: Attention's scores are products of bf16 roundings of Q and K on the
            AMX tiles (`_cpu_kernels.c`, "bf16 scores on the AMX tiles"), where
            `bf16_scores_run()`: for engines whose matrices compute in int8 or bf16.
    """
    prev = (
        getattr(_state, "on", False),
        getattr(_state, "threads", 1),
        getattr(_state, "every", False),
        getattr(_state, "bf16", False),
    )
    _state.on, _state.threads, _state.every = on, max(1, int(threads)), bool(every_size)
    _state.bf16 = bool(bf16_scores) and bf16_scores_run()
    try:
        yield
    finally:
        _state.on, _state.threads, _state.every, _state.bf16 = prev


def bf16_scores_run() -> bool:
    """Whether the native attention runs bf16 scores here: AMX-BF16 tiles the process
    may use (`PCD_AMX=0` turns them off) and the kernels built."""
    lib = native_attention()[0]
    return bool(lib) and lib.pcd_cpu_kernels_path(PATHS["amx"]) == PATHS["amx"]


class AttentionMeter:
    """Wall time a request spent in the native attention kernel, summed over the threads
    that ran its passes (`metering`): what `Decision.attention_ms` reports."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds
            self.calls += 1

    @property
    def ms(self) -> float:
        return self.seconds * 1e3


@contextlib.contextmanager
def metering(meter: AttentionMeter | None = None) -> Iterator[AttentionMeter]:
    """Counts this thread's native attention calls into `meter` (a new one if None)
    while the block runs; stream workers take the caller's (`current_meter`)."""
    meter = AttentionMeter() if meter is None else meter
    prev = getattr(_state, "meter", None)
    _state.meter = meter
    try:
        yield meter
    finally:
        _state.meter = prev


def current_meter() -> AttentionMeter | None:
    """The meter this thread's attention calls count into, if any."""
    return getattr(_state, "meter", None)


def _on() -> bool:
    return bool(getattr(_state, "on", False))


def _small(size: int, least: int) -> bool:
    """Whether a call of `size` work is left to MLX (below `least`, unless every size
    goes through the kernels on this thread)."""
    return size < least and not getattr(_state, "every", False)


def _masks() -> OrderedDict[Any, tuple[Any, np.ndarray, int, np.ndarray]]:
    cache = getattr(_state, "masks", None)
    if cache is None:
        cache = _state.masks = OrderedDict()
    return cache


def _additive_mask(mask: Any, lq: int, s: int) -> np.ndarray | None:
    """The mask as a float32 array of 0 / -max, broadcastable to (B, KH, G, Lq, S).

    Converted once per mask object (all layers of a pass share one) and per causal shape.
    Returns None for a layout this module does not handle.
    """
    got = _additive_mask_from(mask, lq, s)
    return None if got is None else got[0]


def _additive_mask_from(mask: Any, lq: int, s: int) -> tuple[np.ndarray, int] | None:
    """`_additive_mask`, and how many leading key columns it leaves open to every query
    (a pass's cached prefix): the kernel need not read those (`pcd_attention_parts`)."""
    got = _mask_plan(mask, lq, s)
    return None if got is None else (got[0], got[1])


def _mask_plan(mask: Any, lq: int, s: int) -> tuple[np.ndarray, int, np.ndarray] | None:
    """`_additive_mask_from`, and per query row one past its last open key, (B or 1, Lq)
    int32 (S for a row with none open): the kernel scores no key past it. A prefill fused
    with a fields chunk (`Passes.prefill_and_pack`) is causal over its context rows, so
    its scores then cost a causal prefill's, not a full square's."""
    cache = _masks()
    key: Any = ("causal", lq, s) if isinstance(mask, str) else id(mask)
    hit = cache.get(key)
    if hit is not None and (isinstance(mask, str) or hit[0] is mask):
        cache.move_to_end(key)
        return hit[1], hit[2], hit[3]
    if isinstance(mask, str):
        if mask != "causal":
            return None
        q = np.arange(s - lq, s)[:, None]
        out = np.where(q >= np.arange(s)[None, :], np.float32(0), _NEG).astype(np.float32)
    else:
        m = np.asarray(mask)
        if m.shape[-2:] != (lq, s) or m.ndim not in (2, 3, 4):
            return None
        if m.ndim == 4 and m.shape[1] != 1:
            return None  # per-head masks: not produced by the models this serves
        m = m.reshape((m.shape[0] if m.ndim > 2 else 1), 1, 1, lq, s)
        if m.dtype == np.bool_:
            out = np.where(m, np.float32(0), _NEG).astype(np.float32)
        else:
            out = np.maximum(m.astype(np.float32), _NEG)
    shut = (out != 0).reshape(-1, s).any(axis=0)
    open_cols = int(np.argmax(shut)) if shut.any() else s
    seen = (out > _NEG).reshape(-1, lq, s)
    last = s - np.argmax(seen[:, :, ::-1], axis=-1)
    row_end = np.ascontiguousarray(np.where(seen.any(axis=-1), last, s), dtype=np.int32)
    cache[key] = (mask, out, open_cols, row_end)
    while len(cache) > 4:
        cache.popitem(last=False)
    return out, open_cols, row_end


def native_attention() -> tuple[Any, str]:
    """The compiled attention kernel (a ctypes library) or None, and why.

    Built on first use, then cached on disk and in the process
    (`bindings.cpu_kernels_library`). None where `PCD_NATIVE_ATTENTION=0`, no fast BLAS
    was bound, or no C compiler works; the numpy softmax is used then.
    """
    global _native
    lib, note = cpu_kernels_library()
    if _native is None:
        _native = lib
    return (_native or None), note


def _strides(a: np.ndarray) -> list[int] | None:
    """(batch, head, row) strides in elements of a (B, H, L, D) float32 view, or None
    unless rows are contiguous, at least D apart, and every stride is a whole element
    count (a batch or head stride may be 0: broadcast)."""
    st = a.strides
    if a.dtype != np.float32 or st[3] != 4 or st[2] < 4 * a.shape[3]:
        return None
    if any(x < 0 or x % 4 for x in st[:3]):
        return None
    return [x // 4 for x in st[:3]]


def _views(*arrays: Any) -> tuple[list[np.ndarray], list[int]] | None:
    """Evaluated MLX arrays as numpy views and their (batch, head, row) strides, all in
    one list; None unless every one has a layout the kernel reads (`_strides`)."""
    mx.eval(*arrays)
    views = [np.asarray(x) for x in arrays]
    strides: list[int] = []
    for a in views:
        st = _strides(a)
        if st is None:
            return None
        strides += st
    return views, strides


def _native_sdpa(
    lib: Any,
    queries: Any,
    keys: Any,
    values: Any,
    scale: float,
    mask: Any,
    prefix: Sequence[tuple[Any, Any]] = (),
) -> Any | None:
    """Attention through `_cpu_kernels.c`; None if this call's layout is not handled.
    With `prefix`, the keys and values are this call's own and the prefix's parts (K/V
    pairs) come before them, read in place as if joined. A mask's leading columns that
    every query sees (the prefix's, in a pass) are not read."""
    b, h, lq, d = queries.shape
    kh = keys.shape[1]
    s = sum(int(k.shape[2]) for k, _ in prefix) + keys.shape[2]
    causal, madd, open_cols, row_end = 0, None, 0, None
    if isinstance(mask, str):
        if mask != "causal":
            return None
        causal = 1
    elif mask is not None:
        got_mask = _mask_plan(mask, lq, s)
        if got_mask is None or got_mask[0].shape[0] not in (1, b):
            return None
        madd, open_cols, row_end = got_mask
    parts = [*prefix, (keys, values)]
    if len(parts) > MAX_PARTS or any(
        x.shape[:2] != (b, kh) or x.dtype != mx.float32 for pair in parts for x in pair
    ):
        return None
    got = _views(queries, *(x for pair in parts for x in pair))
    if got is None:
        return None
    (qn, *kvn), strides = got
    n = len(parts)
    out = np.empty((b, h, lq, d), dtype=np.float32)
    m_sb = lq * s if madd is not None and madd.shape[0] > 1 else 0
    t0 = time.perf_counter()
    bf16 = getattr(_state, "bf16", False) and d % 32 == 0
    rc = lib.pcd_attention_parts(
        PATHS["amx" if bf16 else "auto"], qn.ctypes.data, n, (ctypes.c_void_p * n)(*(x.ctypes.data for x in kvn[0::2])),
        (ctypes.c_void_p * n)(*(x.ctypes.data for x in kvn[1::2])),
        (ctypes.c_int * n)(*(int(x.shape[2]) for x in kvn[0::2])), out.ctypes.data,
        (ctypes.c_int64 * len(strides))(*strides), None if madd is None else madd.ctypes.data,
        m_sb, open_cols, None if row_end is None else row_end.ctypes.data,
        lq if row_end is not None and row_end.shape[0] > 1 else 0,
        b, h, kh, lq, d, scale, causal, BLOCK_ROWS,
        getattr(_state, "threads", 1),
    )  # fmt: skip
    meter = current_meter()
    if meter is not None:
        meter.add(time.perf_counter() - t0)
    if rc != 0:  # pragma: no cover - only on out-of-memory in the kernel
        return None
    return mx.array(out)


def takes_prefix_apart(model: Any) -> bool:
    """Whether every attention layer of `model` calls `sdpa` (after `install`), so that a
    pass may hand it the prefix K/V apart from its own (`passes.PassCache`)."""
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None) or []
    for layer in layers:
        attn = getattr(layer, "self_attn", None)
        module = sys.modules.get(type(attn).__module__) if attn is not None else None
        if getattr(module, "scaled_dot_product_attention", None) is not sdpa:
            return False
    return bool(layers)


def sdpa(
    queries: Any,
    keys: Any,
    values: Any,
    cache: Any,
    scale: float,
    mask: Any,
    sinks: Any = None,
) -> Any:
    """mlx-lm's `scaled_dot_product_attention`, with the softmax in numpy when active.

    Shapes as in mlx-lm: queries (B, H, Lq, D), keys and values (B, KH, S, D), H a
    multiple of KH (grouped-query attention). When the cache left its prefix apart
    (`PassCache.prefix_apart`, K/V parts), keys and values are this call's alone, the
    prefix's before them: the kernel reads every part in place, and every other route
    joins them first.
    """
    original = _ORIGINALS["sdpa"]
    b, h, lq, d = queries.shape
    prefix = getattr(cache, "prefix_apart", None) or ()
    kh, s = keys.shape[1], keys.shape[2] + sum(int(k.shape[2]) for k, _ in prefix)
    handled = not (
        not _on()
        or sinks is not None
        or hasattr(cache, "bits")
        or queries.dtype != mx.float32
        or keys.dtype != mx.float32
        or values.dtype != mx.float32
        or h % kh
        or _small(b * h * lq * s, MIN_SCORES)
    )
    lib = (_native or None) if handled else None
    if handled and mask is not None and not isinstance(mask, str):
        mx.eval(mask)
    if prefix:
        if lib is not None:
            out = _native_sdpa(lib, queries, keys, values, scale, mask, prefix)
            if out is not None:
                return out
        keys = mx.concatenate([*(k for k, _ in prefix), keys], axis=2)
        values = mx.concatenate([*(v for _, v in prefix), values], axis=2)
    if not handled:
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)
    if lib is not None:
        out = _native_sdpa(lib, queries, keys, values, scale, mask)
        if out is not None:
            return out
    madd = None
    if mask is not None:
        madd = _additive_mask(mask, lq, s)
        if madd is None:
            return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)
    g = h // kh
    scores = (queries * scale).reshape(b, kh, g * lq, d) @ keys.swapaxes(-1, -2)
    mx.eval(scores)
    # `scores` is a fresh matmul output owned here: normalise it in place, then reuse it.
    a = np.asarray(scores)
    if not (a.flags.writeable and a.flags.c_contiguous):  # pragma: no cover - defensive
        scores = mx.array(a)
        a = np.asarray(scores)
    a5 = a.reshape(b, kh, g, lq, s)
    if madd is not None:
        a5 += madd
    a5 -= a5.max(axis=-1, keepdims=True)
    np.exp(a5, out=a5)
    denom = a5.sum(axis=-1, keepdims=True).reshape(b, kh, g * lq, 1)
    out = (scores @ values) / mx.array(denom)
    return out.reshape(b, h, lq, d)


def _rope_table(inner: Any, head_dim: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (positions, dims / 2) of an `nn.RoPE` at positions [0, n) or more: the
    module's own output on a probe (`rope_tables`, as the native decode
    builds its tables), so each entry is MLX's own float32 value. Kept per thread and
    per RoPE setting, grown by doubling from 4,096 positions."""
    tables = getattr(_state, "ropes", None)
    if tables is None:
        tables = _state.ropes = {}
    key = (head_dim, inner.dims, inner.traditional, inner.base, inner.scale)
    have = tables.get(key)
    if have is None or len(have[0]) < n:
        size = max(n, 4096, 2 * len(have[0]) if have is not None else 0)
        cos, sin, _, _ = rope_tables(inner, head_dim, size, False)
        have = tables[key] = (cos, sin)
    return have


def rope(inner: Any, x: Any, offset: Any) -> Any | None:
    """`inner(x, offset=offset)` for an `nn.RoPE` through the native kernel, or None when
    this call is left to MLX (not active, not float32, too small, another RoPE kind, or
    no native library).

    MLX's CPU rope computes sines and cosines per element (0.76 ms for a 578-token
    prefill's queries on a 2-core EPYC); the kernel looks each position up in a table of
    MLX's own values and repeats its float32 products, in 0.17 ms. `offset` may be an
    int, (B,) or (B, L) positions (`passes.PerTokenRoPE`).
    """
    lib = _native or None
    if (
        lib is None
        or not _on()
        or type(inner) is not nn.RoPE
        or x.ndim != 4
        or x.dtype != mx.float32
        or x.size < MIN_ROPE
    ):
        return None
    b, h, lq, d = x.shape
    mx.eval(x)
    xn = np.asarray(x)
    st = _strides(xn)
    if st is None:
        return None
    if isinstance(offset, mx.array) and offset.size > 1:
        off = np.asarray(offset).astype(np.int64)
        at = off if off.ndim == 2 else off[:, None] + np.arange(lq)  # (B, L) or (B,)
    else:
        at = np.arange(lq) + int(offset)
    pos = np.ascontiguousarray(np.broadcast_to(at, (b, lq)), dtype=np.int32)
    cs, sn = _rope_table(inner, d, int(pos.max()) + 1)
    out = np.empty((b, h, lq, d), dtype=np.float32)
    rc = lib.pcd_rope(
        xn.ctypes.data,
        out.ctypes.data,
        cs.ctypes.data,
        sn.ctypes.data,
        pos.ctypes.data,
        (ctypes.c_int64 * 3)(*st),
        b,
        h,
        lq,
        d,
        int(inner.dims),
        int(bool(inner.traditional)),
        getattr(_state, "threads", 1),
    )
    return mx.array(out) if rc == 0 else None


def swiglu(gate: Any, x: Any) -> Any:
    """mlx-lm's `swiglu` (`silu(gate) * x`), natively or in numpy when active."""
    if (
        not _on()
        or gate.dtype != mx.float32
        or x.dtype != mx.float32
        or gate.shape != x.shape
        or _small(gate.size, MIN_GATE)
    ):
        return _ORIGINALS["swiglu"](gate, x)
    mx.eval(gate, x)
    gn, xn = np.asarray(gate), np.asarray(x)
    lib = _native or None
    if lib is not None and gn.flags.c_contiguous and xn.flags.c_contiguous:
        res = np.empty(gn.shape, dtype=np.float32)
        threads = getattr(_state, "threads", 1)
        auto = PATHS["auto"]
        if (
            lib.pcd_swiglu(gn.ctypes.data, xn.ctypes.data, res.ctypes.data, gn.size, threads, auto)
            == 0
        ):
            return mx.array(res)
    out = np.negative(gn)
    np.exp(out, out=out)
    out += 1.0
    np.divide(gn, out, out=out)
    out *= xn
    return mx.array(out)


def install(model: Any) -> bool:
    """Points the model's mlx-lm modules at the dispatchers; True if both were found.

    Idempotent and safe for other users of the module: the dispatchers call the original
    functions unless `active(True)` is in force on the calling thread.
    """
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if not layers:
        return False
    names = set()
    for layer in layers:
        for part in ("self_attn", "mlp"):
            mod = getattr(layer, part, None)
            if mod is not None:
                names.add(type(mod).__module__)
    native_attention()  # compile (once) now, not inside the first request
    found = {"sdpa": False, "swiglu": False}
    with _install_lock:
        activations = mlx_lm_module("models.activations")
        base = mlx_lm_module("models.base")

        _ORIGINALS.setdefault("sdpa", base.scaled_dot_product_attention)
        _ORIGINALS.setdefault("swiglu", activations.swiglu)
        for name in names:
            module = sys.modules.get(name)
            if module is None:
                continue
            current = getattr(module, "scaled_dot_product_attention", None)
            if current is _ORIGINALS["sdpa"]:
                module.scaled_dot_product_attention = sdpa  # type: ignore[attr-defined]
            if getattr(module, "scaled_dot_product_attention", None) is sdpa:
                found["sdpa"] = True
            current = getattr(module, "swiglu", None)
            if current is _ORIGINALS["swiglu"]:
                module.swiglu = swiglu  # type: ignore[attr-defined]
            if getattr(module, "swiglu", None) is swiglu:
                found["swiglu"] = True
    return found["sdpa"] and found["swiglu"]


def rope_tables(rope: Any, head_dim: int, n: int, check: bool) -> tuple[Any, ...]:
    """cos and sin (n, dims / 2) of the model's rope module at positions [0, n), probed
    from the module itself (it rotates pairs (i1[k], i2[k]) by angle k); its layout and
    rotated dims. With `check`, None unless they reproduce the module on random vectors."""
    dims = int(getattr(rope, "dims", head_dim))
    trad = bool(getattr(rope, "traditional", False))
    idx = np.arange(dims)
    i1, i2 = (idx[0::2], idx[1::2]) if trad else (idx[: dims // 2], idx[dims // 2 :])
    probe = np.zeros((1, 1, n, head_dim), np.float32)
    probe[..., i1] = 1.0
    out = np.array(rope(mx.array(probe), offset=0).astype(mx.float32))[0, 0]
    cos, sin = np.ascontiguousarray(out[:, i1]), np.ascontiguousarray(out[:, i2])
    rng = np.random.default_rng(0)
    for off in (0, 7, n - 2) if check else ():
        x = rng.standard_normal((2, head_dim)).astype(np.float32)
        want = np.array(rope(mx.array(x[None, None]), offset=off).astype(mx.float32))[0, 0]
        c, s_, got = cos[off : off + 2], sin[off : off + 2], x.copy()
        got[:, i1] = x[:, i1] * c - x[:, i2] * s_
        got[:, i2] = x[:, i1] * s_ + x[:, i2] * c
        if not np.allclose(got, want, rtol=1e-4, atol=1e-4):
            return None, None, trad, dims
    return cos, sin, trad, dims
