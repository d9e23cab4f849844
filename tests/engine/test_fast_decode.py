"""The native decode step (`fast_decode`, `_decode.c`) against MLX float32.

- float32 weights: the kernel's math equals MLX to about 1e-6 of the logit scale;
- 8-bit weights: on weights already on an 8-bit grid it equals MLX to the same
  precision, so on other weights its only error is the rounding of the weights; on the
  embedded model (GGUF Q4_1 and Q8_0) the blocks are lossless and the logits equal
  MLX's to about 1e-5;
- every code path (AVX-512, AVX2, portable C) gives the same logits, and a batch of rows
  gives exactly the logits of one row at a time;
- the options and their errors.
"""

from __future__ import annotations

import numpy as np
import pytest

from pcd_tools.engine.decode.generate import forward, write
from pcd_tools.engine.decode.native_steps import (
    NativeDecoder,
    check_decode,
    decoder_for,
    unsupported_reason,
)
from pcd_tools.engine.host.blas import import_mlx
from pcd_tools.engine.kernels.paths import PATHS
from pcd_tools.engine.passes.forward import Passes
from pcd_tools.errors import DecodeUnavailableError, InvalidArgumentError
from tests.conftest import make_tiny_model, tiny_decider

mx = import_mlx()
pytestmark = pytest.mark.engine

TOKENS = [5, 77, 200, 3, 9, 100, 42, 250]


def _cache(model, prompt):
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    first = forward(Passes(model, "llama"), prompt, cache)
    return cache, first


def _mlx_logits(model, prompt, tokens):
    """MLX float32 logits after each of `tokens`, one call per token (the reference)."""
    cache, _ = _cache(model, prompt)
    passes = Passes(model, "llama")
    return [forward(passes, [t], cache) for t in tokens]


def _native_logits(dec, model, prompt, tokens):
    cache, _ = _cache(model, prompt)
    st = dec.stepper([cache], len(tokens))
    return [st.step([t])[0] for t in tokens]


def teacher_forced(eng, prompt, decoders, n):
    """Steps each decoder along MLX float32's own greedy text for n tokens after `prompt`:
    per decoder, the steps whose argmax is MLX's and the largest |logit difference|; and
    the caches (MLX's first, then the decoders', which the steps leave as they were)."""
    from mlx_lm.models.cache import make_prompt_cache

    caches = [make_prompt_cache(eng.model) for _ in range(len(decoders) + 1)]
    logits = forward(eng.passes, prompt, caches[0])
    for c in caches[1:]:
        forward(eng.passes, prompt, c)
    steppers = [d.stepper([c], n) for d, c in zip(decoders, caches[1:])]
    agree, err = [0] * len(decoders), [0.0] * len(decoders)
    for _ in range(n):
        t = int(np.argmax(logits))
        logits = forward(eng.passes, [t], caches[0])
        for i, st in enumerate(steppers):
            got = st.step([t])[0]
            agree[i] += int(np.argmax(got) == np.argmax(logits))
            err[i] = max(err[i], float(np.abs(got - logits).max()))
    return agree, err, caches


def _rel(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


def _isas():
    from pcd_tools.engine.kernels.bindings import load_decode_kernels

    lib = load_decode_kernels()
    return [n for n in ("avx512", "avx2", "scalar") if lib.pcd_decode_path(PATHS[n])]


def _on_8bit_grid(model):
    """`model` with every linear weight rounded to 8-bit affine blocks of 32 (numpy)."""
    import mlx.nn as nn

    for _, m in model.named_modules():
        if isinstance(m, nn.Linear):
            w = np.array(m.weight, dtype=np.float32)
            b = w.reshape(w.shape[0], -1, 32)
            lo, hi = b.min(-1, keepdims=True), b.max(-1, keepdims=True)
            d = (hi - lo) / 255
            q = np.rint((b - lo) / np.where(d > 0, d, 1))
            m.weight = mx.array((lo + q * d).reshape(w.shape).astype(np.float32))
    mx.eval(model.parameters())
    return model


@pytest.fixture(scope="module")
def model():
    return make_tiny_model(0)


@pytest.fixture(scope="module")
def prompt():
    return list(range(10, 70))


def test_the_float32_kernel_equals_mlx_on_every_code_path(model, prompt):
    want = _mlx_logits(model, prompt, TOKENS)
    for isa in _isas():
        got = _native_logits(NativeDecoder(model, wbits=32, isa=isa), model, prompt, TOKENS)
        errs = [_rel(g, w) for g, w in zip(got, want)]
        assert max(errs) < 1e-4, (isa, errs)  # measured: 2e-6 to 1e-5


def test_positions_past_the_first_rope_table(model):
    long = [(7 * i) % 250 + 3 for i in range(300)]
    dec = NativeDecoder(model, wbits=32, context_window=64)  # a table of 64 positions first
    assert dec._model.rope_len == 64
    got = _native_logits(dec, model, long, TOKENS)
    assert dec._model.rope_len >= len(long) + len(TOKENS)
    want = _mlx_logits(model, long, TOKENS)
    assert max(_rel(g, w) for g, w in zip(got, want)) < 1e-4


def test_the_8bit_kernel_is_exact_on_weights_already_on_an_8bit_grid(prompt):
    grid = _on_8bit_grid(make_tiny_model(0))
    want = _mlx_logits(grid, prompt, TOKENS)
    for scheme in ("affine", "auto"):
        got = _native_logits(NativeDecoder(grid, scheme=scheme), grid, prompt, TOKENS)
        assert max(_rel(g, w) for g, w in zip(got, want)) < 1e-4, scheme


def test_the_8bit_error_is_the_rounding_of_the_weights(model, prompt):
    """On random weights (scaled up 3x: sharp, sensitive logits) the 8-bit logits move by
    about as much as MLX's own logits move when its weights are rounded to 8 bits; the
    kernel adds nothing beyond that (previous test). Measured: 1-7% of the logit scale."""
    want = _mlx_logits(model, prompt, TOKENS)
    rounded = _mlx_logits(_on_8bit_grid(make_tiny_model(0)), prompt, TOKENS)
    budget = max(_rel(r, w) for r, w in zip(rounded, want))
    for scheme in ("auto", "affine", "symmetric"):
        got = _native_logits(NativeDecoder(model, scheme=scheme), model, prompt, TOKENS)
        err = max(_rel(g, w) for g, w in zip(got, want))
        assert err < 2.5 * budget + 1e-4, (scheme, err, budget)


def test_every_code_path_gives_the_same_8bit_logits(model, prompt, monkeypatch):
    paths = _isas()
    assert "scalar" in paths
    ref = _native_logits(NativeDecoder(model, isa="scalar"), model, prompt, TOKENS)
    for isa in paths:
        got = _native_logits(NativeDecoder(model, isa=isa), model, prompt, TOKENS)
        assert max(_rel(g, r) for g, r in zip(got, ref)) < 1e-5, isa  # summation order only
        monkeypatch.setenv("PCD_DECODE_ISA", isa)
        assert NativeDecoder(model).isa == {"avx512": 512, "avx2": 256, "scalar": 1}[isa]
    monkeypatch.setenv("PCD_DECODE_ISA", "sse9")
    with pytest.raises(InvalidArgumentError, match="accepted"):
        NativeDecoder(model)


def test_a_batch_of_rows_gives_exactly_the_logits_of_one_row_at_a_time(model):
    for isa in _isas():
        dec = NativeDecoder(model, isa=isa)
        caches = [_cache(model, list(range(5 + r, 30 + 3 * r)))[0] for r in range(11)]
        batch = dec.stepper(caches, 8)
        alone = [dec.stepper([c], 8) for c in caches]
        for step in range(4):
            toks = [(7 * r + 13 * step) % 259 for r in range(11)]
            rows = [r for r in range(11) if (r + step) % 4]  # rows drop out and come back
            out = batch.step([toks[r] for r in rows], rows)
            for i, r in enumerate(rows):
                assert np.array_equal(out[i], alone[r].step([toks[r]])[0]), (isa, step, r)
                assert batch.position(r) == alone[r].position(0)
        assert batch.decoded(1) == alone[1].decoded(0)


def test_any_thread_count_gives_the_same_logits_and_the_tuner_takes_the_fastest(model, prompt):
    from pcd_tools.engine.host.threads import ThreadTuner

    one = _native_logits(NativeDecoder(model, threads=1), model, prompt, TOKENS)
    three = _native_logits(NativeDecoder(model, threads=3), model, prompt, TOKENS)
    assert all(np.array_equal(a, b) for a, b in zip(one, three))  # one thread per output
    tuner = ThreadTuner(3, fixed=False)
    picks = []
    for _ in range(64):
        t = tuner.pick(1)
        picks.append(t)
        tuner.record(1, t, {1: 0.03, 2: 0.01, 3: 0.02}[t])
    assert picks[:6] == [1, 1, 2, 2, 3, 3]  # each count twice, then the fastest
    assert picks.count(2) >= 54 and {1, 3} <= set(picks[6:])  # tried again now and then
    assert ThreadTuner(3, fixed=True).pick(1) == 3


def test_finish_leaves_the_mlx_cache_as_mlx_decoding_does(model, prompt):
    dec = NativeDecoder(model)
    native, _ = _cache(model, prompt)
    st = dec.stepper([native], len(TOKENS))
    for t in TOKENS:
        st.step([t])
    assert native[0].offset == len(prompt)  # the stepped tokens are not in the cache yet
    assert st.finish(Passes(model, "llama"), [native]) == 1
    ref, _ = _cache(model, prompt)
    passes = Passes(model, "llama")
    for t in TOKENS:
        forward(passes, [t], ref)
    assert native[0].offset == ref[0].offset == len(prompt) + len(TOKENS)
    for a, b in zip(native, ref):
        n = a.offset
        np.testing.assert_allclose(
            np.array(a.keys[..., :n, :]), np.array(b.keys[..., :n, :]), atol=1e-4
        )
        np.testing.assert_allclose(
            np.array(a.values[..., :n, :]), np.array(b.values[..., :n, :]), atol=1e-4
        )
    # and the next token sees the same context either way
    a, b = forward(passes, [7], native), forward(passes, [7], ref)
    assert _rel(a, b) < 1e-4


def test_a_qwen2_model_with_attention_biases():
    from mlx.utils import tree_map
    from mlx_lm.models import qwen2

    args = qwen2.ModelArgs(
        model_type="qwen2",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        vocab_size=259,
        tie_word_embeddings=True,
    )
    mx.random.seed(1)
    m = qwen2.Model(args)
    m.update(tree_map(lambda p: p * 3.0, m.parameters()))
    mx.eval(m.parameters())
    assert unsupported_reason(m, "cpu") is None
    prompt = list(range(3, 40))
    want = _mlx_logits(m, prompt, TOKENS[:4])
    got = _native_logits(NativeDecoder(m, wbits=32), m, prompt, TOKENS[:4])
    assert max(_rel(g, w) for g, w in zip(got, want)) < 1e-4


def test_steps_past_the_capacity_or_outside_the_vocabulary_are_refused(model, prompt):
    st = NativeDecoder(model).stepper([_cache(model, prompt)[0]], 1)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        st.step([259])
    st.step([3])
    with pytest.raises(ValueError, match="taken its 1 steps"):
        st.step([3])
    with pytest.raises(ValueError, match="one token per row"):
        st.step([1, 2])
    st.close()
    with pytest.raises(ValueError, match="closed"):
        st.step([3])


# --- options ----------------------------------------------------------------------------


def test_the_decode_option_and_its_errors(monkeypatch):
    monkeypatch.delenv("PCD_DECODE", raising=False)
    assert check_decode(None) == "auto" and check_decode("int8") == "int8"
    with pytest.raises(InvalidArgumentError, match=r"decode='fast'.*accepted: 'auto'.*'mlx'"):
        tiny_decider(0, decode="fast")
    monkeypatch.setenv("PCD_DECODE", "MLX")
    d = tiny_decider(0)
    assert d.engine.decode == "mlx" and decoder_for(d.engine) is None
    assert tiny_decider(0, decode="auto").engine.decode == "auto"  # the option wins
    monkeypatch.setenv("PCD_DECODE", "gpu")
    with pytest.raises(InvalidArgumentError, match="PCD_DECODE='gpu'"):
        tiny_decider(0)
    monkeypatch.delenv("PCD_DECODE")
    d = tiny_decider(0, decode="int8")
    assert isinstance(decoder_for(d.engine), NativeDecoder)


def test_the_weights_option_its_errors_and_the_auto_policy(monkeypatch, tmp_path):
    """'auto' packs the 8-bit copy unless it would take over a quarter of the memory
    available; a dense model gets the copy whatever is asked (it has no file blocks)."""
    from pcd_tools.engine.decode.parts import check_weights
    from pcd_tools.engine.host import cgroups

    monkeypatch.delenv("PCD_DECODE_WEIGHTS", raising=False)
    assert check_weights(None) == "auto" and check_weights("file") == "file"
    with pytest.raises(InvalidArgumentError, match=r"weights='mmap'.*accepted: 'auto'"):
        NativeDecoder(make_tiny_model(0), weights="mmap")
    monkeypatch.setenv("PCD_DECODE_WEIGHTS", "Copy ")
    assert check_weights(None) == "copy"
    monkeypatch.setenv("PCD_DECODE_WEIGHTS", "disk")
    with pytest.raises(InvalidArgumentError, match="PCD_DECODE_WEIGHTS='disk'"):
        check_weights(None)
    monkeypatch.delenv("PCD_DECODE_WEIGHTS")
    free = cgroups.available_memory()
    assert free > 0
    cg = tmp_path / "cgroup"  # a container's limit caps what is available
    (cg / "memory").mkdir(parents=True)
    monkeypatch.setattr(cgroups, "CGROUP_ROOT", cg)
    (cg / "memory.max").write_text("max\n")
    (cg / "memory.current").write_text("1000\n")
    assert cgroups.available_memory() == pytest.approx(free, rel=0.2)  # no limit
    (cg / "memory.max").write_text(f"{2**30 + 1000}\n")
    assert cgroups.available_memory() == min(2**30, free)
    (cg / "memory.max").unlink()
    (cg / "memory" / "memory.limit_in_bytes").write_text(f"{2**29}\n")
    (cg / "memory" / "memory.usage_in_bytes").write_text(f"{2**28}\n")
    assert cgroups.available_memory() == min(2**28, free)
    dense = NativeDecoder(make_tiny_model(0), weights="file")
    assert dense.mapped_bytes == 0 and dense.copies == 7 * 2 + 1


@pytest.mark.integration
def test_auto_reads_the_file_blocks_when_a_copy_would_crowd_memory(monkeypatch):
    from pcd_tools import Decider
    from pcd_tools.engine.decode import native_steps as fast_decode

    try:
        model = Decider.load(dtype="quantized").engine.model
    except Exception as e:  # no compiler for the encoded kernels
        pytest.skip(str(e))
    copy = NativeDecoder(model)  # 169 MB of copies against GBs available
    assert copy.mapped_bytes == 0 and copy.copies > 0
    monkeypatch.setattr(fast_decode, "available_memory", lambda: 2 * copy.nbytes)
    assert NativeDecoder(model).copies == 0
    monkeypatch.setattr(fast_decode, "available_memory", lambda: 8 * copy.nbytes)
    assert NativeDecoder(model).copies > 0


def test_int8_where_it_cannot_run_raises_and_auto_falls_back(monkeypatch, tmp_path):
    from mlx_lm.models import gpt2

    from pcd_tools.decide.decider import Decider
    from pcd_tools.engine.load.sources import LoadedModel
    from tests.conftest import ByteTokenizer

    def loaded(model, device="cpu", model_type="llama"):
        return LoadedModel(
            model, ByteTokenizer(), "m", "test", "", model_type, 4096, "float32", device
        )

    with pytest.raises(DecodeUnavailableError, match="runs on 'metal'") as e:
        Decider(loaded(make_tiny_model(0), device="metal"), decode="int8")
    assert "decode='mlx'" in str(e.value) and e.value.reason
    args = gpt2.ModelArgs(
        model_type="gpt2",
        n_ctx=64,
        n_embd=64,
        n_head=2,
        n_layer=1,
        n_positions=64,
        layer_norm_epsilon=1e-5,
        vocab_size=259,
    )
    other = gpt2.Model(args)
    assert "not a llama or qwen2 model" in unsupported_reason(other, "cpu")
    with pytest.raises(DecodeUnavailableError, match="not a llama or qwen2 model"):
        Decider(loaded(other, model_type="gpt2"), decode="int8")
    # no C compiler: auto decodes with MLX, int8 says why
    monkeypatch.setenv("PCD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert decoder_for(tiny_decider(0).engine) is None
    with pytest.raises(DecodeUnavailableError, match=r"failed|compiler"):
        tiny_decider(0, decode="int8")


# --- the embedded model -----------------------------------------------------------------


@pytest.mark.integration
def test_the_embedded_model_decodes_as_mlx_does(real):
    """Teacher-forced along MLX's own greedy text: how often the 8-bit argmax agrees, and
    how far the logits are. Measured: 'auto' blocks 100% and ~3e-5 (the GGUF's Q4_1 and
    Q8_0 weights are exact in 8 bits); llama.cpp-style symmetric blocks ~97%, up to 0.6."""
    eng = real.engine
    prompt = eng.encode_ids("I was charged twice for my subscription, please refund one.") * 4
    dec = decoder_for(eng)
    assert dec is not None and dec.scheme == "auto"
    sym = NativeDecoder(eng.model, scheme="symmetric")
    agree, err, caches = teacher_forced(eng, prompt, [dec, sym], 32)
    assert agree[0] == 32 and err[0] < 1e-3, (agree, err)
    assert agree[1] >= 0.9 * 32, (agree, err)
    write(eng.passes, [1], caches[0])  # the MLX caches were left as they were
    assert caches[1][0].offset == caches[2][0].offset == len(prompt)


@pytest.mark.integration
def test_an_encoded_model_is_read_from_its_file_blocks(real):
    """With the model kept in its GGUF encoding, the steps read the file's blocks: no copy
    of any matrix or of the embedding (the tied head is the embedding's blocks), and the
    logits are MLX float32's on the same weights (measured 6.4e-5; the 8-bit copy, lossless
    for this file's Q4_1 / Q8_0, 5.4e-5: both float32 rounding). With
    `weights="copy"` the decoder packs the 8-bit copy (the embedding still stays
    encoded: each step dequantizes its tokens' rows), bit for bit the dense model's."""
    from mlx_lm.models.cache import make_prompt_cache

    from pcd_tools import Decider

    try:
        enc = Decider.load(dtype="quantized").engine
    except Exception as e:  # no compiler for the encoded kernels
        pytest.skip(str(e))
    dense = real.engine
    prompt = dense.encode_ids("My card was declined at the store twice today.")
    d_file = NativeDecoder(enc.model, weights="file")
    d_copy, d_dense = NativeDecoder(enc.model, weights="copy"), NativeDecoder(dense.model)
    assert d_file.embed is None and d_copy.embed is None and d_dense.embed is not None
    file_bytes = sum(
        m.weight.nbytes for _, m in enc.model.named_modules() if hasattr(m, "gguf_encoded")
    )
    assert d_file.mapped_bytes == file_bytes  # every matrix and the embedding, in place
    assert d_file.copies == 0 and d_copy.copies == 7 * 30 + 1
    assert d_file.nbytes < 2**22 < d_copy.nbytes  # norms and RoPE tables, against 169 MB
    assert abs(d_copy.nbytes - d_dense.nbytes) < d_dense.embed.nbytes // 100

    caches = [make_prompt_cache(m) for m in (enc.model, dense.model, dense.model, enc.model)]
    forward(enc.passes, prompt, caches[0])
    for c in caches[1:]:
        forward(dense.passes, prompt, c)
    a, b = d_copy.stepper([caches[0]], 6), d_dense.stepper([caches[1]], 6)
    for t in (TOKENS[:2], TOKENS[2:4], TOKENS[4:6]):  # one row per step, and a repeat token
        for tok in t:
            np.testing.assert_array_equal(a.step([tok]), b.step([tok]))

    f, c8 = d_file.stepper([caches[3]], 16), d_dense.stepper([caches[2]], 16)
    mlx_cache = make_prompt_cache(dense.model)
    logits = forward(dense.passes, prompt, mlx_cache)
    err_file = err_copy = 0.0
    for _ in range(16):
        t = int(np.argmax(logits))
        logits = forward(dense.passes, [t], mlx_cache)
        got, got8 = f.step([t])[0], c8.step([t])[0]
        assert int(np.argmax(got)) == int(np.argmax(logits))
        err_file = max(err_file, float(np.abs(got - logits).max()))
        err_copy = max(err_copy, float(np.abs(got8 - logits).max()))
    assert err_file < 2e-4 and err_copy < 2e-4, (err_file, err_copy)


def test_the_activations_option_and_its_errors(monkeypatch):
    """What the steps multiply the file's blocks by: 8-bit activations ('int8') or float32;
    'auto' follows the model's compute mode. A dense model has no blocks: float32."""
    from pcd_tools.engine.decode.parts import pick_activations

    dense = make_tiny_model(0)
    assert pick_activations(None, dense) == "float32" == pick_activations("auto", dense)
    assert pick_activations("int8", dense) == "int8"
    for bad in ("int4", 8, "INT8"):
        with pytest.raises(InvalidArgumentError, match=r"activations=.*'float32'.*'int8'"):
            NativeDecoder(dense, activations=bad)
    d = NativeDecoder(dense, activations="int8")
    assert d.activations == "float32" and d.mapped_bytes == 0  # nothing read as blocks


@pytest.mark.integration
def test_int8_compute_decodes_the_file_blocks_with_8bit_activations():
    """With `compute="int8"` the steps take 8-bit activations too (integer dots over the
    file's blocks, read in place: 'auto' weights need no copy then, being faster than it).
    Teacher-forced along MLX float32's greedy text on the embedded model: measured 32/32
    argmax and max |dlogit| 0.68 (the activations' rounding, as llama.cpp's; float32
    activations on the same blocks: 4e-5). A batch's rows equal one row at a time."""
    from pcd_tools import Decider

    fast = Decider.load(compute="int8")  # the embedded model kept encoded, int8
    dec = decoder_for(fast.engine)
    assert dec is not None and dec.activations == "int8" and dec.weights == "auto"
    assert dec.copies == 0 and dec.mapped_bytes > 90e6  # in place
    f32 = NativeDecoder(fast.engine.model, weights="file", activations="float32")
    ref = Decider.load().engine  # dense float32: the reference numbers
    prompt = ref.encode_ids("I was charged twice for my subscription, please refund one.") * 4
    agree, err, caches = teacher_forced(ref, prompt, [dec, f32], 32)
    assert agree[0] >= 30 and err[0] < 2.0, (agree, err)
    assert agree[1] == 32 and err[1] < 1e-3 and err[1] < err[0] / 100, (agree, err)
    one = [dec.stepper([caches[1]], 4) for _ in range(3)]
    batch = dec.stepper([caches[1]] * 3, 4)
    for toks in ([5, 77, 200], [3, 3, 9]):
        rows = batch.step(toks)
        for i, t in enumerate(toks):
            np.testing.assert_array_equal(one[i].step([t])[0], rows[i])
    # every code path: AVX2's integer dots equal AVX-512 VNNI's (the same int32 lanes and
    # float operations); the portable C kernels sum in another order
    paths = {i: NativeDecoder(fast.engine.model, isa=i).stepper([caches[1]], 4) for i in _isas()}
    for t in TOKENS[:4]:
        got = {i: st.step([t])[0] for i, st in paths.items()}
        if "avx512" in got and "avx2" in got:
            np.testing.assert_array_equal(got["avx512"], got["avx2"])
        for i, g in got.items():  # the activations' rounding amplifies the sum order's
            assert np.isfinite(g).all() and np.abs(g - got[_isas()[0]]).max() < 2.0, i
