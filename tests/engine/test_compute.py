"""`Decider.load(compute=...)`: the passes' matrix products on the int8 (and bf16) kernels
over a GGUF file's blocks (`engine.qgemm` through `engine.qweights`).

PCD stays exact for the numbers it computes: in int8 mode its probabilities equal one
prompt per candidate run through the same int8 kernels; against float32 the scores move
by the activations' 8-bit rounding only. Bad combinations are typed errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from pcd_tools import Decider  # noqa: E402
from pcd_tools.engine.kernels import qgemm  # noqa: E402
from pcd_tools.engine.load.qlinear import (  # noqa: E402
    INT8_MIN_BYTES,
    GGUFEmbedding,
    GGUFLinear,
    QTensor,
    auto_compute,
)
from pcd_tools.engine.load.sources import COMPUTES, resolve_compute  # noqa: E402
from pcd_tools.errors import InvalidArgumentError, ModelLoadError  # noqa: E402
from pcd_tools.schema import compile_schema  # noqa: E402
from tests.engine.test_qweights import encoded  # noqa: E402
from tests.oracle import oracle_log_scores, softmax  # noqa: E402
from tests.schemas import Ticket  # noqa: E402

pytestmark = pytest.mark.engine

CONTEXT = "Checkout fails for every EU customer since 9:00; we lose orders."


def test_compute_values(monkeypatch):
    monkeypatch.delenv("PCD_COMPUTE", raising=False)
    assert resolve_compute("auto") == "auto" and resolve_compute("int8") == "int8"
    monkeypatch.setenv("PCD_COMPUTE", "int8")
    assert resolve_compute("auto") == "int8" and resolve_compute("float32") == "float32"
    monkeypatch.setenv("PCD_COMPUTE", "int4")
    with pytest.raises(InvalidArgumentError, match=r"PCD_COMPUTE='int4'.*'int8'"):
        resolve_compute("auto")
    with pytest.raises(InvalidArgumentError, match=r"compute='fp8' is not accepted.*'bf16'"):
        resolve_compute("fp8")
    assert COMPUTES == ("auto", "float32", "int8", "bf16")


@pytest.mark.parametrize("name", ["Q4_0", "Q8_0", "Q4_K", "Q6_K"])
def test_qtensor_int8_matmul_is_the_kernels_with_rows_and_bias(name):
    raw = encoded(name, 24, 256, seed=4)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((9, 256)).astype(np.float32)
    bias = rng.standard_normal(24).astype(np.float32)
    order = rng.permutation(24).astype(np.int32)
    qt = QTensor(raw, name, 256, order)
    dense = qt.matmul(x, 2, bias)
    qt.compute = "int8"
    got = qt.matmul(x, 2, bias)
    m = qgemm.prepare(raw, name, (24, 256))
    # K-quants: activations per 256 (llama.cpp's Q8_K), the others per 32
    want = m.matmul(x, threads=2, act_block=256 if m.kquant else None)[:, order] + bias
    np.testing.assert_array_equal(got, want)  # the kernel's numbers, in model row order
    scale = float(np.abs(dense).max())
    assert np.abs(got - dense).max() < 0.05 * scale  # 8-bit activations: close, not equal
    assert got.dtype == np.float32 and got.flags.c_contiguous


def test_int8_decisions_equal_one_prompt_per_candidate_through_the_same_kernels(tiny_file):
    dec = Decider.load(tiny_file, compute="int8")
    assert dec.loaded.compute == "int8" and dec.loaded.dtype.startswith("gguf-")
    q = dec.engine.model.model.layers[0].self_attn.q_proj
    assert isinstance(q, GGUFLinear) and q.weight.compute == "int8"
    sch = compile_schema(Ticket)
    d = dec.decide(sch, CONTEXT)
    assert d.compute == "int8" and d.to_response()["compute"] == "int8"
    for f in sch.fields:
        z = oracle_log_scores(dec, sch, CONTEXT, f.name)
        got = np.array(list(d.fields[f.name].distribution.values()))
        assert np.abs(got - softmax(z)).max() < 1e-4, f.name
    # against float32 on the same file: the same answers, probabilities close
    ref = Decider.load(tiny_file, dtype="quantized", compute="float32").decide(sch, CONTEXT)
    assert ref.compute == "float32"
    for name, f in d.fields.items():
        p = np.array(list(f.distribution.values()))
        r = np.array(list(ref.fields[name].distribution.values()))
        assert np.abs(p - r).max() < 0.02, name


@pytest.mark.integration
def test_embedded_model_in_int8_stays_near_float32():
    from tests.schemas import Ticket as T

    fast = Decider.load(compute="int8")  # "auto" would load the 135M dense: int8 keeps it encoded
    ref = Decider.load(dtype="quantized")
    assert fast.loaded.compute == "int8" and "compute='int8'" in repr(fast)
    texts = [CONTEXT, "Please add a dark mode some day.", "I was charged twice for March."]
    diffs, agree = [], 0
    for a, b in zip(fast.decide_many(T, texts), ref.decide_many(T, texts)):
        for name, f in a.fields.items():
            agree += f.label == b.fields[name].label
            p = np.array(list(f.distribution.values()))
            q = np.array(list(b.fields[name].distribution.values()))
            diffs.append(np.abs(p - q))
    worst, mean = float(np.max(np.concatenate(diffs))), float(np.mean(np.concatenate(diffs)))
    # measured: 8 of 9 answers agree, max |dp| 0.11, mean 0.02 (AVX-512 VNNI); 7 of 9,
    # 0.12, 0.025 (AVX2: its own kernels' float32 roundings). The 135M's activations have
    # outliers that 8 bits per block of 32 round coarsely (EVAL.md, "Compute modes"); both
    # flips are the priority field, where float32's top two are 0.07 and 0.23 apart
    assert agree >= 7 and 0 < worst < 0.15 and mean < 0.04, (agree, worst, mean)


@pytest.mark.integration
def test_embedded_model_in_int8_scores_do_not_depend_on_what_shares_the_pass():
    """In int8 a float32 rounding difference upstream of a matrix product becomes a whole
    activation step, which later layers carry on: before attention summed each query over
    its nonzero weights only (`_cpu_kernels.c`), the pruned and the exhaustive pass gave
    this field log scores up to 0.06 apart on the 135M (0.13 on the 0.5B). A candidate's
    score must be the same whatever else its pass holds, and equal one prompt per
    candidate through the same kernels."""
    from typing import Literal

    from pydantic import Field, create_model

    from benchmarks.scenarios.tariff import HS_CODES

    dec = Decider.load(compute="int8")
    assert dec.engine.every_size  # every attention call takes the kernel, whatever its size
    codes = tuple(c for c, _ in HS_CODES[:48])
    assert "040900" in codes
    model = create_model(
        "Tariff",
        hs_code=(Literal[codes], Field(description="The 6-digit HS subheading")),  # type: ignore[call-overload]
    )
    text = "Shipment of natural honey in 25 kg drums."
    pruned = dec.decide(model, text, scoring="constrained", pruning="on").fields["hs_code"]
    whole = dec.decide(model, text, scoring="constrained", pruning="off").fields["hs_code"]
    zp, zw = np.array(pruned.log_scores), np.array(whole.log_scores)
    seen = np.isfinite(zp)
    assert 2 <= seen.sum() < len(codes)  # pruning skipped some candidates
    assert np.abs(zp[seen] - zw[seen]).max() <= 1e-6
    # full-vocabulary scores against one prompt per candidate
    zw = np.array(dec.decide(model, text, scoring="full").fields["hs_code"].log_scores)
    top = np.argsort(-zw)[:4]
    with dec.engine.kernels():  # the reference runs through the same kernels
        want = oracle_log_scores(dec, compile_schema(model), text, "hs_code", only=top)
    # log scores are normalised over the candidates: compare them up to that constant
    np.testing.assert_allclose(zw[top] - zw[top[0]], want - want[0], atol=1e-4)


def test_bad_combinations_are_typed_errors(tiny_file, monkeypatch):
    monkeypatch.delenv("PCD_COMPUTE", raising=False)
    with pytest.raises(InvalidArgumentError, match=r"dtype='float32' makes dense weights"):
        Decider.load(tiny_file, dtype="float32", compute="int8")
    if "bf16" not in qgemm.available_modes():
        with pytest.raises(InvalidArgumentError, match=r"needs AVX-512 BF16.*\['float32', 'int8'"):
            Decider.load(tiny_file, compute="bf16")
    with pytest.raises(InvalidArgumentError, match="compute='int3' is not accepted"):
        Decider.load(tiny_file, compute="int3")
    monkeypatch.setenv("PCD_COMPUTE", "int8")
    assert Decider.load(tiny_file).loaded.compute == "int8"
    monkeypatch.setenv("PCD_COMPUTE", "float32")
    assert Decider.load(tiny_file).loaded.compute == "float32"


def test_auto_takes_int8_by_cpu_and_encoding():
    """`auto`'s rule on every int8 kernel: files whose matrices are mostly K-quants take
    int8 where a SIMD int8 kernel runs (AVX-512 VNNI, AVX-VNNI, AVX2), float32 on the
    portable one; 32-block files of at least 256 MiB on AVX-VNNI and AVX2 (the column-panel
    32-block kernels), smaller ones and dense models never."""

    class W:  # what auto_compute reads of a tensor; the bytes are never allocated
        def __init__(self, n: int, t: str):
            self.data = np.broadcast_to(np.zeros(1, np.uint8), (n,))
            self.type_name = t

    class M:
        def __init__(self, *mods: Any):
            self.mods = mods

        def named_modules(self) -> list[tuple[str, Any]]:
            return [(str(i), m) for i, m in enumerate(self.mods)]

    q4km = M(GGUFLinear(W(756_781_056, "Q4_K")), GGUFLinear(W(354_009_600, "Q6_K")))  # 1.5B
    mostly_32 = M(  # Qwen2.5-0.5B's Q4_K_M file: 15% K-quants
        GGUFLinear(W(146_105_344, "Q8_0")),
        GGUFLinear(W(266_742_784, "Q5_0")),
        GGUFLinear(W(42_900_480, "Q6_K")),
        GGUFLinear(W(29_417_472, "Q4_K")),
    )
    q41 = M(GGUFLinear(W(10**8, "Q4_1")))  # the embedded 135M's size
    edge = M(GGUFLinear(W(INT8_MIN_BYTES - 1, "Q8_0")), GGUFEmbedding(W(1, "Q8_0")))
    for isa, want, want_32 in (
        ("avx512vnni", "int8", "int8"),
        ("avxvnni", "int8", "int8"),
        ("avx2", "int8", "int8"),
        ("scalar", "float32", "float32"),
    ):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(qgemm, "isa", lambda isa=isa: isa)
            assert auto_compute(q4km) == want, isa
            assert auto_compute(mostly_32) == want_32, isa
            assert auto_compute(edge) == want_32, isa  # exactly 256 MiB
            assert auto_compute(M(GGUFLinear(W(INT8_MIN_BYTES - 1, "Q8_0")))) == "float32", isa
            assert auto_compute(q41) == "float32", isa
            assert auto_compute(M()) == "float32", isa  # dense: nothing encoded


def test_auto_picks_int8_for_k_quant_files_where_an_int8_simd_kernel_runs(tiny_file, monkeypatch):
    """`auto` on a real (tiny) K-quant file: int8 where a SIMD int8 kernel runs (AVX-512
    VNNI, AVX-VNNI, AVX2), float32 elsewhere (BENCHMARKS.md, "Quantized GEMM kernels")."""
    monkeypatch.delenv("PCD_COMPUTE", raising=False)
    fast = qgemm.isa() in ("avx512vnni", "avxvnni", "avx2")
    auto = Decider.load(tiny_file, dtype="quantized")  # Q4_K matrices, a Q6_K head
    assert auto.loaded.compute == ("int8" if fast else "float32")
    assert auto_compute(auto.engine.model) == auto.loaded.compute
    if fast:  # what it runs is the int8 mode's numbers, bit for bit
        sch = compile_schema(Ticket)
        a = auto.decide(sch, CONTEXT)
        b = Decider.load(tiny_file, compute="int8").decide(sch, CONTEXT)
        for name, f in a.fields.items():
            assert f.distribution == b.fields[name].distribution
    # a 32-block file (the embedded Q4_1 model, kept encoded) stays float32
    try:
        q41 = Decider.load(dtype="quantized")
    except ModelLoadError as e:
        pytest.skip(str(e))
    assert q41.loaded.compute == "float32" and auto_compute(q41.engine.model) == "float32"
    # dense weights (the embedded model under dtype="auto") have no encoded matrices
    assert Decider.load().loaded.compute == "float32"
