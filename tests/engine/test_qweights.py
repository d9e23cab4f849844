"""GGUF weights kept in the file's encoding on CPU (`engine.qweights`): the native
dequantization equals gguf-py bit for bit for every supported type, the quantized matmul
equals MLX's dense float32 one, and a model loaded that way scores like the dense load."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
gguf = pytest.importorskip("gguf")

from gguf import GGML_QUANT_SIZES  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402

from pcd_tools.engine.kernels.bindings import qweights_library  # noqa: E402
from pcd_tools.engine.kernels.paths import PATHS  # noqa: E402
from pcd_tools.engine.load import qlinear as qweights  # noqa: E402
from pcd_tools.engine.load.gguf import load_gguf  # noqa: E402
from pcd_tools.engine.load.qlinear import GGUFEmbedding, GGUFLinear, QTensor  # noqa: E402
from pcd_tools.errors import InvalidArgumentError  # noqa: E402
from tests.engine.test_gguf import (  # noqa: E402
    PROMPT,
    hf_weights,
    logits,
    reference,
    roundtrip,
    write_gguf,
)

pytestmark = pytest.mark.engine

if qweights_library() is None:  # pragma: no cover - every CI machine has a C compiler
    pytest.skip("no C compiler for the quantized-weight kernels", allow_module_level=True)

GGUF_QUANTIZES = ("F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
# byte offsets of the float16 scales in a K-quant block (random bytes elsewhere are valid)
K_SCALES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def encoded(name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Valid random rows of type `name`: gguf's quantizer, or random K-quant blocks with
    finite float16 scales."""
    rng = np.random.default_rng(seed)
    if name == "F32":
        return rng.standard_normal((rows, cols)).astype(np.float32).view(np.uint8)
    if name == "F16":
        return rng.standard_normal((rows, cols)).astype(np.float16).view(np.uint8)
    if name in GGUF_QUANTIZES:
        return gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), T[name])
    per, nbytes = GGML_QUANT_SIZES[T[name]]
    raw = rng.integers(0, 256, (rows, cols // per, nbytes), dtype=np.uint8)
    for off in K_SCALES[name]:
        scale = rng.uniform(-0.05, 0.05, raw.shape[:2]).astype(np.float16)
        raw[..., off : off + 2] = scale.view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("name", sorted(qweights.GGML_TYPES))
def test_dequantize_is_bit_identical_to_gguf_py(name):
    raw = encoded(name, 48, 512)
    want = gguf.quants.dequantize(raw, T[name]).reshape(48, 512).astype(np.float32)
    assert np.isfinite(want).all()
    got = QTensor(raw, name, 512).dequantize(threads=2)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    rows = np.array([[3, 47], [0, 3]])  # an embedding lookup: only these rows
    np.testing.assert_array_equal(QTensor(raw, name, 512).dequantize(rows), want[rows])


@pytest.mark.parametrize("name", sorted(qweights.GGML_TYPES))
def test_every_row_kernel_path_is_bit_identical_to_gguf_py(name):
    """The portable `_generic` rows and each SIMD copy this CPU runs (forced by path)."""
    lib = qweights_library()
    raw = np.ascontiguousarray(encoded(name, 24, 512, seed=3))
    want = gguf.quants.dequantize(raw, T[name]).reshape(24, 512).astype(np.float32)
    tid = qweights.GGML_TYPES[name][0]
    ran = []
    for isa in ("scalar", "avx2", "avx512"):
        path = PATHS[isa]
        if lib.pcd_q_path(path) != path:
            continue  # not built for, or not run by, this CPU
        ran.append(isa)
        got = np.full((24, 512), np.nan, np.float32)
        rc = lib.pcd_q_dequant_rows(
            tid, raw.ctypes.data, raw.shape[1], 512, None, 0, 24, got.ctypes.data, 2, path
        )
        assert rc == 0, isa
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=isa)
    assert ran[0] == "scalar"
    assert lib.pcd_q_path(PATHS["auto"]) in [PATHS[i] for i in ran]
    assert lib.pcd_q_path(PATHS["avxvnni"]) == 0  # a path the row kernels are not built for


@pytest.mark.parametrize("name", sorted(qweights.GGML_TYPES))
@pytest.mark.parametrize("panel_rows", [7, 10_000])  # several panels / one GEMM call
def test_matmul_equals_dense_float32(name, panel_rows, monkeypatch):
    monkeypatch.setattr(qweights, "PANEL_BYTES", panel_rows * 512 * 4)
    raw = encoded(name, 40, 512, seed=1)
    dense = gguf.quants.dequantize(raw, T[name]).reshape(40, 512).astype(np.float32)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((13, 512)).astype(np.float32)
    bias = rng.standard_normal(40).astype(np.float32)
    lin = mx.array(x) @ mx.array(dense).T
    with_bias = mx.addmm(mx.array(bias), mx.array(x), mx.array(dense).T)
    qt = QTensor(raw, name, 512)
    tol = 1e-6 * float(np.abs(np.array(lin)).max())  # panels: a few float32 ulps of the sums
    np.testing.assert_allclose(qt.matmul(x, 2), np.array(lin), rtol=0, atol=tol)
    np.testing.assert_allclose(qt.matmul(x, 2, bias), np.array(with_bias), rtol=0, atol=tol)
    if panel_rows >= 40:  # one GEMM call with the same arguments as MLX's: bit-identical
        np.testing.assert_array_equal(qt.matmul(x, 2), np.array(lin))


def test_bad_rows_and_types_are_refused():
    raw = encoded("Q4_0", 4, 64)
    with pytest.raises(ValueError, match="needs 36 bytes"):
        QTensor(raw[:, :20], "Q4_0", 64)
    with pytest.raises(ValueError, match="no CPU kernel"):
        QTensor(raw, "IQ2_XS", 64)
    with pytest.raises(IndexError):
        QTensor(raw, "Q4_0", 64).dequantize(np.array([4]))


@pytest.mark.parametrize(
    "arch,tied,types",
    [
        ("llama", True, {"embed": T.Q8_0, "other": T.Q4_1}),  # the embedded model's mix
        ("llama", False, {"embed": T.Q4_0, "head": T.Q8_0, "other": T.Q5_0}),
        ("qwen2", False, {"embed": T.BF16, "head": T.F16, "other": T.Q4_0}),
        ("qwen2", True, {"embed": T.Q5_1, "other": T.Q8_0}),
    ],
)
def test_model_in_file_encoding_scores_like_dense(tmp_path, arch, tied, types):
    def qtype(name: str) -> T:
        key = {"model.embed_tokens.weight": "embed", "lm_head.weight": "head"}.get(name, "other")
        return types.get(key, types["other"])

    weights = hf_weights(arch, tied=tied, seed=3)
    path = write_gguf(tmp_path / "m.gguf", arch, weights, qtype=qtype)
    dense, _, _ = load_gguf(path, dtype=mx.float32)
    kept, _, _ = load_gguf(path, encoded=True)
    inner = kept.model
    assert isinstance(inner.embed_tokens, GGUFEmbedding)
    assert isinstance(inner.layers[0].self_attn.q_proj, GGUFLinear)
    assert tied or isinstance(kept.lm_head, GGUFLinear)
    assert inner.layers[0].self_attn.q_proj.weight.data.base is not None  # a view, not a copy
    want = logits(reference(arch, roundtrip(weights, qtype), tied=tied))
    got, ref = logits(kept), logits(dense)
    assert mx.abs(got - ref).max().item() <= 1e-5
    assert mx.allclose(got, want, atol=1e-4).item()
    assert len(PROMPT) == got.shape[1]


def test_dtype_values(monkeypatch):
    from pcd_tools.engine.load.sources import DTYPES, resolve_dtype

    assert resolve_dtype("float32") == "float32"
    monkeypatch.setenv("PCD_DTYPE", "float32")
    assert resolve_dtype("auto") == "float32" and resolve_dtype("quantized") == "quantized"
    monkeypatch.setenv("PCD_DTYPE", "int3")
    with pytest.raises(InvalidArgumentError, match=r"PCD_DTYPE=.int3.*float32"):
        resolve_dtype("auto")
    monkeypatch.delenv("PCD_DTYPE")
    with pytest.raises(InvalidArgumentError, match=r"dtype=.f32.*quantized"):
        resolve_dtype("f32")
    assert "auto" in DTYPES and "float32" in DTYPES


@pytest.mark.integration
def test_embedded_model_quantized_equals_dense():
    from pcd_tools import Decider
    from tests.schemas import Ticket

    kept, dense = Decider.load(dtype="quantized"), Decider.load(dtype="float32")
    assert kept.loaded.dtype.startswith("gguf-") and dense.loaded.dtype == "float32"
    text = "My invoice charged me twice for the same order; please refund it."
    a, b = kept.decide(Ticket, text), dense.decide(Ticket, text)
    for name, field in a.fields.items():
        np.testing.assert_allclose(field.log_scores, b.fields[name].log_scores, atol=1e-5)


def test_auto_keeps_large_files_encoded_and_small_ones_dense(monkeypatch):
    from types import SimpleNamespace

    from pcd_tools.engine.load import gguf

    def mats(n: int) -> list:
        return [SimpleNamespace(shape=(1024, 1024))] * n + [SimpleNamespace(shape=(1024,))]

    per = 4 * 1024 * 1024  # a 1024x1024 float32 matrix; vectors do not count
    # the copies plus the load's scratch of the largest (one more matrix)
    assert gguf.dense_fits(mats(gguf.AUTO_DENSE_BYTES // per - 1))
    assert not gguf.dense_fits(mats(gguf.AUTO_DENSE_BYTES // per))
    monkeypatch.setattr(gguf.os, "sysconf", lambda name: 4096 if "PAGE" in name else 8 * 1024)
    assert not gguf.dense_fits(mats(2))  # 32 MiB of RAM: an eighth is 4 MiB


@pytest.mark.integration
def test_auto_loads_the_embedded_model_dense(monkeypatch):
    from pcd_tools import Decider

    monkeypatch.delenv("PCD_DTYPE", raising=False)
    assert Decider.load().loaded.dtype == "float32"  # 0.5 GB dense: within the rule


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1.5"])
def test_a_bad_panel_size_is_a_typed_error(value, monkeypatch):
    from pcd_tools.errors import InvalidArgumentError

    monkeypatch.setenv("PCD_QPANEL_BYTES", value)
    with pytest.raises(InvalidArgumentError, match=r"PCD_QPANEL_BYTES.*positive integer"):
        qweights.panel_bytes()
    monkeypatch.setenv("PCD_QPANEL_BYTES", "4096")
    assert qweights.panel_bytes() == 4096
    monkeypatch.delenv("PCD_QPANEL_BYTES")
    assert qweights.panel_bytes() == qweights.PANEL_BYTES


@pytest.mark.parametrize("value", ["two", "0", "-1"])
def test_a_bad_decode_thread_count_is_a_typed_error(value, monkeypatch):
    from pcd_tools.engine.host.threads import decode_threads
    from pcd_tools.errors import InvalidArgumentError

    monkeypatch.setenv("PCD_DECODE_THREADS", value)
    with pytest.raises(InvalidArgumentError, match=r"PCD_DECODE_THREADS.*positive integer"):
        decode_threads()
    monkeypatch.setenv("PCD_DECODE_THREADS", "3")
    assert decode_threads() == 3
