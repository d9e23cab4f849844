"""The random-weight GGUF writer of `benchmarks/model_size.py` (its 3B and 7B files), at a
tiny shape: a valid llama GGUF of Q4_K matrices and a Q6_K head that `Decider.load` loads
in the file's encoding and as dense float32, with the same probabilities."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from benchmarks.model_size import SHAPES, _tensor_plan, write_random_gguf  # noqa: E402
from pcd_tools import Decider  # noqa: E402
from pcd_tools.engine.load.sources import embedded_model_path  # noqa: E402
from pcd_tools.errors import InvalidArgumentError, ModelLoadError  # noqa: E402
from tests.schemas import Ticket  # noqa: E402

pytestmark = pytest.mark.engine

CONTEXT = "Checkout fails for every EU customer since 9:00; we lose orders."


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    try:
        tokenizer = embedded_model_path()
    except ModelLoadError as e:
        pytest.skip(str(e))
    path = tmp_path_factory.mktemp("random") / "tiny.gguf"
    return write_random_gguf(path, SHAPES["tiny"], tokenizer, seed=3), tokenizer


def test_file_holds_the_planned_tensors(tiny_file):
    path, tokenizer = tiny_file
    assert not path.with_name(path.name + ".part").exists()
    reader = gguf.GGUFReader(str(path))
    src = gguf.GGUFReader(str(tokenizer))
    vocab = len(src.fields["tokenizer.ggml.tokens"].contents())
    assert reader.fields["general.architecture"].contents() == "llama"
    assert reader.fields["llama.block_count"].contents() == 2
    assert (
        reader.fields["tokenizer.ggml.tokens"].contents()
        == src.fields["tokenizer.ggml.tokens"].contents()
    )
    got = {t.name: (t.tensor_type.name, [int(x) for x in t.shape[::-1]]) for t in reader.tensors}
    want = {name: (kind, list(dims)) for name, kind, dims in _tensor_plan(SHAPES["tiny"], vocab)}
    assert got == want
    assert got["output.weight"] == ("Q6_K", [vocab, 256])
    for t in reader.tensors:  # gguf-py's own decoding: finite, and not constant
        if t.name in ("blk.0.ffn_down.weight", "output.weight", "token_embd.weight"):
            w = gguf.quants.dequantize(t.data, t.tensor_type)
            assert np.isfinite(w).all() and 0.005 < float(w.std()) < 0.5, (t.name, w.std())


def test_loads_through_decider_and_modes_agree(tiny_file):
    path, _ = tiny_file
    # the file's encoding on CPU, in float32 ("auto" picks int8 on AVX-512 VNNI CPUs)
    encoded = Decider.load(path, dtype="quantized", compute="float32")
    dense = Decider.load(path, dtype="float32")
    assert encoded.loaded.dtype.startswith("gguf-")
    assert dense.loaded.dtype == "float32"
    a, b = encoded.decide(Ticket, CONTEXT), dense.decide(Ticket, CONTEXT)
    for name, f in a.fields.items():
        p = np.array(list(f.distribution.values()))
        q = np.array(list(b.fields[name].distribution.values()))
        assert np.isfinite(p).all() and abs(p.sum() - 1) < 1e-5
        np.testing.assert_allclose(p, q, atol=1e-5)
        assert f.label == b.fields[name].label


def test_widths_must_be_whole_blocks(tmp_path):
    from dataclasses import replace

    with pytest.raises(InvalidArgumentError, match=r"multiples of 256\); got 300"):
        write_random_gguf(
            tmp_path / "x.gguf", replace(SHAPES["tiny"], ffn=300), embedded_model_path()
        )
