"""Shared fixtures: a tiny random-weight llama with a byte tokenizer, and the real model."""

from __future__ import annotations

import os
from collections.abc import Sequence

import pytest

# Threads per request stay fixed in the suite: counts such as `sequential_forward_passes`
# must not depend on what else the machine runs. tests/engine/test_cpus.py turns the
# adaptation on where it tests it.
os.environ.setdefault("PCD_ADAPTIVE_THREADS", "0")

# Bind the fast BLAS before any test module imports mlx (binding after the import is a no-op).
from pcd_tools.engine.host.blas import setup_blas

setup_blas()


class ByteTokenizer:
    """One token per UTF-8 byte: deterministic, and every candidate is multi-token."""

    vocab_size = 259
    bos_token_id = 256
    eos_token_ids = frozenset({257})

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages, add_generation_prompt=True):
        return None  # plain-text layout


def make_tiny_model(seed: int = 0, vocab: int = 259, bias: dict[int, float] | None = None):
    """A 2-layer random llama in float32 (mlx-lm's own classes)."""
    from pcd_tools.engine.host.blas import import_mlx

    mx = import_mlx()
    from mlx_lm.models import llama

    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=vocab,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    mx.random.seed(seed)
    model = llama.Model(args)
    # scale weights up so distributions are far from uniform (a sharper test)
    from mlx.utils import tree_map

    model.update(tree_map(lambda p: p * 3.0, model.parameters()))
    if bias:
        b = mx.zeros((vocab,))
        for tok, val in bias.items():
            b[tok] = val
        model.lm_head.bias = b
    mx.eval(model.parameters())
    return model


def tiny_decider(seed: int = 0, **engine):
    from pcd_tools.decide.decider import Decider
    from pcd_tools.engine.load.sources import LoadedModel

    loaded = LoadedModel(
        model=make_tiny_model(seed),
        tokenizer=ByteTokenizer(),
        model_id=f"tiny-llama-{seed}",
        source="test",
        path="",
        model_type="llama",
        context_window=8192,
        dtype="float32",
        device="cpu",
    )
    return Decider(loaded, **engine)


@pytest.fixture(scope="session")
def tiny():
    return tiny_decider(0)


@pytest.fixture(scope="session")
def real():
    from pcd_tools import Decider

    return Decider.load()


def pytest_collection_modifyitems(config, items):
    """`bigmodel` tests (the real 0.5B and 1.5B GGUFs) run only when `-m` names them
    (`pytest -m bigmodel`); every other run, `make test` and `.ci/run` included, deselects
    them, whatever else its `-m` selects."""
    if "bigmodel" in (config.getoption("markexpr") or ""):
        return
    keep = [i for i in items if i.get_closest_marker("bigmodel") is None]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep
