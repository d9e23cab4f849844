"""The native decode steps over a matrix's own GGUF blocks (`_decode.c`, "The file's
blocks"), against gguf-py and a float64 reference, on every code path of this CPU:

- a row decodes to exactly the file's weights (gguf-py's float32, bit for bit), for each
  of the ten block types the steps read;
- the product of B rows with the matrix equals float64 arithmetic on those weights to
  float32 rounding, in a stored row order, with a bias, for B from 1 to past a group;
- a row's result does not depend on the batch around it;
- a tiny GGUF model kept encoded decodes from its blocks as the float32 kernel does on
  its dense load (llama's permuted Q/K rows included);
- malformed matrices are refused.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
gguf = pytest.importorskip("gguf")

from gguf import GGML_QUANT_SIZES  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402

from pcd_tools.engine.decode.native_steps import NativeDecoder  # noqa: E402
from pcd_tools.engine.kernels.bindings import DecodeLin, load_decode_kernels  # noqa: E402
from pcd_tools.engine.kernels.paths import PATHS as ALL_PATHS  # noqa: E402
from tests.engine.test_qweights import encoded  # noqa: E402

pytestmark = pytest.mark.engine

TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
PATHS = {n: ALL_PATHS[n] for n in ("avx512", "avx2", "scalar")}


@pytest.fixture(scope="module")
def lib():
    return load_decode_kernels()


def _paths(lib):
    return [name for name, p in PATHS.items() if lib.pcd_decode_path(p) == p]


def _lin(raw, cols, type_name, order=None, bias=None):
    rows = raw.shape[0] if order is None else len(order)
    return DecodeLin(
        w=raw.ctypes.data,
        bias=None if bias is None else bias.ctypes.data,
        order=None if order is None else order.ctypes.data,
        row_bytes=raw.shape[1],
        rows=rows,
        cols=cols,
        type=int(T[type_name]),
    )


def _weights(raw, name, cols):
    return gguf.quants.dequantize(raw, T[name]).reshape(raw.shape[0], cols).astype(np.float32)


def test_every_type_the_steps_read_is_declared(lib):
    for name in TYPES:
        assert lib.pcd_decode_file_block(int(T[name])) == GGML_QUANT_SIZES[T[name]][0], name
    for other in ("F32", "F16", "BF16", "IQ4_NL"):
        assert lib.pcd_decode_file_block(int(T[other])) == 0, other


@pytest.mark.parametrize("name", TYPES)
def test_rows_decode_to_exactly_the_files_weights(lib, name):
    cols = 512
    raw = np.ascontiguousarray(encoded(name, 12, cols, seed=5))
    want = _weights(raw, name, cols)
    assert np.isfinite(want).all()
    idx = np.array([11, 0, 5, 5], np.int32)
    out = np.empty((len(idx), cols), np.float32)
    lin = _lin(raw, cols, name)
    assert (
        lib.pcd_decode_dequant_rows(ctypes.byref(lin), idx.ctypes.data, len(idx), out.ctypes.data)
        == 0
    )
    np.testing.assert_array_equal(out.view(np.uint32), want[idx].view(np.uint32))


@pytest.mark.parametrize("name", TYPES)
def test_the_product_equals_float64_on_every_path(lib, name):
    cols, stored = 768, 19
    raw = np.ascontiguousarray(encoded(name, stored, cols, seed=9))
    w = _weights(raw, name, cols).astype(np.float64)
    rng = np.random.default_rng(1)
    order = rng.permutation(stored).astype(np.int32)[:17]  # 17 rows, in a stored order
    bias = rng.standard_normal(len(order)).astype(np.float32)
    lin = _lin(raw, cols, name, order, bias)
    for path in _paths(lib):
        for B in (1, 3, 8, 9):
            x = rng.standard_normal((B, cols)).astype(np.float32)
            y = np.empty((B, len(order)), np.float32)
            rc = lib.pcd_decode_matvec(
                ctypes.byref(lin), x.ctypes.data, B, y.ctypes.data, PATHS[path]
            )
            assert rc == 0
            want = x.astype(np.float64) @ w[order].T + bias
            scale = np.abs(x).astype(np.float64) @ np.abs(w[order]).T + 1.0
            assert (np.abs(y - want) / scale).max() < 1e-6, (path, B)
            for b in range(B):  # a row's result does not depend on its batch
                one = np.empty((1, len(order)), np.float32)
                lib.pcd_decode_matvec(
                    ctypes.byref(lin), x[b : b + 1].ctypes.data, 1, one.ctypes.data, PATHS[path]
                )
                np.testing.assert_array_equal(one[0], y[b])


@pytest.mark.parametrize("name", TYPES)
def test_every_path_multiplies_exactly_the_files_weights(lib, name):
    """One-hot rows pick single weights out of the product (a product by 1 and sums of
    zeros are exact), so each path's decoder must give gguf-py's weights to the bit."""
    cols = 512
    raw = np.ascontiguousarray(encoded(name, 6, cols, seed=2))
    want = _weights(raw, name, cols)
    lin = _lin(raw, cols, name)
    picks = np.array([0, 1, 15, 16, 17, 31, 200, 511])
    x = np.zeros((len(picks), cols), np.float32)
    x[np.arange(len(picks)), picks] = 1.0
    for path in _paths(lib):
        y = np.empty((len(picks), 6), np.float32)
        assert (
            lib.pcd_decode_matvec(
                ctypes.byref(lin), x.ctypes.data, len(picks), y.ctypes.data, PATHS[path]
            )
            == 0
        )
        np.testing.assert_array_equal(y, want[:, picks].T, err_msg=path)


def test_malformed_matrices_are_refused(lib):
    raw = np.ascontiguousarray(encoded("Q4_K", 4, 512))
    x = np.ones((1, 512), np.float32)
    y = np.empty((1, 4), np.float32)
    bad = [
        _lin(raw, 500, "Q4_K"),  # not whole blocks
        DecodeLin(
            w=raw.ctypes.data, row_bytes=raw.shape[1] - 1, rows=4, cols=512, type=int(T.Q4_K)
        ),
        DecodeLin(w=raw.ctypes.data, row_bytes=raw.shape[1], rows=4, cols=512, type=int(T.F16)),
    ]
    for lin in bad:
        assert lib.pcd_decode_matvec(ctypes.byref(lin), x.ctypes.data, 1, y.ctypes.data, 0) == 1
    idx = np.array([4], np.int32)  # out of range
    good = _lin(raw, 512, "Q4_K")
    assert lib.pcd_decode_dequant_rows(ctypes.byref(good), idx.ctypes.data, 1, y.ctypes.data) == 1


@pytest.mark.parametrize(
    "arch,tied,types",
    [
        ("llama", True, {"embed": T.Q8_0, "other": T.Q4_1}),  # the embedded model's mix
        ("llama", False, {"embed": T.Q5_0, "head": T.Q8_0, "other": T.Q4_0}),
        ("qwen2", False, {"embed": T.Q5_1, "head": T.F16, "other": T.Q5_0}),  # F16: a copy
    ],
)
def test_a_tiny_encoded_model_decodes_from_its_blocks(tmp_path, arch, tied, types):
    from mlx_lm.models.cache import make_prompt_cache

    from pcd_tools.engine.decode.generate import forward
    from pcd_tools.engine.load.gguf import load_gguf
    from pcd_tools.engine.passes.forward import Passes
    from tests.engine.test_gguf import hf_weights, write_gguf

    def qtype(name: str) -> T:
        key = {"model.embed_tokens.weight": "embed", "lm_head.weight": "head"}.get(name, "other")
        return types.get(key, types["other"])

    path = write_gguf(tmp_path / "m.gguf", arch, hf_weights(arch, tied=tied, seed=4), qtype=qtype)
    dense, _, _ = load_gguf(path, dtype=mx.float32)
    kept, _, _ = load_gguf(path, encoded=True)
    d_file, d_ref = NativeDecoder(kept, weights="file"), NativeDecoder(dense, wbits=32)
    copied = types.get("head") == T.F16  # not a type the steps read: an 8-bit copy
    assert d_file.mapped_bytes > 0 and d_file.copies == int(copied)
    prompt = [5, 9, 14, 3, 22, 7]
    caches = [make_prompt_cache(m) for m in (kept, dense)]
    forward(Passes(kept, "llama"), prompt, caches[0])
    forward(Passes(dense, "llama"), prompt, caches[1])
    a, b = d_file.stepper([caches[0]], 4), d_ref.stepper([caches[1]], 4)
    for tok in (3, 17, 17, 40):
        got, want = a.step([tok])[0], b.step([tok])[0]
        tol = 5e-2 if copied else 1e-4  # the 8-bit head rounds its weights
        assert np.abs(got - want).max() <= tol * np.abs(want).max(), tok


# --- 8-bit activations (integer dots), `compute="int8"` ---------------------------------

IPATHS = {
    "scalar": ALL_PATHS["scalar"],
    "avx2": ALL_PATHS["avx2"],
    "avx512-vnni": ALL_PATHS["avx512vnni"],
}


def _quantized(lib, x, blk):
    """x as a step quantizes it: int8 q and float32 dx per block of blk, xs per 16."""
    B, cols = x.shape
    q = np.empty((B, cols), np.int8)
    dx = np.empty((B, cols // blk), np.float32)
    xs = np.empty((B, cols // 16), np.float32)
    rc = lib.pcd_decode_quantize_act(
        x.ctypes.data, B, cols, blk, q.ctypes.data, dx.ctypes.data, xs.ctypes.data
    )
    assert rc == 0
    return q, dx, xs


@pytest.mark.parametrize("blk", [32, 256])
def test_activations_are_quantized_per_block_as_the_int8_passes_do(lib, blk):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 512)) * rng.uniform(0.1, 30, (3, 1))).astype(np.float32)
    x[1, :blk] = 0.0  # an all-zero block: dx 0, q 0
    x[2, 5] = 2.5 * (np.abs(x[2, :blk]).max() / 127)  # a tie: rounds away from zero
    q, dx, xs = _quantized(lib, x, blk)
    blocks = x.reshape(3, -1, blk).astype(np.float64)
    want_dx = (np.abs(blocks).max(axis=2) / 127).astype(np.float32)
    np.testing.assert_array_equal(dx, want_dx)
    inv = np.where(want_dx > 0, 1 / np.where(want_dx > 0, want_dx, 1), 0).astype(np.float32)
    r = (x.reshape(3, -1, blk) * inv[..., None]).astype(np.float32)
    want_q = np.clip(np.trunc(r + np.copysign(np.float32(0.5), r)), -127, 127).reshape(3, -1)
    np.testing.assert_array_equal(q, want_q.astype(np.int8))
    assert q[2, 5] == 3 and not q[1, :blk].any() and dx[1, 0] == 0
    sums = q.reshape(3, -1, 16).sum(axis=2)
    np.testing.assert_array_equal(xs, np.repeat(dx, blk // 16, axis=1) * sums.astype(np.float32))
    assert np.abs(q).max() == 127
    for bad in (16, 64):  # only blocks of 32 and 256
        assert (
            lib.pcd_decode_quantize_act(
                x.ctypes.data, 3, 512, bad, q.ctypes.data, dx.ctypes.data, xs.ctypes.data
            )
            == 1
        )


@pytest.mark.parametrize("name", TYPES)
def test_integer_dots_equal_float64_on_the_quantized_activations(lib, name):
    """Every integer kernel here (portable C, AVX2's maddubs, AVX-512 VNNI's dpbusd; the
    fused Q4_K / Q6_K / 32-block ones and the span kernels), in a stored row order with a
    bias: the file's weights times the dequantized 8-bit activations (per 256 for
    K-quants, as llama.cpp's Q8_K; per 32 otherwise) in float64, to float32 rounding, and
    a row's result does not depend on the batch around it."""
    cols, stored = 1536, 21
    raw = np.ascontiguousarray(encoded(name, stored, cols, seed=11))
    w = _weights(raw, name, cols).astype(np.float64)
    rng = np.random.default_rng(2)
    order = rng.permutation(stored).astype(np.int32)[:19]
    bias = rng.standard_normal(len(order)).astype(np.float32)
    lin = _lin(raw, cols, name, order, bias)
    blk = 256 if name.endswith("_K") else 32
    ran = []
    for label, ipath in IPATHS.items():
        for B in (1, 3, 4, 5, 8, 9):
            x = (rng.standard_normal((B, cols)) * 3).astype(np.float32)
            y = np.empty((B, len(order)), np.float32)
            if lib.pcd_decode_matvec8(ctypes.byref(lin), x.ctypes.data, B, y.ctypes.data, 0, ipath):
                break  # not on this CPU
            q, dx, _ = _quantized(lib, x, blk)
            xh = q.astype(np.float64) * np.repeat(dx, blk, axis=1)
            want = xh @ w[order].T + bias
            scale = np.abs(xh) @ np.abs(w[order]).T + 1.0
            assert (np.abs(y - want) / scale).max() < 2e-6, (label, B)
            for b in (0, B - 1):
                one = np.empty((1, len(order)), np.float32)
                lib.pcd_decode_matvec8(
                    ctypes.byref(lin), x[b : b + 1].ctypes.data, 1, one.ctypes.data, 0, ipath
                )
                np.testing.assert_array_equal(one[0], y[b], err_msg=label)
        else:
            ran.append(label)
    assert "scalar" in ran
    for path in _paths(lib):  # each code path's own integer kernel
        x = rng.standard_normal((2, cols)).astype(np.float32)
        y = np.empty((2, len(order)), np.float32)
        assert (
            lib.pcd_decode_matvec8(
                ctypes.byref(lin), x.ctypes.data, 2, y.ctypes.data, PATHS[path], 0
            )
            == 0
        )
        q, dx, _ = _quantized(lib, x, blk)
        want = (q.astype(np.float64) * np.repeat(dx, blk, axis=1)) @ w[order].T + bias
        assert np.abs(y - want).max() < 1e-4 * np.abs(want).max(), path


def test_integer_dots_refuse_what_they_cannot_take(lib):
    raw = np.ascontiguousarray(encoded("Q4_K", 4, 512))
    x = np.ones((1, 512), np.float32)
    y = np.empty((1, 4), np.float32)
    assert (
        lib.pcd_decode_matvec8(
            ctypes.byref(_lin(raw, 512, "Q4_K")), x.ctypes.data, 1, y.ctypes.data, 0, 9
        )
        == 1
    )  # no such kernel
    assert (
        lib.pcd_decode_matvec8(
            ctypes.byref(_lin(raw, 500, "Q4_K")), x.ctypes.data, 1, y.ctypes.data, 0, 1
        )
        == 1
    )  # not whole blocks
    dense = np.ones((4, 512), np.float32)  # integer dots are for file blocks only
    lin = DecodeLin(w=dense.ctypes.data, rows=4, cols=512)
    assert lib.pcd_decode_matvec8(ctypes.byref(lin), x.ctypes.data, 1, y.ctypes.data, 0, 1) == 1
