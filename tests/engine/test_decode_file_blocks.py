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

from pcd_tools.engine.fast_decode import NativeDecoder  # noqa: E402
from pcd_tools.engine.native import DecodeLin, load_decode_kernels  # noqa: E402
from tests.engine.test_qweights import encoded  # noqa: E402

pytestmark = pytest.mark.engine

TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
PATHS = {"avx512": 512, "avx2": 256, "scalar": 1}


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

    from pcd_tools.engine.generate import forward
    from pcd_tools.engine.gguf import load_gguf
    from pcd_tools.engine.passes import Passes
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
