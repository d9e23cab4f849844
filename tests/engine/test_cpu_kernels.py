"""The native (C) and numpy attention and SwiGLU kernels against float64 math and MLX."""

from __future__ import annotations

import ctypes
import gc
import itertools
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pcd_tools.engine.host.blas import import_mlx
from pcd_tools.engine.kernels import cpu_ops as K
from pcd_tools.engine.kernels.paths import BITS, PATHS
from pcd_tools.engine.passes import kv_parts as P
from pcd_tools.schema import compile_schema
from tests.conftest import make_tiny_model, tiny_decider

mx = import_mlx()
pytestmark = pytest.mark.engine


@pytest.fixture(scope="module", autouse=True)
def installed():
    assert K.install(make_tiny_model(0))  # fills the table of original functions


def _native_expected() -> bool:
    """Where the native kernels must build: a C compiler and a bound fast BLAS."""
    from pcd_tools.engine.host.blas import sgemm_address

    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    return (
        bool(cc) and sgemm_address() is not None and os.environ.get("PCD_NATIVE_ATTENTION") != "0"
    )


@pytest.fixture
def lib():
    got, note = K.native_attention()
    if got is None:
        assert not _native_expected(), f"the native kernels should have built here: {note}"
        pytest.skip(f"native kernels unavailable on this machine: {note}")
    return got


@pytest.fixture(params=["native", "numpy"])
def path(request, monkeypatch):
    """Runs a test through the native kernels, then through the numpy ones."""
    if request.param == "native":
        request.getfixturevalue("lib")
    else:
        monkeypatch.setattr(K, "_native", False)
    return request.param


def reference(q, k, v, scale, mask):
    """Grouped-query attention in float64; mask: None, 'causal', bool or additive."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b, h, lq, d = q.shape
    kh, s = k.shape[1], k.shape[2]
    sc = np.einsum("bkgld,bksd->bkgls", q.reshape(b, kh, h // kh, lq, d) * scale, k)
    if isinstance(mask, str):
        allowed = np.arange(s - lq, s)[:, None] >= np.arange(s)[None, :]
        sc = np.where(allowed, sc, -np.inf)
    elif mask is not None:
        m = np.asarray(mask)
        m = m.reshape(m.shape[0] if m.ndim > 2 else 1, 1, 1, lq, s)
        sc = np.where(m, sc, -np.inf) if m.dtype == np.bool_ else sc + m
    sc -= sc.max(-1, keepdims=True)
    p = np.exp(sc)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bkgls,bksd->bkgld", p, v).reshape(b, h, lq, d)


def _qkv(rng, b, h, kh, lq, s, d=32, mag=3.0):
    f = np.float32
    return (
        mx.array((rng.normal(size=(b, h, lq, d)) * mag).astype(f)),
        mx.array(rng.normal(size=(b, kh, s, d)).astype(f)),
        mx.array(rng.normal(size=(b, kh, s, d)).astype(f)),
    )


def _masks(rng, b, lq, s):
    keep = rng.random((b, 1, lq, s)) > 0.4
    keep[..., 0] = True  # no row is fully masked
    additive = np.where(keep, 0.0, -1e9).astype(np.float32)
    return {
        "none": None,
        "causal": "causal",
        "bool": mx.array(keep),
        "bool-2d": mx.array(keep[0, 0]),
        "additive": mx.array(additive),
    }


@pytest.mark.parametrize("kind", ["none", "causal", "bool", "bool-2d", "additive"])
@pytest.mark.parametrize(
    "b,h,kh,lq,s",
    # one block; several query blocks (300 rows -> 3 x 100); batch rows, no GQA
    [(1, 9, 3, 40, 300), (1, 6, 2, 300, 420), (2, 4, 4, 33, 257)],
)
def test_sdpa_matches_float64_and_mlx(path, kind, b, h, kh, lq, s):
    rng = np.random.default_rng(lq + s)
    q, k, v = _qkv(rng, b, h, kh, lq, s)
    mask = _masks(rng, b, lq, s)[kind]
    assert b * h * lq * s >= K.MIN_SCORES  # the numpy path runs
    with K.active(True):
        got = np.asarray(K.sdpa(q, k, v, None, 0.2, mask))
    want = reference(q, k, v, 0.2, mask)
    mlx = np.asarray(mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask=mask))
    np.testing.assert_allclose(got, want, atol=2e-5)
    # no less accurate than MLX's own kernel
    assert np.abs(got - want).max() <= max(2 * np.abs(mlx - want).max(), 1e-6)


def test_mask_objects_are_converted_per_object_not_per_address(path):
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng, 1, 9, 3, 40, 300)
    with K.active(True):
        for _ in range(3):  # new mask objects may reuse a freed object's id
            keep = rng.random((1, 1, 40, 300)) > 0.5
            keep[..., 0] = True
            mask = mx.array(keep)
            got = np.asarray(K.sdpa(q, k, v, None, 0.2, mask))
            np.testing.assert_allclose(got, reference(q, k, v, 0.2, mask), atol=2e-5)
            del mask


def test_inactive_or_small_calls_use_mlx_itself():
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, 1, 9, 3, 40, 300)
    want = np.asarray(mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask="causal"))
    got = np.asarray(K.sdpa(q, k, v, None, 0.2, "causal"))  # not active: the original
    assert np.array_equal(got, want)
    q1 = q[:, :, -1:]
    want1 = np.asarray(mx.fast.scaled_dot_product_attention(q1, k, v, scale=0.2, mask=None))
    with K.active(True):  # a decode step is below MIN_SCORES
        assert np.array_equal(np.asarray(K.sdpa(q1, k, v, None, 0.2, None)), want1)


def test_swiglu_matches_silu_times_x():
    rng = np.random.default_rng(3)
    g = mx.array((rng.normal(size=(1, 64, 1024)) * 4).astype(np.float32))
    x = mx.array(rng.normal(size=(1, 64, 1024)).astype(np.float32))
    gd, xd = np.asarray(g, dtype=np.float64), np.asarray(x, dtype=np.float64)
    want = gd / (1 + np.exp(-gd)) * xd
    with K.active(True):
        got = np.asarray(K.swiglu(g, x))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.abs(np.asarray(g)).max() > 8  # the test covers saturated gates


def test_install_is_idempotent_and_leaves_other_callers_alone():
    from mlx_lm.models import llama

    model = make_tiny_model(1)
    assert K.install(model) and K.install(model)
    assert llama.scaled_dot_product_attention is K.sdpa
    assert llama.swiglu is K.swiglu
    assert not getattr(K._state, "on", False)  # off unless a PCD engine turns it on


def test_engine_switch(monkeypatch):
    assert tiny_decider(0).engine.cpu_kernels is True
    assert tiny_decider(0, cpu_kernels=False).engine.cpu_kernels is False
    monkeypatch.setenv("PCD_CPU_KERNELS", "0")
    assert tiny_decider(0).engine.cpu_kernels is False


def test_decisions_agree_with_and_without_kernels(tiny):
    schema = {
        "team": {"type": "enum", "choices": ["billing", "bill_disputes", "tech", "sales"]},
        "urgent": {"type": "boolean"},
    }
    ctx = "My card was charged twice for the same order and I need a refund. " * 6
    K._masks().clear()
    on = tiny.decide(schema, ctx)
    assert K._masks(), "the fields pass did not go through the kernels"
    tiny.engine.cpu_kernels = False
    try:
        off = tiny.decide(schema, ctx)
    finally:
        tiny.engine.cpu_kernels = True
    for name in on.fields:
        a, b = on.fields[name].distribution, off.fields[name].distribution
        assert max(abs(a[c] - b[c]) for c in a) < 1e-4


# --- the native library ---------------------------------------------------------------


def test_native_kernels_build_where_they_can():
    lib, note = K.native_attention()
    if _native_expected():
        assert lib is not None, note
        assert note.startswith("on (") and "softmax" in note
        assert lib.pcd_attention_simd_width() in (512, 256, 1)
        assert lib.pcd_attention_simd_width() == BITS[lib.pcd_cpu_kernels_path(PATHS["auto"])]
    else:
        assert lib is None and note.startswith("off: ")


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_native_threads_give_identical_results(lib, threads):
    rng = np.random.default_rng(7)
    q, k, v = _qkv(rng, 1, 9, 3, 300, 700)
    with K.active(True, threads=1):
        one = np.asarray(K.sdpa(q, k, v, None, 0.2, "causal"))
    with K.active(True, threads=threads):
        many = np.asarray(K.sdpa(q, k, v, None, 0.2, "causal"))
    # each block is computed the same way whichever thread takes it: bit-identical
    assert np.array_equal(one, many)
    np.testing.assert_allclose(many, reference(q, k, v, 0.2, "causal"), atol=2e-5)


def test_native_reads_strided_views_without_copies_going_wrong(lib):
    """Queries transposed from (B, L, H, D) and keys sliced from a longer cache buffer,
    as mlx-lm's attention and KV cache hand them over."""
    rng = np.random.default_rng(8)
    f = np.float32
    q = mx.array((rng.normal(size=(1, 150, 9, 32)) * 3).astype(f)).transpose(0, 2, 1, 3)
    kbuf = mx.array(rng.normal(size=(1, 3, 512, 32)).astype(f))
    vbuf = mx.array(rng.normal(size=(1, 3, 512, 32)).astype(f))
    k, v = kbuf[:, :, :400, :], vbuf[:, :, :400, :]
    assert not np.asarray(k).flags.c_contiguous and not np.asarray(q).flags.c_contiguous
    with K.active(True, threads=2):
        got = np.asarray(K.sdpa(q, k, v, None, 0.2, "causal"))
    np.testing.assert_allclose(got, reference(q, k, v, 0.2, "causal"), atol=2e-5)


def test_native_is_used_and_numpy_is_the_fallback(lib, monkeypatch):
    rng = np.random.default_rng(9)
    q, k, v = _qkv(rng, 1, 9, 3, 40, 300)
    seen = []
    real = K._native_sdpa
    monkeypatch.setattr(K, "_native_sdpa", lambda *a: seen.append(1) or real(*a))
    with K.active(True):
        K.sdpa(q, k, v, None, 0.2, "causal")
    assert seen == [1]
    monkeypatch.setattr(K, "_native", False)  # e.g. no compiler: the numpy path runs
    with K.active(True):
        got = np.asarray(K.sdpa(q, k, v, None, 0.2, "causal"))
    assert seen == [1]
    np.testing.assert_allclose(got, reference(q, k, v, 0.2, "causal"), atol=2e-5)


def _paths(lib, d=None):
    """The SIMD code paths this CPU can run, widest first (the scalar one always); for
    attention with a head size `d` the tiles take (a multiple of 32), the AMX path's bf16
    scores first where it runs."""
    names = ("avx512", "avx2", "scalar")
    if d is not None and d % 32 == 0:
        names = ("amx", *names)
    return [PATHS[n] for n in names if lib.pcd_cpu_kernels_path(PATHS[n]) == PATHS[n]]


def _bf16(x):
    """x rounded to bfloat16 (to nearest even), as float32."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def _as_scored(p, q, k):
    """The queries and keys whose float64 products path `p`'s scores sum: on the AMX
    path their bf16 roundings."""
    return (_bf16(q), _bf16(k)) if p == PATHS["amx"] else (q, k)


def _row(arr):
    return arr.ctypes.data_as(ctypes.c_void_p).value


@pytest.mark.parametrize(
    "n,width", [(1, 1), (15, 16), (16, 16), (17, 40), (1552, 1552), (333, 700)]
)
def test_softmax_row_on_every_code_path(lib, n, width):
    rng = np.random.default_rng(n)
    x = (rng.normal(size=width) * 30).astype(np.float32)
    x[: n // 3] -= 200.0  # far below the max: exp underflows to exactly 0
    madd = np.where(rng.random(width) > 0.3, 0.0, np.finfo(np.float32).min).astype(np.float32)
    madd[int(np.argmax(x[:n]))] = 0.0  # the row keeps its maximum
    for with_mask in (False, True):
        m = madd if with_mask else np.zeros(width, np.float32)
        xm = x[:n] + m[:n]  # float32, as the kernel adds and subtracts
        z = (xm - xm.max()).astype(np.float64)
        want = np.exp(z)
        for p in _paths(lib):
            row = x.copy()
            total = lib.pcd_softmax_row(p, _row(row), _row(madd) if with_mask else None, n, width)
            # below e^-87 (1.6e-38, under the normal floats) the kernel gives exactly 0
            np.testing.assert_allclose(row[:n], want, rtol=3e-7, atol=2e-38, err_msg=f"path {p}")
            assert np.all(row[n:] == 0.0), f"path {p} left masked keys"
            assert abs(total - want.sum()) <= 1e-6 * want.sum(), f"path {p}"
            assert np.all(row[:n][z < -87.0] == 0.0)
    assert lib.pcd_softmax_row(99, _row(x.copy()), None, n, width) == -1.0  # no such path
    # a path these kernels are not built for
    assert lib.pcd_softmax_row(PATHS["avxvnni"], _row(x.copy()), None, n, width) == -1.0


def _attend(lib, path, q, k, v, mask, threads=1, block=K.BLOCK_ROWS, causal=0):
    """`pcd_attention_path` on float32 numpy arrays (B = 1); mask additive (Lq, S) or None."""
    _, h, lq, d = q.shape
    kh, s = k.shape[1], k.shape[2]
    out = np.full((1, h, lq, d), np.nan, np.float32)
    strides = [h * lq * d, lq * d, d, kh * s * d, s * d, d, kh * s * d, s * d, d]
    rc = lib.pcd_attention_path(
        path, _row(q), _row(k), _row(v), _row(out), (ctypes.c_int64 * 9)(*strides),
        None if mask is None else _row(mask), 0, 1, h, kh, lq, s, d, 0.125, causal, block,
        threads,
    )  # fmt: skip
    assert rc == 0, f"path {path}"
    return out


@pytest.mark.parametrize("d", [64, 128, 40])
def test_a_query_attends_the_same_whatever_masked_keys_share_its_call(lib, d):
    """A packed pass puts a candidate's tokens among other candidates' (masked) keys; a
    pruned pass or another thread count puts them elsewhere. A query's output must be
    bit-identical to the one it gets alone after the prefix (one prompt per candidate):
    8-bit activations downstream turn a float32 rounding difference into a whole step."""
    rng = np.random.default_rng(d)
    f, neg = np.float32, np.finfo(np.float32).min
    h, kh, past, chain = 6, 2, 333, 7
    pre_k, pre_v = (rng.normal(size=(1, kh, past, d)).astype(f) for _ in range(2))
    ck, cv = (rng.normal(size=(1, kh, chain, d)).astype(f) for _ in range(2))
    cq = (rng.normal(size=(1, h, chain, d)) * 3).astype(f)
    # alone: the prefix, then the chain causally (the reference: one prompt per candidate)
    alone_k, alone_v = np.concatenate([pre_k, ck], 2), np.concatenate([pre_v, cv], 2)
    sees = np.arange(chain)[:, None] >= np.arange(chain)[None, :]
    causal_mask = np.where(sees, 0.0, neg).astype(f)
    alone_mask = np.concatenate([np.zeros((chain, past), f), causal_mask], 1)
    # packed: the chain's tokens scattered among 90 other tokens, which it must not see
    n = 97
    at = np.sort(rng.choice(n, size=chain, replace=False))
    pk, pv = (rng.normal(size=(1, kh, n, d)).astype(f) for _ in range(2))
    pq = (rng.normal(size=(1, h, n, d)) * 3).astype(f)
    pk[:, :, at], pv[:, :, at], pq[:, :, at] = ck, cv, cq
    keep = rng.random((n, n)) > 0.5
    keep[at] = False
    keep[np.ix_(at, at)] = causal_mask == 0
    packed_mask = np.concatenate([np.zeros((n, past), f), np.where(keep, 0.0, neg).astype(f)], 1)
    packed_k, packed_v = np.concatenate([pre_k, pk], 2), np.concatenate([pre_v, pv], 2)
    for p in _paths(lib, d):
        alone = _attend(lib, p, cq, alone_k, alone_v, alone_mask)
        # the same rows from the causal code path (a prefill): identical too
        causal = _attend(lib, p, cq, alone_k, alone_v, None, causal=1)
        assert np.array_equal(alone, causal), f"path {p}"
        for threads, block in ((1, K.BLOCK_ROWS), (2, 16), (3, 5)):
            packed = _attend(lib, p, pq, packed_k, packed_v, packed_mask, threads, block)
            assert np.array_equal(packed[:, :, at], alone), f"path {p}, {threads} threads"
        sq, sk = _as_scored(p, cq, alone_k)
        want = reference(mx.array(sq), mx.array(sk), mx.array(alone_v), 0.125, alone_mask)
        np.testing.assert_allclose(alone, want, rtol=1e-5, atol=2e-5, err_msg=f"path {p}")


def _attend_split(lib, path, q, k1, v1, k2, v2, mask, threads=1, block=K.BLOCK_ROWS):
    """`pcd_attention_split`: keys k1 then k2 (B = 1), mask additive (Lq, S1 + S2)."""
    _, h, lq, d = q.shape
    kh, s1, s2 = k1.shape[1], k1.shape[2], k2.shape[2]
    out = np.full((1, h, lq, d), np.nan, np.float32)
    strides = [h * lq * d, lq * d, d]
    for s_ in (s1, s1, s2, s2):
        strides += [kh * s_ * d, s_ * d, d]
    rc = lib.pcd_attention_split(
        path, _row(q), _row(k1), _row(v1), _row(k2), _row(v2), s1, _row(out),
        (ctypes.c_int64 * 15)(*strides), _row(mask), 0, 1, h, kh, lq, s1 + s2, d, 0.125,
        block, threads,
    )  # fmt: skip
    assert rc == 0, f"path {path}"
    return out


@pytest.mark.parametrize("d", [64, 128, 40])
def test_a_prefix_read_in_place_gives_the_joined_keys_numbers(lib, d):
    """A fields pass hands the kernel the cached prefix K/V and its own apart
    (`PassCache.prefix_apart`) instead of copying them into one array: the output must be
    bit-identical to one call over the joined keys, on every code path, thread count and
    block size, for a prefix that ends mid-tile."""
    rng = np.random.default_rng(100 + d)
    f, neg = np.float32, np.finfo(np.float32).min
    h, kh, past, n = 6, 2, 1037, 45
    k1, v1 = (rng.normal(size=(1, kh, past, d)).astype(f) for _ in range(2))
    k2, v2 = (rng.normal(size=(1, kh, n, d)).astype(f) for _ in range(2))
    q = (rng.normal(size=(1, h, n, d)) * 3).astype(f)
    keep = rng.random((n, past + n)) > 0.3
    keep[:, :past] = rng.random((n, past)) > 0.05  # some prefix keys hidden too
    mask = np.where(keep, 0.0, neg).astype(f)
    joined_k, joined_v = np.concatenate([k1, k2], 2), np.concatenate([v1, v2], 2)
    for p in _paths(lib, d):
        want = _attend(lib, p, q, joined_k, joined_v, mask)
        for threads, block in ((1, K.BLOCK_ROWS), (2, 16), (3, 7)):
            got = _attend_split(lib, p, q, k1, v1, k2, v2, mask, threads, block)
            assert np.array_equal(got, want), f"path {p}, threads {threads}, block {block}"
        sq, sk = _as_scored(p, q, joined_k)
        np.testing.assert_allclose(want, reference(sq, sk, joined_v, 0.125, mask), atol=3e-5)
    bad = np.zeros((1, h, n, d), f)
    assert lib.pcd_attention_split(  # a causal split is refused, as is a missing part
        0, _row(q), _row(k1), _row(v1), None, None, past, _row(bad),
        (ctypes.c_int64 * 15)(*[0] * 15), _row(mask), 0, 1, h, kh, n, past + n, d, 0.125, 16, 1,
    ) == 1  # fmt: skip


def _attend_parts(
    lib, path, q, parts, mask, mask_from=0, threads=1, block=K.BLOCK_ROWS, causal=0, row_end=None
):
    """`pcd_attention_parts` (B = 1) over (k, v) parts, mask additive (Lq, S) or None,
    `row_end` (Lq,) int32 or None."""
    _, h, lq, d = q.shape
    kh = parts[0][0].shape[1]
    out = np.full((1, h, lq, d), np.nan, np.float32)
    strides = [h * lq * d, lq * d, d]
    for k, _ in parts:
        strides += [kh * k.shape[2] * d, k.shape[2] * d, d] * 2
    n = len(parts)
    rc = lib.pcd_attention_parts(
        path, _row(q), n, (ctypes.c_void_p * n)(*[_row(k) for k, _ in parts]),
        (ctypes.c_void_p * n)(*[_row(v) for _, v in parts]),
        (ctypes.c_int * n)(*[k.shape[2] for k, _ in parts]), _row(out),
        (ctypes.c_int64 * len(strides))(*strides), None if mask is None else _row(mask), 0,
        mask_from, None if row_end is None else _row(row_end), 0, 1, h, kh, lq, d, 0.125, causal,
        block, threads,
    )  # fmt: skip
    assert rc == 0, f"path {path}"
    return out


@pytest.mark.parametrize("d", [64, 40])
def test_a_mask_open_over_the_prefix_is_not_read_there(lib, d):
    """A pass's mask leaves the cached prefix open to every query: the kernel skips its
    columns before `mask_from` (never reading them) with the numbers of a full read, for
    keys in one part or two, on every code path, thread count and block size."""
    rng = np.random.default_rng(200 + d)
    f, neg = np.float32, np.finfo(np.float32).min
    h, kh, past, n = 6, 2, 1037, 45
    k1, v1 = (rng.normal(size=(1, kh, past, d)).astype(f) for _ in range(2))
    k2, v2 = (rng.normal(size=(1, kh, n, d)).astype(f) for _ in range(2))
    q = (rng.normal(size=(1, h, n, d)) * 3).astype(f)
    mask = np.zeros((n, past + n), f)
    mask[:, past:] = np.where(rng.random((n, n)) > 0.3, 0.0, neg)
    mask[:, past - 3] = neg  # the last prefix columns are not all open: from = past - 3
    mask[:5, past - 3] = 0.0
    joined = [(np.concatenate([k1, k2], 2), np.concatenate([v1, v2], 2))]
    poisoned = mask.copy()
    poisoned[:, : past - 3] = np.nan  # read, these would turn every output into nan
    for p in _paths(lib, d):
        want = _attend(lib, p, q, *joined[0], mask)
        for threads, block in ((1, K.BLOCK_ROWS), (2, 16), (3, 7)):
            for parts in (joined, [(k1, v1), (k2, v2)]):
                got = _attend_parts(lib, p, q, parts, poisoned, past - 3, threads, block)
                assert np.array_equal(got, want), f"path {p}, {len(parts)} parts, {threads}"
    bad = np.zeros((1, h, n, d), f)
    one = (ctypes.c_void_p * 1)(_row(k1))
    assert lib.pcd_attention_parts(  # a mask_from past the keys is refused
        0, _row(q), 1, one, one, (ctypes.c_int * 1)(past), _row(bad),
        (ctypes.c_int64 * 9)(*[0] * 9), _row(mask), 0, past + 1, None, 0, 1, h, kh, n, d, 0.125, 0,
        16, 1,
    ) == 1  # fmt: skip
    # the Python side finds the open columns once per mask object
    bool_mask = mx.array(mask == 0)
    madd, open_cols = K._additive_mask_from(bool_mask, n, past + n)
    assert open_cols == past - 3 and np.array_equal(madd.reshape(n, -1), mask)
    assert K._additive_mask_from(mx.array(np.ones((n, past + n), bool)), n, past + n)[1] == past + n


@pytest.mark.parametrize("d", [64, 128, 40])
def test_a_masked_tail_is_neither_scored_nor_read(lib, d):
    """A fused prefill and fields chunk (`prefill_and_pack`): context rows causal after a
    prefix, then chunk rows that see the prefix, the context and some chunk tokens. With
    each row's end (`_mask_plan`), the kernel stops at the row's last open key: the
    numbers of the full read bit for bit, and keys past every end are never read (NaN
    there would spread), on every code path, thread count and block size."""
    rng = np.random.default_rng(300 + d)
    f, neg = np.float32, np.finfo(np.float32).min
    h, kh, past, ctx, chunk = 6, 2, 37, 150, 23
    s = past + ctx + chunk
    k, v = (rng.normal(size=(1, kh, s, d)).astype(f) for _ in range(2))
    q = (rng.normal(size=(1, h, ctx + chunk, d)) * 3).astype(f)
    mask = np.full((ctx + chunk, s), neg, f)
    mask[:, :past] = 0.0
    mask[:ctx, past : past + ctx] = np.where(np.tril(np.ones((ctx, ctx), bool)), 0.0, neg)
    mask[ctx:, past : past + ctx] = 0.0
    mask[ctx:, past + ctx :] = np.where(rng.random((chunk, chunk)) > 0.5, 0.0, neg)
    mask[ctx:, past + ctx + chunk - 3 :] = neg  # no row sees the last three keys
    mask[ctx + 2, past + ctx :] = neg  # one chunk row sees no chunk key
    madd, open_cols, row_end = K._mask_plan(mx.array(mask == 0), ctx + chunk, s)
    assert open_cols == past + 1 and np.array_equal(madd.reshape(ctx + chunk, s), mask)
    ends = row_end.reshape(-1)
    assert list(ends[:ctx]) == list(range(past + 1, past + ctx + 1))
    assert ends[ctx + 2] == past + ctx and ends.max() <= s - 3
    pk, pv = k.copy(), v.copy()
    pk[:, :, s - 3 :] = np.nan
    pv[:, :, s - 3 :] = np.nan
    parts = [
        tuple(np.ascontiguousarray(x[:, :, cut]) for x in (pk, pv))
        for cut in (slice(0, past), slice(past, s))
    ]
    for p in _paths(lib, d):
        want = _attend(lib, p, q, k, v, mask)
        for threads, block in ((1, K.BLOCK_ROWS), (2, 16), (3, 7)):
            got = _attend_parts(lib, p, q, parts, mask, past, threads, block, row_end=ends)
            assert np.array_equal(got, want), f"path {p}, {threads} threads, block {block}"
    bad = np.zeros_like(q)
    one = (ctypes.c_void_p * 1)(_row(k))
    for wrong in (0, s + 1):  # a row end outside [1, S] is refused
        ends2 = ends.copy()
        ends2[5] = wrong
        assert lib.pcd_attention_parts(
            0, _row(q), 1, one, one, (ctypes.c_int * 1)(s), _row(bad),
            (ctypes.c_int64 * 9)(*[0] * 9), _row(mask), 0, 0, _row(ends2), 0, 1, h, kh, ctx + chunk,
            d, 0.125, 0, 16, 1,
        ) == 1  # fmt: skip


@pytest.mark.parametrize("d", [64, 128, 40])
def test_keys_in_parts_give_the_joined_numbers_causal_too(lib, d):
    """A prefill after a cached prefix reads it in place, and a later pass reads the
    prefix and the prefill's rows as two parts: every split, causal or masked, gives the
    joined keys' numbers to the bit, a part boundary among the queries included."""
    rng = np.random.default_rng(300 + d)
    f, neg = np.float32, np.finfo(np.float32).min
    h, kh, s, lq = 6, 2, 1200, 70
    k, v = (rng.normal(size=(1, kh, s, d)).astype(f) for _ in range(2))
    q = (rng.normal(size=(1, h, lq, d)) * 3).astype(f)
    mask = np.where(rng.random((lq, s)) > 0.2, 0.0, neg).astype(f)

    def cut(*ends):
        bounds = [0, *ends, s]
        return [
            (np.ascontiguousarray(k[:, :, a:e]), np.ascontiguousarray(v[:, :, a:e]))
            for a, e in itertools.pairwise(bounds)
        ]

    splits = [cut(777), cut(500, s - lq), cut(300, s - lq + 9), cut(1, 2, s - 1)]
    for p in _paths(lib, d):
        for causal, m in ((1, None), (0, mask)):
            want = _attend(lib, p, q, k, v, m, causal=causal)
            for parts in splits:
                for threads, block in ((1, K.BLOCK_ROWS), (2, 16), (3, 7)):
                    got = _attend_parts(lib, p, q, parts, m, 0, threads, block, causal)
                    assert np.array_equal(got, want), (p, causal, len(parts), threads, block)


def test_a_warm_pass_reads_the_prefix_and_the_rows_in_place(lib, monkeypatch):
    """With the schema part cached, the prefill reads it in place and keeps its rows
    apart, joined lazily (`passes.join_kv`): the fields pass after it is handed both
    parts, copies neither, and scores every edge as the joined keys do, to the bit."""
    d = tiny_decider(0)
    passes, engine = d.engine.passes, d.engine
    plan = engine.plan(compile_schema({"team": {"type": "enum", "choices": list("abcdefgh")}}))
    rows = [engine.encode_ids("Route this ticket about a double charge. " * 6) + plan.tail_ids]
    seen = []
    real = K._native_sdpa
    monkeypatch.setattr(
        K, "_native_sdpa", lambda *a: seen.append(len(a[6]) if len(a) > 6 else 0) or real(*a)
    )
    results = []
    for apart in (True, False):
        passes.prefix_apart = apart
        with K.active(True, every_size=True):
            prefix = passes.prefill([plan.head_ids], None)
            kv = passes.prefill(rows, prefix)
            assert (P.kv_parts(*kv[0])[0][0] is prefix[0][0]) is apart
            seen.clear()
            valid = [len(plan.head_ids) + len(rows[0])]
            results.append(passes.packed(plan, kv, valid, plan.chunks))
        assert set(seen) == ({2} if apart else {0}), seen
        results.append([np.asarray(x) for pair in kv for x in pair])
    for got, want in zip(results[0], results[2]):
        for (fa, ea, la), (fb, eb, lb) in zip(got, want):
            assert fa == fb and np.array_equal(ea, eb) and np.array_equal(la, lb)
    for got, want in zip(results[1], results[3]):  # the kept K/V, read whole, are equal too
        assert np.array_equal(got, want)


def test_lazily_joined_kv_remember_their_parts_while_they_live():
    """`join_kv` joins without copying until something reads the result; `kv_parts`
    finds the parts of exactly that pair, flattened, and forgets them with it."""
    a, b, c = (mx.array(np.full((1, 2, n, 4), n, np.float32)) for n in (3, 5, 2))
    k, v = P.join_kv([(a, a), (b, b)])
    assert [x[0] is y and x[1] is y for x, y in zip(P.kv_parts(k, v), (a, b))] == [True] * 2
    other = P.kv_parts(k, a)  # another pairing is not the joined pair
    assert len(other) == 1 and other[0][0] is k and other[0][1] is a
    k2, v2 = P.join_kv([(k, v), (c, c)])  # a join of a join is flat
    assert [x[0] is y for x, y in zip(P.kv_parts(k2, v2), (a, b, c))] == [True] * 3
    assert np.array_equal(np.asarray(k2)[0, 0, :, 0], [3] * 3 + [5] * 5 + [2] * 2)
    one = P.join_kv([(a, b)])  # one part is itself
    assert one[0] is a and one[1] is b
    before = len(P._JOINED)
    del k2, v2
    gc.collect()
    assert len(P._JOINED) == before - 1


def test_a_fields_pass_reads_the_prefix_in_place_with_the_same_answers(lib, monkeypatch):
    """The engine turns `prefix_apart` on where its model's attention is `sdpa`; its
    fields pass then never copies the prefix, and every probability is what the joined
    keys give, to the bit."""
    d = tiny_decider(0)
    assert d.engine.passes.prefix_apart is True
    schema = {
        "team": {"type": "enum", "choices": ["billing", "bill_disputes", "tech", "sales"]},
        "urgent": {"type": "boolean"},
    }
    ctx = "My card was charged twice for the same order and I need a refund. " * 8
    calls = []
    real = K._native_sdpa
    monkeypatch.setattr(
        K,
        "_native_sdpa",
        lambda *a: (len(a) > 6 and a[6] is not None and calls.append(1)) or real(*a),
    )
    apart = d.decide(schema, ctx)
    assert calls, "the fields pass did not read the prefix in place"
    d.engine.passes.prefix_apart = False
    d.engine.clear_cache()
    n = len(calls)
    joined = d.decide(schema, ctx)
    assert len(calls) == n
    for name in apart.fields:
        assert apart.fields[name].log_scores == joined.fields[name].log_scores, name
    # a model whose attention is not `sdpa` never gets its prefix apart
    assert K.takes_prefix_apart(object()) is False


def test_every_size_sends_small_calls_through_the_kernels_too(lib, monkeypatch):
    """Engines over file-encoded matrices ask for every call size (`Engine.every_size`):
    a two-row call must then take the same kernel as a large one."""
    rng = np.random.default_rng(11)
    q, k, v = _qkv(rng, 1, 3, 1, 2, 40)  # 240 scores: below MIN_SCORES
    g = mx.array(rng.normal(size=(2, 50)).astype(np.float32))
    seen = []
    real = K._native_sdpa
    monkeypatch.setattr(K, "_native_sdpa", lambda *a: seen.append("sdpa") or real(*a))
    with K.active(True):
        K.sdpa(q, k, v, None, 0.2, "causal")
        small = np.asarray(K.swiglu(g, g))
    assert seen == []  # MLX's own ops: faster at this size
    with K.active(True, every_size=True):
        K.sdpa(q, k, v, None, 0.2, "causal")
        every = np.asarray(K.swiglu(g, g))
    assert seen == ["sdpa"]
    out = np.empty((2, 50), np.float32)
    gn = np.asarray(g)
    assert lib.pcd_swiglu(_row(gn), _row(gn), _row(out), gn.size, 1, 0) == 0
    assert np.array_equal(every, out)  # the native SwiGLU's own numbers
    np.testing.assert_allclose(small, every, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [0, 5, 16, 1000, 16384 * 3 + 7])
def test_swiglu_on_every_code_path_and_thread_count(lib, n):
    rng = np.random.default_rng(n)
    g = (rng.normal(size=n) * 12).astype(np.float32)
    if n > 4:
        g[:4] = [0.0, -0.0, 88.0, -120.0]  # zero, both signs, saturated on both sides
    x = rng.normal(size=n).astype(np.float32)
    gd = g.astype(np.float64)
    want = gd / (1.0 + np.exp(-gd)) * x
    results = []
    for p in _paths(lib):
        for threads in (1, 2):
            out = np.full(n, np.nan, np.float32)
            assert lib.pcd_swiglu(_row(g), _row(x), _row(out), n, threads, p) == 0
            np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-30, err_msg=f"path {p}")
            results.append(out)
    for other in results[1:2]:  # threads never change the numbers
        assert np.array_equal(results[0], other)


def test_swiglu_dispatch_uses_the_native_kernel(lib, monkeypatch):
    rng = np.random.default_rng(4)
    g = mx.array((rng.normal(size=(1, 64, 1024)) * 4).astype(np.float32))
    x = mx.array(rng.normal(size=(1, 64, 1024)).astype(np.float32))
    with K.active(True, threads=2):
        native = np.asarray(K.swiglu(g, x))
    monkeypatch.setattr(K, "_native", False)
    with K.active(True):
        numpy_path = np.asarray(K.swiglu(g, x))
    np.testing.assert_allclose(native, numpy_path, rtol=2e-6, atol=1e-7)
    assert not np.array_equal(native, numpy_path)  # really two different code paths


def test_native_can_be_turned_off_by_environment(monkeypatch):
    from pcd_tools.engine.kernels.bindings import load_cpu_kernels

    monkeypatch.setenv("PCD_NATIVE_ATTENTION", "0")
    lib, note = load_cpu_kernels(fast_blas=True)  # the switch is read first
    assert lib is False and note == "off: PCD_NATIVE_ATTENTION=0"


def test_compile_c_reports_a_failed_build(tmp_path, monkeypatch):
    from pcd_tools.engine.host import build as N
    from pcd_tools.errors import NativeBuildError

    monkeypatch.setenv("PCD_CACHE_DIR", str(tmp_path))
    bad = tmp_path / "bad.c"
    bad.write_text("int f(void) { return 1 }\n")  # a syntax error
    if shutil.which("cc") or shutil.which("gcc"):
        with pytest.raises(NativeBuildError, match=r"compiling bad\.c with .* failed"):
            N.compile_c(bad, "bad")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.raises(NativeBuildError, match=r"compiling bad\.c with .*no-such-compiler failed"):
        N.compile_c(bad, "bad2")
    assert not list((tmp_path / "native").glob("*.so"))  # nothing half-written is left


def test_openblas_idle_threads_are_told_to_sleep_unless_the_user_chose():
    code = textwrap.dedent(
        """
        import os, sys
        from pcd_tools.engine.host.blas import setup_blas
        info = setup_blas()
        print(os.environ.get("OPENBLAS_THREAD_TIMEOUT"), info.bound_before_import)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    value, bound = out.stdout.split()
    if bound == "True":
        assert value == "4"
    env["OPENBLAS_THREAD_TIMEOUT"] = "12"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split()[0] == "12"


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize(
    "b,h,lq,offset",
    [(1, 9, 578, 0), (1, 3, 130, 5100), (2, 9, 85, 7000), (3, 2, 48, 123)],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_native_rope_is_bit_identical_to_mlx(lib, traditional, b, h, lq, offset, threads):
    """The kernel reproduces MLX's own float32 rotation exactly: the same table, the same
    rounded products (no fused multiply-adds), from a strided (transposed) view."""
    import mlx.nn as nn

    r = nn.RoPE(64, traditional=traditional, base=100000.0)
    rng = np.random.default_rng(lq)
    x = mx.array(rng.standard_normal((b, lq, h, 64)).astype(np.float32)).transpose(0, 2, 1, 3)
    with K.active(True, threads):
        got = K.rope(r, x, offset)
    assert got is not None
    assert got.shape == x.shape
    assert np.array_equal(np.asarray(got), np.asarray(r(x, offset=offset)))


@pytest.mark.parametrize("traditional", [False, True])
def test_native_rope_per_token_and_per_row_positions(lib, traditional):
    """Per-token (B, L) positions through `PerTokenRoPE` and per-row (B,) offsets."""
    import mlx.nn as nn

    from pcd_tools.engine.passes.forward import PerTokenRoPE

    r = nn.RoPE(64, traditional=traditional, base=10000.0)
    wrapped = PerTokenRoPE(r)
    rng = np.random.default_rng(1)
    x = mx.array(rng.standard_normal((2, 85, 9, 64)).astype(np.float32)).transpose(0, 2, 1, 3)
    pos = mx.array(rng.integers(0, 8000, size=(2, 85)).astype(np.int32))
    want = np.asarray(wrapped(x, offset=pos))
    with K.active(True, 2):
        assert K.rope(r, x, pos) is not None
        got = np.asarray(wrapped(x, offset=pos))
        rows = mx.array(np.array([3, 4000], dtype=np.int32))
        assert np.array_equal(np.asarray(K.rope(r, x, rows)), np.asarray(r(x, offset=rows)))
    assert np.array_equal(got, want)
    # Distinct positions do rotate differently (the table is not shared by mistake).
    other = mx.array(np.asarray(pos) + 1)
    with K.active(True, 2):
        assert not np.array_equal(np.asarray(wrapped(x, offset=other)), got)


def test_native_rope_leaves_other_calls_to_mlx(lib):
    """Inactive, small, non-float32 or a RoPE of another kind: None (MLX's own rope runs)."""
    import mlx.nn as nn

    r = nn.RoPE(64, base=10000.0)
    x = mx.zeros((1, 9, 200, 64))
    assert K.rope(r, x, 0) is None  # not active
    with K.active(True):
        assert K.rope(r, mx.zeros((1, 9, 4, 64)), 0) is None  # small: a decode step
        assert K.rope(r, x.astype(mx.float16), 0) is None

        class Scaled(nn.RoPE):  # e.g. Llama-3's or YaRN's: their own frequencies
            pass

        assert K.rope(Scaled(64), x, 0) is None
        assert K.rope(r, x, 0) is not None
