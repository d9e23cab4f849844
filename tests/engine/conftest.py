"""Fixtures shared by the engine tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    """A llama-architecture GGUF of the "tiny" test shape with random Q4_K weights and the
    embedded model's tokenizer (`benchmarks.model_size.write_random_gguf`)."""
    pytest.importorskip("gguf")
    from benchmarks.model_size import SHAPES, write_random_gguf
    from pcd_tools.engine.load.sources import embedded_model_path
    from pcd_tools.errors import ModelLoadError

    try:
        tokenizer = embedded_model_path()
    except ModelLoadError as e:
        pytest.skip(str(e))
    path = tmp_path_factory.mktemp("random") / "tiny.gguf"
    return write_random_gguf(path, SHAPES["tiny"], tokenizer, seed=5)
