"""bf16 scores on the AMX tiles (`_cpu_kernels.c`, "bf16 scores on the AMX tiles"): the
attention of engines whose matrices compute in int8 or bf16, on CPUs with AMX.

That a query's output is the same bits whatever shares its call (masked keys, parts,
threads, blocks) is asserted for this path with the float32 ones, in
`test_cpu_kernels.py` (`_paths(lib, d)` lists it where it runs)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from pcd_tools import Decider
from pcd_tools.engine.kernels import cpu_ops as K
from pcd_tools.engine.kernels.paths import BITS, PATHS
from tests.engine.test_cpu_kernels import _attend, _bf16, _row, installed, lib, reference

pytestmark = pytest.mark.engine
__all__ = ["installed", "lib"]  # the fixtures, imported for this module's tests

AMX = PATHS["amx"]


def _runs(lib) -> bool:
    return lib.pcd_cpu_kernels_path(AMX) == AMX


def test_the_tiles_are_asked_for_by_name_never_by_auto(lib):
    auto = lib.pcd_cpu_kernels_path(PATHS["auto"])
    assert auto != AMX and auto in BITS  # auto stays float32
    assert lib.pcd_attention_simd_width() == BITS[auto]
    assert K.bf16_scores_run() == _runs(lib)
    f = np.float32
    q, k = np.ones((1, 2, 3, 40), f), np.ones((1, 1, 5, 40), f)
    out = np.zeros_like(q)
    strides = (ctypes.c_int64 * 9)(240, 120, 40, 200, 200, 40, 200, 200, 40)  # q, k, v
    # a head size the tiles do not take (a multiple of 32) is refused; the Python side then
    # asks for the float32 paths (`_native_sdpa`), as it does where AMX does not run
    rc = lib.pcd_attention_path(
        AMX, _row(q), _row(k), _row(k), _row(out), strides, None, 0, 1, 2, 1, 3, 5, 40, 0.125,
        0, 16, 1,
    )  # fmt: skip
    assert rc == 1


@pytest.mark.parametrize(
    ("h", "kh", "lq", "s", "d", "causal"),
    [
        (6, 2, 37, 101, 128, 0),  # GQA, lengths off the 16 / 32 grid
        (12, 2, 130, 300, 64, 1),  # a causal prefill after a prefix, two blocks of rows
        (4, 4, 1, 70, 64, 0),  # one query (a decode-sized call)
        (2, 1, 200, 200, 256, 1),  # a whole causal prompt, Gemma's head size
    ],
)
def test_scores_are_the_products_of_bf16_roundings(lib, h, kh, lq, s, d, causal):
    if not _runs(lib):
        pytest.skip("no AMX-BF16 tiles on this CPU (or PCD_AMX=0)")
    rng = np.random.default_rng(lq + s + d)
    f, neg = np.float32, np.finfo(np.float32).min
    q = (rng.normal(size=(1, h, lq, d)) * 3).astype(f)
    k, v = (rng.normal(size=(1, kh, s, d)).astype(f) for _ in range(2))
    mask = None if causal else np.where(rng.random((lq, s)) > 0.3, 0.0, neg).astype(f)
    if mask is not None:
        mask[:, 0] = 0.0  # every row sees a key
    got = _attend(lib, AMX, q, k, v, mask, causal=causal)
    for threads, block in ((2, 16), (3, 7)):  # rows split otherwise: the same bits
        assert np.array_equal(_attend(lib, AMX, q, k, v, mask, threads, block, causal), got)
    m = "causal" if causal else mask
    # the float64 attention of the bf16 roundings of Q and K: the products are exact, the
    # sums float32 (in the hardware's order), the softmax and PV the float32 paths'
    np.testing.assert_allclose(got, reference(_bf16(q), _bf16(k), v, 0.125, m), atol=2e-5)
    # and not float32's scores: those stay within 2e-5 of the float64 attention
    assert np.abs(got - reference(q, k, v, 0.125, m)).max() > 1e-4


def test_int8_engines_take_them_where_they_run_float32_engines_never(tiny_file):
    fast = Decider.load(tiny_file, compute="int8")
    assert fast.engine.bf16_scores == K.bf16_scores_run()
    ref = Decider.load(tiny_file, dtype="quantized", compute="float32")
    assert not ref.engine.bf16_scores
    if not fast.engine.bf16_scores:
        return
    text = "The March invoice was charged twice; please refund one of them today."
    from tests.schemas import Ticket

    got = fast.decide(Ticket, text)
    fast.engine.bf16_scores = False  # the same engine with float32 scores
    f32 = fast.decide(Ticket, text)
    diffs = [
        max(abs(p - f32.fields[name].distribution[c]) for c, p in fr.distribution.items())
        for name, fr in got.fields.items()
    ]
    # the scores moved (bf16 is in use), within what int8's own rounding moves them
    assert 0 < max(diffs) < 0.05, diffs


def test_a_batch_row_attends_as_it_does_alone(lib):
    """Batched passes (B > 1, each row its own keys, in two parts): each row's output is
    the bits of that row alone, the keys' tiles converted per (batch row, KV head)."""
    if not _runs(lib):
        pytest.skip("no AMX-BF16 tiles on this CPU (or PCD_AMX=0)")
    rng = np.random.default_rng(7)
    f = np.float32
    b, h, kh, lq, s1, s2, d = 3, 6, 2, 21, 40, 21, 64
    q = (rng.normal(size=(b, h, lq, d)) * 3).astype(f)
    k1, v1 = (rng.normal(size=(b, kh, s1, d)).astype(f) for _ in range(2))
    k2, v2 = (rng.normal(size=(b, kh, s2, d)).astype(f) for _ in range(2))

    def attend(n, *arrays):
        qq, a1, b1, a2, b2 = arrays
        out = np.zeros((n, h, lq, d), f)
        strides = [h * lq * d, lq * d, d]
        for x in (a1, b1, a2, b2):
            strides += [kh * x.shape[2] * d, x.shape[2] * d, d]
        rc = lib.pcd_attention_parts(
            AMX, _row(qq), 2, (ctypes.c_void_p * 2)(_row(a1), _row(a2)),
            (ctypes.c_void_p * 2)(_row(b1), _row(b2)), (ctypes.c_int * 2)(s1, s2), _row(out),
            (ctypes.c_int64 * 15)(*strides), None, 0, 0, None, 0, n, h, kh, lq, d, 0.125, 1,
            16, 2,
        )  # fmt: skip
        assert rc == 0
        return out

    both = attend(b, q, k1, v1, k2, v2)
    for i in range(b):
        alone = attend(1, *(np.ascontiguousarray(x[i : i + 1]) for x in (q, k1, v1, k2, v2)))
        assert np.array_equal(both[i], alone[0]), i
    keys, values = np.concatenate([k1, k2], 2), np.concatenate([v1, v2], 2)
    want = reference(_bf16(q), _bf16(keys), values, 0.125, "causal")
    np.testing.assert_allclose(both, want, atol=2e-5)
