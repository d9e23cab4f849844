"""The arithmetic of a pass (`engine.flops`): FLOP counts from a model's own shapes."""

from __future__ import annotations

import numpy as np
import pytest

from pcd_tools.bench.flops import Arithmetic, arithmetic
from pcd_tools.engine.passes.pack import Chunk
from tests.conftest import make_tiny_model

# The tiny llama: 2 layers, hidden 64, 4 heads of 16 (2 for keys and values), MLP 128,
# vocabulary 259, untied head.
LINEAR = 2 * 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128)
PAIR = 2 * 4 * 64
HEAD = 2 * 259 * 64


def test_the_tiny_model_counts_match_its_shapes():
    ar = arithmetic(make_tiny_model(0))
    assert ar == Arithmetic(LINEAR, PAIR, HEAD, 2)


def test_a_quantized_model_counts_the_same_arithmetic():
    import mlx.nn as nn

    model = make_tiny_model(0)
    nn.quantize(model, group_size=32, bits=4)
    assert type(model.model.layers[0].self_attn.q_proj).__name__ == "QuantizedLinear"
    assert arithmetic(model) == Arithmetic(LINEAR, PAIR, HEAD, 2)


def test_a_causal_prefill_counts_each_pair_once():
    ar = Arithmetic(10.0, 1.0, 100.0, 1)
    # 3 new tokens after 2 cached ones: pairs by brute force over the causal mask
    pairs = sum(1 for q in range(2, 5) for k in range(5) if k <= q)
    assert ar.prefill(3, cached=2) == 3 * 10.0 + pairs * 1.0
    assert ar.prefill(3, cached=2, head_positions=1) == 3 * 10.0 + pairs + 100.0


def test_a_packed_pass_counts_the_prompt_the_allowed_pack_tokens_and_the_slots():
    ar = Arithmetic(10.0, 1.0, 100.0, 1)
    allow = np.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=bool)  # two branches
    ch = Chunk(
        fields=[0],
        part_nodes=[np.array([0, 1, 2])],
        tokens=np.array([5, 6, 7]),
        rel_pos=np.array([0, 1, 1]),
        allow=allow,
        node_index=[np.array([0, 1])],  # the logits read at pack positions 0 and 1
    )
    prompt = 7
    assert ar.packed([ch], prompt) == 3 * 10.0 + (3 * prompt + 5) * 1.0 + 2 * 100.0
    assert ar.packed([ch, ch], prompt) == 2 * ar.packed([ch], prompt)


def test_unknown_layouts_have_no_arithmetic():
    class Bare:
        pass

    assert arithmetic(Bare()) is None
    model = make_tiny_model(0)
    del model.model.layers[0].self_attn.q_proj  # not a llama-like attention
    assert arithmetic(model) is None


@pytest.mark.integration
def test_the_embedded_model_matches_the_benchmarks_arithmetic(real):
    ar = arithmetic(real.engine.passes.model)
    # BENCHMARKS.md, "The arithmetic": 7.08 M per layer and token over 30 layers,
    # 2,304 per query-key pair and layer, 49,152 x 576 x 2 per scored position
    assert ar.layers == 30
    assert ar.linear_per_token == pytest.approx(30 * 7.08e6, rel=2e-3)
    assert ar.attention_per_pair == 30 * 2304
    assert ar.head_per_position == 49152 * 576 * 2
