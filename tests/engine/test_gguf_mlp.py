"""`engine.gguf_mlp`: a SwiGLU MLP over file-encoded matrices runs in numpy between its
three products, with reused buffers and one activation quantization for gate and up.
Its numbers are the unfused module's, bit for bit, in every compute mode; the products'
`out=` / `activations=` options are checked, with typed errors for bad ones."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from pcd_tools import Decider  # noqa: E402
from pcd_tools.engine.host.blas import import_mlx  # noqa: E402
from pcd_tools.engine.kernels import cpu_ops as cpu_kernels  # noqa: E402
from pcd_tools.engine.kernels import qgemm  # noqa: E402
from pcd_tools.engine.load import gguf_mlp  # noqa: E402
from pcd_tools.engine.load.gguf_mlp import GGUFMLP, install_mlps  # noqa: E402
from pcd_tools.errors import InvalidArgumentError  # noqa: E402
from tests.engine.test_qweights import encoded  # noqa: E402

mx = import_mlx()
pytestmark = pytest.mark.engine


@pytest.mark.parametrize("compute", ["int8", "float32"])
def test_fused_mlp_equals_the_unfused_module_bit_for_bit(tiny_file, compute):
    dec = Decider.load(tiny_file, dtype="quantized", compute=compute)
    layers = dec.engine.model.model.layers
    assert all(isinstance(layer.mlp, GGUFMLP) for layer in layers)
    mlp = layers[0].mlp
    hidden = mlp.gate_proj.weight.shape[1]
    inter = mlp.gate_proj.weight.shape[0]
    rng = np.random.default_rng(3)
    # below MIN_GATE and above it (engines over GGUF matrices send every size to the kernels)
    small_rows = max(1, cpu_kernels.MIN_GATE // inter // 4)
    big_rows = cpu_kernels.MIN_GATE // inter + 7
    with dec.engine.lock, dec.engine.request():
        assert cpu_kernels._on()
        for shape in [(1, small_rows, hidden), (3, big_rows, hidden)]:
            x = mx.array(rng.standard_normal(shape).astype(np.float32))
            for layer in layers:
                got = np.array(layer.mlp(x))
                want = np.array(layer.mlp._unfused(layer.mlp, x))
                assert got.shape == shape
                np.testing.assert_array_equal(got, want)
            # the fused path ran (with `every` set, the small call too): its scratch
            assert gguf_mlp._local.bufs["gate"].size >= shape[0] * shape[1] * inter
            # a second call reuses the buffers: same numbers
            np.testing.assert_array_equal(np.array(mlp(x)), np.array(mlp._unfused(mlp, x)))


def test_install_leaves_dense_mlps_alone():
    dec = Decider.load(dtype="float32")  # dense Linear projections: nothing to fuse
    assert install_mlps(dec.engine.model) == 0
    assert not isinstance(dec.engine.model.model.layers[0].mlp, GGUFMLP)


@pytest.mark.parametrize("name", ["Q4_0", "Q6_K"])
def test_shared_activations_and_out_give_the_same_numbers(name):
    raw = encoded(name, 32, 256, seed=8)
    m = qgemm.prepare(raw, name, (32, 256))
    x = np.random.default_rng(9).standard_normal((7, 256)).astype(np.float32)
    block = 256 if m.kquant else 32
    want = m.matmul(x, threads=2, act_block=block)
    acts = qgemm.quantize_activations(x, threads=1, block=block)
    out = np.full((7, 32), np.nan, np.float32)
    got = m.matmul(x, threads=2, act_block=block, out=out, activations=acts)
    assert np.shares_memory(got, out)
    np.testing.assert_array_equal(got, want)


def test_bad_out_and_activations_are_typed_errors():
    raw = encoded("Q4_K", 16, 256, seed=2)
    m = qgemm.prepare(raw, "Q4_K", (16, 256))
    x = np.ones((3, 256), np.float32)
    with pytest.raises(InvalidArgumentError, match=r"out must be .*\(3, 16\).*got float64"):
        m.matmul(x, out=np.zeros((3, 16)))
    with pytest.raises(InvalidArgumentError, match=r"out must be .*got float32 \(16, 3\)"):
        m.matmul(x, out=np.zeros((16, 3), np.float32))
    acts32 = qgemm.quantize_activations(x, block=32)
    with pytest.raises(InvalidArgumentError, match=r"quantize_activations\(x, block=256\)"):
        m.matmul(x, act_block=256, activations=acts32)  # quantized per 32, used per 256
    with pytest.raises(InvalidArgumentError, match=r"activations are int8 mode's"):
        m.matmul(x, mode="bf16", activations=acts32)


def test_consecutive_products_of_one_input_quantize_it_once(tiny_file):
    """Attention's q, k and v read the same x: the int8 route quantizes it once (per
    thread, keyed by the input object itself), and the numbers are those of quantizing
    each time."""
    from pcd_tools.engine.load import qlinear as qweights

    dec = Decider.load(tiny_file, dtype="quantized", compute="int8")
    attn = dec.engine.model.model.layers[1].self_attn
    x = mx.array(np.random.default_rng(4).standard_normal((1, 37, 256)).astype(np.float32))
    with dec.engine.lock, dec.engine.request():
        got = [np.array(proj(x)) for proj in (attn.q_proj, attn.k_proj, attn.v_proj)]
        memo = qweights._memo.last
        assert memo[0] is x and memo[1] == attn.q_proj.weight.act_block()
        xn = np.array(x).reshape(37, 256)
        for proj, y in zip((attn.q_proj, attn.k_proj, attn.v_proj), got):
            bias = np.array(proj.bias) if "bias" in proj else None
            want = proj.weight.matmul(xn, qweights._threads(), bias)  # quantized afresh
            np.testing.assert_array_equal(y.reshape(37, -1), want)
        # another input object with the same values is quantized again, not looked up
        x2 = x + 0
        attn.q_proj(x2)
        assert qweights._memo.last[0] is x2


def test_scratch_kept_between_calls_is_bounded(monkeypatch):
    """A product above RETAIN_BYTES gets a fresh array: a long prompt leaves no large
    scratch behind in the thread."""
    monkeypatch.setattr(gguf_mlp, "RETAIN_BYTES", 64 * 4 * 10)
    small = gguf_mlp._buffer("t", (10, 64))
    assert gguf_mlp._buffer("t", (5, 64)).base is small.base  # reused
    big = gguf_mlp._buffer("t", (11, 64))
    assert big.shape == (11, 64) and big.base is not small.base
    assert gguf_mlp._local.bufs["t"].size == 640  # the kept one is the small one
