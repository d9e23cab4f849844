"""The int8 / bf16 kernels over GGUF blocks (`engine.qgemm`) against float64 references.

Weights of every supported type come from `gguf` itself: `gguf.quants.quantize` for the
32-blocks, random valid K-quant blocks (finite scales) checked against
`gguf.quants.dequantize`. The int8 kernels must equal the float64 product of the SAME
quantized activations and the dequantized weights within float32 rounding, and the
scalar path must equal the SIMD paths.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from pcd_tools.errors import InvalidArgumentError

gguf = pytest.importorskip("gguf")
gq = pytest.importorskip("gguf.quants")

pytestmark = pytest.mark.unit

if not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")):
    pytest.skip("no C compiler: the qgemm kernels cannot be built", allow_module_level=True)

from pcd_tools.engine.kernels import qgemm  # noqa: E402
from pcd_tools.engine.kernels.paths import PATHS  # noqa: E402

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
INT8_PATHS = [p for p in qgemm.available_paths() if p != "avx512bf16"]
# Paths whose float operations are those of the scalar path, in the same order.
SAME_ORDER = [p for p in INT8_PATHS if p in ("scalar", "avx2", "avxvnni")]


def _fp16_bytes(values: np.ndarray) -> np.ndarray:
    v = np.ascontiguousarray(values.astype(np.float16))
    return v.view(np.uint8).reshape(*values.shape[:-1], -1)


def kquant_blocks(name: str, n: int, k: int, rng: np.random.Generator, small: bool = False):
    """Random valid K-quant blocks [n, bytes per row] with finite positive scales.

    small: d = dmin = 1 and every 6-bit scale / minimum in 0..3 (Q6_K: scales in
    -4..4), so that every product and sum is an integer far below 2**24.
    """
    nb = n * k // 256
    size = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[name]
    b = rng.integers(0, 256, (nb, size), dtype=np.uint8)
    if name == "Q6_K":
        d = np.ones((nb, 1)) if small else rng.uniform(1e-3, 1e-2, (nb, 1))
        b[:, 208:210] = _fp16_bytes(d)
        if small:
            b[:, 192:208] = rng.integers(-4, 5, (nb, 16)).astype(np.int8).view(np.uint8)
    else:
        d = np.ones((nb, 2)) if small else rng.uniform(1e-3, 1e-2, (nb, 2))
        b[:, 0:4] = _fp16_bytes(d)
        if small:
            b[:, 4:16] &= 0x03
    return b.reshape(n, -1)


def weights(name: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """File bytes [n, bytes per row] of a random matrix in `name`."""
    if name.endswith("_K"):
        return kquant_blocks(name, n, k, rng)
    w = rng.standard_normal((n, k)).astype(np.float32)
    return gq.quantize(w, gguf.GGMLQuantizationType[name])


def dequant(raw: np.ndarray, name: str) -> np.ndarray:
    return gq.dequantize(raw, gguf.GGMLQuantizationType[name]).astype(np.float64)


def reference(x: np.ndarray, wd: np.ndarray, block: int = 32):
    """float64 product of the kernels' quantized activations and the weights, and the
    bound of float32 summation for it (|xq dx| @ |w|^T)."""
    xq, dx, _ = qgemm.quantize_activations(x, block=block)
    rows, k = x.shape
    xr = (xq.astype(np.float64).reshape(rows, -1, block) * dx[:, :, None]).reshape(rows, k)
    return xr @ wd.T, np.abs(xr) @ np.abs(wd).T


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_matches_gguf(name):
    rng = np.random.default_rng(1)
    raw = weights(name, 24, 512, rng)
    m = qgemm.prepare(raw, name, (24, 512))
    np.testing.assert_allclose(m.dequantize(), dequant(raw, name), rtol=1e-6, atol=0)
    scratch = np.full((24, 512), np.nan, np.float32)
    assert m.dequantize(out=scratch) is scratch
    np.testing.assert_array_equal(scratch, m.dequantize())
    with pytest.raises(InvalidArgumentError, match="shape"):
        m.dequantize(out=np.empty((512, 24), np.float32))


@pytest.mark.parametrize("path", INT8_PATHS)
@pytest.mark.parametrize("name", TYPES)
def test_int8_equals_float64_of_the_same_quantized_operands(name, path):
    rng = np.random.default_rng(2)
    n, k, rows = 37, 768, 13  # a partial panel, a partial micro tile, an odd block count
    raw = weights(name, n, k, rng)
    wd = dequant(raw, name)
    x = (rng.standard_normal((rows, k)) * rng.uniform(0.1, 10, (rows, 1))).astype(np.float32)
    ref, bound = reference(x, wd)
    y = qgemm.prepare(raw, name, (n, k)).matmul(x, path=path, threads=2)
    assert y.dtype == np.float32 and y.shape == (rows, n)
    err = np.abs(y - ref)
    assert (err <= 2e-6 * bound + 1e-30).all(), f"max err/bound {(err / bound).max():.3g}"


KQUANTS = ["Q4_K", "Q5_K", "Q6_K"]


# the column-panel kernels (vpdpbusd across 16 output columns, or AMX tiles), K-quants
# per 256 only
COL_PATHS = ["scalar-cols"] + (["avx512vnni-cols"] if "avx512vnni" in INT8_PATHS else [])
AMX = qgemm.column_path() == "amx-cols"
COL_PATHS += ["amx-cols"] if AMX else []


@pytest.mark.parametrize("path", INT8_PATHS + COL_PATHS)
@pytest.mark.parametrize("name", KQUANTS)
def test_kquant_mode_equals_float64_of_the_same_quantized_operands(name, path):
    """act_block=256: activations per superblock, sub-block scales in the integer sums.
    Rows 13 = column-kernel tiles of 6, 6 and 1; columns 37 = a full column panel of 32
    and a partial one of 5 lanes."""
    rng = np.random.default_rng(12)
    n, k, rows = 37, 768, 13
    raw = weights(name, n, k, rng)
    wd = dequant(raw, name)
    x = (rng.standard_normal((rows, k)) * rng.uniform(0.1, 10, (rows, 1))).astype(np.float32)
    ref, bound = reference(x, wd, block=256)
    m = qgemm.prepare(raw, name, (n, k))
    y = m.matmul(x, path=path, threads=2, act_block=256)
    err = np.abs(y - ref)
    assert (err <= 2e-6 * bound + 1e-30).all(), f"max err/bound {(err / bound).max():.3g}"
    if path in COL_PATHS:  # the 8-lane K kernels sum the same products in another order
        k256 = m.matmul(x, path="scalar", act_block=256)
        assert (np.abs(y - k256) <= 4e-6 * bound + 1e-30).all()


@pytest.mark.parametrize("name", KQUANTS)
def test_kquant_mode_is_bit_identical_on_every_path(name):
    """Every path computes the same integer lanes and the same float steps in order."""
    rng = np.random.default_rng(13)
    n, k, rows = 21, 512, 7
    raw = weights(name, n, k, rng)
    m = qgemm.prepare(raw, name, (n, k))
    # row counts around the AVX2 tiles (5 x 2, then 4 x 2 and narrower for the rest), with
    # an odd last column (21 = 8 + 8 + 5)
    for count in (1, 4, 5, 7, 10, 13):
        x = rng.standard_normal((count, k)).astype(np.float32)
        scalar = m.matmul(x, path="scalar", act_block=256)
        for path in INT8_PATHS:
            got = m.matmul(x, path=path, act_block=256)
            np.testing.assert_array_equal(got, scalar, err_msg=f"{path}, {count} rows")
    # exact integers again: dx = 1 per superblock, small integer weights
    m, x, want = _exact_superblock_case(name, n, k, rows, rng)
    for path in INT8_PATHS:
        np.testing.assert_array_equal(m.matmul(x, path=path, act_block=256), want, err_msg=path)


@pytest.mark.parametrize("name", KQUANTS)
def test_column_kernels_are_bit_identical_and_rows_independent(name):
    """The vector kernel is its scalar twin's numbers, and a row's output does not depend
    on the other rows of the call (PCD's exactness against one prompt per candidate)."""
    rng = np.random.default_rng(23)
    n, k, rows = 70, 512, 17
    raw = weights(name, n, k, rng)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    m = qgemm.prepare(raw, name, (n, k))
    scalar = m.matmul(x, path="scalar-cols", threads=1)
    for path in COL_PATHS:
        for threads in (1, 2):
            np.testing.assert_array_equal(m.matmul(x, path=path, threads=threads), scalar)
        for lo, hi in ((5, 6), (0, 4), (11, 17), (2, 9)):
            np.testing.assert_array_equal(m.matmul(x[lo:hi], path=path), scalar[lo:hi])
    # integer operands: every product and sum exact
    m, x, want = _exact_superblock_case(name, n, k, rows, rng)
    for path in COL_PATHS:
        np.testing.assert_array_equal(m.matmul(x, path=path), want, err_msg=path)


BLOCK32 = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]


@pytest.mark.parametrize("name", BLOCK32)
def test_block32_column_panels_are_bit_identical_and_rows_independent(name):
    """The 32-block types run column panels on scalar, AVX2 and AVX-VNNI (8 columns a
    vector, the block's products summed in the integers): every row count's tile
    remainder (tiles of 4 rows for unsigned quants, 6 for Q8_0), a partial group of
    columns, and a row's result independent of the other rows."""
    rng = np.random.default_rng(29)
    n, k, rows = 45, 320, 25  # panels of 16, 16 and 13 columns: groups of 8 and 5
    raw = weights(name, n, k, rng)
    x = (rng.standard_normal((rows, k)) * rng.uniform(0.1, 10, (rows, 1))).astype(np.float32)
    m = qgemm.prepare(raw, name, (n, k))
    scalar = m.matmul(x, path="scalar", threads=1)
    ref, bound = reference(x, dequant(raw, name))
    assert (np.abs(scalar - ref) <= 2e-6 * bound + 1e-30).all()
    for path in SAME_ORDER:
        for threads in (1, 2):
            np.testing.assert_array_equal(m.matmul(x, path=path, threads=threads), scalar)
        for count in range(1, 8):  # each remainder of both tile heights
            np.testing.assert_array_equal(
                m.matmul(x[3 : 3 + count], path=path),
                scalar[3 : 3 + count],
                err_msg=f"{count} rows",
            )
    # integer operands: every product and sum exact on every path
    raw = _exact_weights(name, n, k, rng)
    x = rng.integers(-127, 128, (rows, k)).astype(np.float32)
    x[:, ::32] = 127.0  # dx = 1 per block: xq = x
    want = (x.astype(np.int64) @ dequant(raw, name).astype(np.int64).T).astype(np.float32)
    m = qgemm.prepare(raw, name, (n, k))
    for path in INT8_PATHS:
        np.testing.assert_array_equal(m.matmul(x, path=path), want, err_msg=path)


def test_act_block_256_picks_the_column_kernel_with_avx512_vnni():
    rng = np.random.default_rng(24)
    raw = weights("Q4_K", 48, 512, rng)
    x = rng.standard_normal((40, 512)).astype(np.float32)
    m = qgemm.prepare(raw, "Q4_K", (48, 512))
    col = qgemm.column_path()
    assert col == (
        "amx-cols" if AMX else "avx512vnni-cols" if "avx512vnni" in INT8_PATHS else "none"
    )
    want = col if col != "none" else qgemm.isa()
    np.testing.assert_array_equal(m.matmul(x, act_block=256), m.matmul(x, path=want, act_block=256))


@pytest.mark.skipif(not AMX, reason="this CPU (or its kernel) runs no AMX tiles")
@pytest.mark.parametrize("name", KQUANTS)
def test_amx_column_kernel_is_the_scalar_twin_bit_for_bit(name):
    """The tile kernel folds each sub-block's scale into its quants (two bytes, lo + 256 hi)
    and sums a superblock in the tiles: the same integers, so the same floats as the
    scalar twin. Rows 16 / 32 at a time on the tiles, the rest on AVX-512; tasks of
    several panels (n = 300: ten panels, the last of 12 columns, one group); every row's
    result independent of the call's other rows and of the thread count."""
    rng = np.random.default_rng(31)
    n, k = 300, 512
    raw = weights(name, n, k, rng)
    m = qgemm.prepare(raw, name, (n, k))
    x = (rng.standard_normal((83, k)) * rng.uniform(0.1, 10, (83, 1))).astype(np.float32)
    scalar = m.matmul(x, path="scalar-cols", threads=1)
    for threads in (1, 2, 3):
        np.testing.assert_array_equal(m.matmul(x, path="amx-cols", threads=threads), scalar)
    for lo, hi in ((0, 16), (0, 31), (0, 32), (5, 38), (1, 49), (50, 83), (7, 8)):
        got = m.matmul(x[lo:hi], path="amx-cols", threads=2)
        np.testing.assert_array_equal(got, scalar[lo:hi], err_msg=f"rows {lo}:{hi}")
    m, x, want = _exact_superblock_case(name, n, k, 40, rng)
    np.testing.assert_array_equal(m.matmul(x, path="amx-cols"), want)


@pytest.mark.skipif(not AMX, reason="this CPU (or its kernel) runs no AMX tiles")
def test_pcd_amx_0_turns_the_tiles_off():
    import subprocess
    import sys

    code = (
        "from pcd_tools.engine.kernels import cpu_ops, qgemm; "
        "print(qgemm.column_path(), cpu_ops.bf16_scores_run())"
    )
    env = {**os.environ, "PCD_AMX": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    # the prefill's products on AVX-512 VNNI, attention's scores float32 (test_bf16_scores)
    assert out.stdout.split() == ["avx512vnni-cols", "False"]


def test_column_kernels_refuse_what_they_cannot_run():
    rng = np.random.default_rng(25)
    x = rng.standard_normal((2, 512)).astype(np.float32)
    q4 = qgemm.prepare(weights("Q4_0", 8, 512, rng), "Q4_0", (8, 512))
    with pytest.raises(InvalidArgumentError, match=r"scalar-cols kernel takes K-quant.*Q4_0"):
        q4.matmul(x, path="scalar-cols")
    qk = qgemm.prepare(weights("Q4_K", 8, 512, rng), "Q4_K", (8, 512))
    with pytest.raises(
        InvalidArgumentError, match=r"act_block 256; got a Q4_K matrix, act_block 32"
    ):
        qk.matmul(x, path="scalar-cols", act_block=32)
    with pytest.raises(InvalidArgumentError, match=r"unknown; one of: .*avx512vnni-cols"):
        qk.matmul(x, path="avx1024-cols")
    if not AMX:  # a kernel this CPU lacks is named, with what it runs
        with pytest.raises(InvalidArgumentError, match=r"cannot run the amx-cols kernel"):
            qk.matmul(x, path="amx-cols", act_block=256)


def test_activation_quantization_per_256():
    rng = np.random.default_rng(14)
    x = rng.standard_normal((2, 512)).astype(np.float32)
    xq, dx, bs16 = qgemm.quantize_activations(x, block=256)
    np.testing.assert_allclose(dx, np.abs(x.reshape(2, 2, 256)).max(-1) / 127, rtol=1e-7)
    assert bs16.dtype == np.int16
    np.testing.assert_array_equal(bs16, xq.reshape(2, 32, 16).sum(-1))
    with pytest.raises(InvalidArgumentError, match="block"):
        qgemm.quantize_activations(x[:, :288], block=256)


@pytest.mark.parametrize("name", TYPES)
def test_simd_paths_equal_the_scalar_path(name):
    rng = np.random.default_rng(3)
    n, k, rows = 40, 512, 9
    raw = weights(name, n, k, rng)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    m = qgemm.prepare(raw, name, (n, k))
    scalar = m.matmul(x, path="scalar")
    same = list(SAME_ORDER)
    if not name.endswith("_K") and "avx512vnni" in INT8_PATHS:
        same.append("avx512vnni")  # the 32-block column panels, on 256-bit dpbusd
    for path in same:
        np.testing.assert_array_equal(m.matmul(x, path=path), scalar, err_msg=path)
    # avx512vnni's K-quant kernels sum the per-block float terms in another order: the
    # difference is bounded by the reordering of n_blocks float32 additions
    terms = np.abs(x).astype(np.float64) @ np.abs(dequant(raw, name)).astype(np.float64).T
    bound = (k // 32) * np.finfo(np.float32).eps * terms
    for path in set(INT8_PATHS) - set(same):
        diff = np.abs(m.matmul(x, path=path).astype(np.float64) - scalar)
        assert (diff <= bound).all(), (path, float((diff / bound).max()))


def _exact_superblock_case(name: str, n: int, k: int, rows: int, rng: np.random.Generator):
    """A K-quant matrix of small integers, integer activations whose every superblock's
    max|x| is 127 (dx = 1 per 256, xq = x), and their exact product."""
    raw = _exact_weights(name, n, k, rng)
    wd = dequant(raw, name)
    x = rng.integers(-127, 128, (rows, k)).astype(np.float32)
    x[:, ::256] = 127.0
    want = (x.astype(np.int64) @ wd.astype(np.int64).T).astype(np.float32)
    return qgemm.prepare(raw, name, (n, k)), x, want


def _exact_weights(name: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Blocks whose dequantized values are small integers (scales 1) or halves."""
    if name.endswith("_K"):
        return kquant_blocks(name, n, k, rng, small=True)
    raw = weights(name, n, k, rng)
    bb = raw.shape[1] // (k // 32)
    blocks = raw.reshape(n, k // 32, bb).copy()
    blocks[:, :, 0:2] = _fp16_bytes(np.full((n, k // 32, 1), 1.0))
    if name in ("Q4_1", "Q5_1"):
        blocks[:, :, 2:4] = _fp16_bytes(np.full((n, k // 32, 1), -3.0))
    return blocks.reshape(n, -1)


@pytest.mark.parametrize("name", TYPES)
def test_every_path_is_exact_on_integer_operands(name):
    """With integer activations that quantize to themselves (dx = 1) and integer
    weights, every sum is an exact integer in float32: each path, whatever its order,
    must give the integer product itself."""
    rng = np.random.default_rng(4)
    n, k, rows = 19, 512, 6
    raw = _exact_weights(name, n, k, rng)
    wd = dequant(raw, name)
    assert np.array_equal(wd, np.round(wd))
    x = rng.integers(-127, 128, (rows, k)).astype(np.float32)
    x[:, ::32] = 127.0  # every block's max|x| is 127: dx = 1, xq = x
    want = x.astype(np.int64) @ wd.astype(np.int64).T
    assert np.abs(want).max() < 2**24
    m = qgemm.prepare(raw, name, (n, k))
    for path in INT8_PATHS:
        np.testing.assert_array_equal(m.matmul(x, path=path), want.astype(np.float32), err_msg=path)


def test_activation_quantization_is_per_block_of_32():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 96)).astype(np.float32)
    x[1, 32:64] = 0.0  # an all-zero block: scale 0, quants 0
    xq, dx, xs = qgemm.quantize_activations(x)
    blocks = x.reshape(3, 3, 32)
    np.testing.assert_allclose(dx, np.abs(blocks).max(-1) / 127, rtol=1e-7)
    assert dx[1, 1] == 0 and not xq[1, 32:64].any()
    assert np.abs(xq).max() == 127 and xq.min() >= -127
    recon = xq.reshape(3, 3, 32) * dx[:, :, None]
    assert np.abs(recon - blocks).max() <= dx.max() / 2 * 1.0001
    np.testing.assert_allclose(xs, dx * xq.reshape(3, 3, 32).sum(-1), rtol=1e-7)


@pytest.mark.parametrize(
    "name,block", [("Q4_0", 32), ("Q8_0", 32), *[(t, b) for t in KQUANTS for b in (32, 256)]]
)
def test_error_against_float32_activations_is_small(name, block, capsys):
    """Reported, not a parity figure: quantizing activations to 8 bits per block costs
    about 1% of the output's norm on random data (float32 x @ dequant(W)^T)."""
    rng = np.random.default_rng(6)
    n, k, rows = 64, 1024, 16
    raw = weights(name, n, k, rng)
    wd = dequant(raw, name).astype(np.float32)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    y = qgemm.prepare(raw, name, (n, k)).matmul(x, act_block=block)
    exact = x.astype(np.float64) @ wd.T.astype(np.float64)
    rel = np.linalg.norm(y - exact) / np.linalg.norm(exact)
    with capsys.disabled():
        print(f"\n{name}, activations per {block}: relative error {rel:.2e}")
    assert rel < 0.02


def test_threads_rows_and_leading_dims_do_not_change_results():
    rng = np.random.default_rng(7)
    n, k = 50, 256
    raw = weights("Q4_K", n, k, rng)
    m = qgemm.prepare(raw, "Q4_K", (n, k))
    x = rng.standard_normal((2, 7, k)).astype(np.float32)
    y = m.matmul(x, threads=1)
    assert y.shape == (2, 7, n)
    np.testing.assert_array_equal(m.matmul(x, threads=3), y)
    one = m.matmul(x[1, 3], threads=2)  # a single row: same numbers as within the batch
    assert one.shape == (n,)
    np.testing.assert_array_equal(one, y[1, 3])
    assert m.matmul(np.zeros((0, k), np.float32)).shape == (0, n)


def test_mx_arrays_are_accepted():
    from pcd_tools.engine.host.blas import import_mlx

    mx = import_mlx()
    rng = np.random.default_rng(8)
    raw = weights("Q8_0", 16, 64, rng)
    m = qgemm.prepare(raw, "Q8_0", (16, 64))
    x = rng.standard_normal((4, 64)).astype(np.float32)
    np.testing.assert_array_equal(m.matmul(mx.array(x)), m.matmul(x))


def test_prepare_keeps_the_file_bytes_without_copying():
    rng = np.random.default_rng(9)
    raw = weights("Q4_0", 32, 256, rng)
    m = qgemm.prepare(raw, gguf.GGMLQuantizationType.Q4_0, (32, 256))
    assert np.shares_memory(m.raw, raw)
    assert m.nbytes == raw.nbytes == 32 * 8 * 18 and m.type_name == "Q4_0"
    assert qgemm.prepare(raw.tobytes(), 2, (32, 256)).nbytes == raw.nbytes


def test_modes_and_isa():
    modes = qgemm.available_modes()
    assert modes[0] == "int8" and set(modes) <= {"int8", "bf16"}
    assert qgemm.isa() in INT8_PATHS and "scalar" in INT8_PATHS
    assert qgemm.isa() == INT8_PATHS[0]  # the fastest int8 kernel this CPU runs
    assert ("bf16" in modes) == ("avx512bf16" in qgemm.available_paths())


@pytest.mark.skipif("bf16" not in qgemm.available_modes(), reason="this CPU has no AVX-512 BF16")
@pytest.mark.parametrize("name", TYPES)
def test_bf16_equals_float64_of_bf16_operands(name):
    rng = np.random.default_rng(10)
    n, k, rows = 37, 512, 11
    raw = weights(name, n, k, rng)
    m = qgemm.prepare(raw, name, (n, k))

    def bf16(a):  # round to nearest even, as vcvtne2ps2bf16
        u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
        return u.astype(np.uint32).view(np.float32).astype(np.float64)

    x = rng.standard_normal((rows, k)).astype(np.float32)
    xb, wb = bf16(x), bf16(m.dequantize())
    y = m.matmul(x, mode="bf16")
    np.testing.assert_array_less(np.abs(y - xb @ wb.T), 1e-5 * (np.abs(xb) @ np.abs(wb).T) + 1e-30)


def test_bad_input_gets_a_typed_error_naming_what_is_accepted():
    rng = np.random.default_rng(11)
    raw = weights("Q4_0", 8, 64, rng)
    with pytest.raises(InvalidArgumentError, match="supported: Q4_0"):
        qgemm.prepare(raw, "Q3_K", (8, 64))
    with pytest.raises(InvalidArgumentError, match="supported"):
        qgemm.prepare(raw, 0, (8, 64))  # F32
    with pytest.raises(InvalidArgumentError, match="takes 288 bytes; got"):
        qgemm.prepare(raw[:, :-1], "Q4_0", (8, 64))
    with pytest.raises(InvalidArgumentError, match="multiple of 256"):
        qgemm.prepare(raw, "Q4_K", (8, 64))
    m = qgemm.prepare(raw, "Q4_0", (8, 64))
    with pytest.raises(InvalidArgumentError, match="float32"):
        m.matmul(np.zeros((2, 64)))
    with pytest.raises(InvalidArgumentError, match="last dimension must be 64"):
        m.matmul(np.zeros((2, 63), np.float32))
    with pytest.raises(InvalidArgumentError, match="unknown"):
        m.matmul(np.zeros((2, 64), np.float32), path="neon")
    with pytest.raises(InvalidArgumentError, match="'int8' or 'bf16'"):
        m.matmul(np.zeros((2, 64), np.float32), mode="fp8")
    with pytest.raises(InvalidArgumentError, match="act_block must be 32 for a Q4_0"):
        m.matmul(np.zeros((2, 64), np.float32), act_block=256)
    with pytest.raises(InvalidArgumentError, match="threads"):
        m.matmul(np.zeros((2, 64), np.float32), threads=0)
    missing = [p for p in ("avxvnni", "avx512vnni") if p not in INT8_PATHS]
    for path in missing:
        with pytest.raises(InvalidArgumentError, match="cannot run"):
            m.matmul(np.zeros((2, 64), np.float32), path=path)
    if "bf16" not in qgemm.available_modes():
        with pytest.raises(InvalidArgumentError, match="AVX-512 BF16"):
            m.matmul(np.zeros((2, 64), np.float32), mode="bf16")


def _quantize_both(x: np.ndarray, block: int) -> list[tuple[np.ndarray, ...]]:
    """x quantized by the scalar and by the AVX2 quantizer (direct C calls)."""
    lib = qgemm.qgemm_library()
    rows, k = x.shape
    out = []
    for path in (PATHS["scalar"], PATHS["avx2"]):
        xq = np.full((rows, k), 99, np.int8)
        dx = np.full((rows, k // block), np.nan, np.float32)
        sums = (
            np.empty((rows, k // 16), np.int16)
            if block == 256
            else np.empty((rows, k // 32), np.float32)
        )
        fn = lib.pcd_qgemm_quantize_k_path if block == 256 else lib.pcd_qgemm_quantize_path
        rc = fn(
            x.ctypes.data, k, rows, k, xq.ctypes.data, dx.ctypes.data, sums.ctypes.data, 2, path
        )
        assert rc == 0, rc
        out.append((xq, dx, sums))
    return out


@pytest.mark.parametrize("block", [32, 256])
def test_avx2_activation_quantizer_is_bit_identical_to_the_scalar_one(block):
    """roundf rounds ties away from zero; the AVX2 quantizer emulates it exactly, so
    every path's integers are those of the scalar code (and llama.cpp's Q8 rounding)."""
    if "avx2" not in qgemm.available_paths():
        pytest.skip("this CPU has no AVX2")
    rng = np.random.default_rng(11)
    x = rng.standard_normal((21, 512)).astype(np.float32)
    x[3] *= 1e-30  # tiny values
    x[4, :block] = 0.0  # an all-zero block: scale 0
    x[5, 7] = 40.0  # an outlier
    # a block whose maximum is 127: the scale is 1, so the products are the values, and
    # ties (k + 0.5) and the float just below 0.5 reach the rounding as they are
    ties = np.array(
        [0.5, -0.5, 1.5, -2.5, 126.5, -126.5, np.nextafter(np.float32(0.5), 0)], np.float32
    )
    x[6, :block] = 0.25
    x[6, 0] = 127.0
    x[6, 1 : 1 + len(ties)] = ties
    x[7] = np.round(x[7] * 4) / 4  # many quarter values
    scalar, simd = _quantize_both(x, block)
    for a, b, name in zip(scalar, simd, ("xq", "dx", "sums")):
        np.testing.assert_array_equal(a, b, err_msg=name)
    # the tie row: ties away from zero, and 0.49999997 down to 0
    np.testing.assert_array_equal(scalar[0][6, : 1 + len(ties)], [127, 1, -1, 2, -3, 127, -127, 0])
    assert (scalar[0][4, :block] == 0).all() and scalar[1][4, 0] == 0.0
