"""`dtype="auto"` counts what a dense float32 load really costs (issue 52, item 3).

A Gemma 3 270M GGUF (253 MB, 262k-token vocabulary) has 1,022.5 MiB of dense matrices,
just under the 1 GiB rule, so it loaded dense and peaked at 1,678 MiB RSS (the
embedding's 640 MiB dequantized in numpy before MLX copies it); encoded it peaks at
505 MiB. The rule now counts the largest matrix's load scratch too: the Gemma stays
encoded, the embedded SmolLM2-135M (513 + 108 MiB) stays dense.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from pcd_tools.engine.load import gguf


def _shapes(vocab: int, d: int, layers: list[tuple[int, int]]) -> list[SimpleNamespace]:
    return [SimpleNamespace(shape=(vocab, d))] + [SimpleNamespace(shape=s) for s in layers]


def test_a_large_vocabulary_small_model_stays_encoded():
    # Gemma 3 270M's matrices: the 262144 x 640 tied embedding (640 MiB) + 382.5 MiB of layers
    layers = [(640, 640)] * int(382.5 * 2**20 / (4 * 640 * 640))
    gemma = _shapes(262144, 640, layers)
    assert sum(4 * s.shape[0] * s.shape[1] for s in gemma) <= gguf.AUTO_DENSE_BYTES  # the old rule
    assert not gguf.dense_fits(gemma)


def test_the_embedded_models_shapes_stay_dense():
    # SmolLM2-135M: 49152 x 576 tied embedding (108 MiB) + 405 MiB of layers
    layers = [(576, 576)] * int(405 * 2**20 / (4 * 576 * 576))
    assert gguf.dense_fits(_shapes(49152, 576, layers))


def test_the_embedded_model_still_loads_dense():
    from pcd_tools.engine.load.sources import embedded_model_path

    _, tensors = gguf._read_header(str(embedded_model_path()))
    assert gguf.dense_fits(tensors.values())


GEMMA = (
    Path(os.environ.get("PCD_MODELS_DIR", str(Path.home() / ".cache/pcd-tools/models")))
    / "gemma-3-270m-q4_k_m.gguf"
)


@pytest.mark.bigmodel
@pytest.mark.skipif(not GEMMA.is_file(), reason="fetch.py gemma-3-270m")
def test_the_real_gemma_270m_stays_encoded_under_auto():
    _, tensors = gguf._read_header(str(GEMMA))
    assert not gguf.dense_fits(tensors.values())
