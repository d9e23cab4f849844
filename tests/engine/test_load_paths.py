"""`Decider.load` end to end: GGUF files (llama, qwen2) and MLX directories via mlx_lm.load."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pcd_tools import Decider, StructuredSchema
from pcd_tools.engine.load.gguf import GGUFTokenizer
from pcd_tools.engine.load.sources import LoadedModel
from tests.engine import test_gguf as g
from tests.oracle import oracle_log_scores, softmax

pytestmark = pytest.mark.engine

SCHEMA = StructuredSchema(
    {
        "topic": {
            "type": "enum",
            "choices": ["hello", "world", "hello world"],
            "description": "Topic",
        },
        "urgent": {"type": "boolean", "description": "Is it urgent?"},
    }
).schema
CONTEXT = "hello world, hello!"


def _probs(d):
    return {n: np.array(list(f.distribution.values())) for n, f in d.fields.items()}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_gguf_file_decides_like_the_same_weights_loaded_directly(tmp_path, arch):
    weights = g.hf_weights(arch, tied=False, seed=1)
    path = g.write_gguf(tmp_path / f"{arch}.gguf", arch, weights)  # permutes llama Q/K itself
    dec = Decider.load(str(path))
    assert dec.loaded.source == "gguf" and dec.loaded.model_type == arch
    assert dec.loaded.context_window == 256  # from the file's metadata
    dec.engine.context_window = 4096  # the toy vocabulary makes prompts long; RoPE has no limit
    assert dec.engine.default_mode == "packed"
    got = dec.decide(SCHEMA, CONTEXT)
    # the same weights, loaded directly into mlx-lm's class, with the GGUF's tokenizer
    ref_model = g.reference(arch, weights, tied=False)
    ref = Decider(
        LoadedModel(
            ref_model, dec.loaded.tokenizer, "ref", "test", "", arch, 4096, "float32", "cpu"
        )
    ).decide(SCHEMA, CONTEXT, mode="sequential")
    for n, p in _probs(ref).items():
        np.testing.assert_allclose(_probs(got)[n], p, atol=1e-4)
    # and the packed pass equals one full prompt per candidate
    for f in SCHEMA.fields:
        z = oracle_log_scores(dec, SCHEMA, CONTEXT, f.name)
        assert np.abs(_probs(got)[f.name] - softmax(z)).max() < 1e-4


def test_mlx_directory_loads_through_mlx_lm(tmp_path):
    from mlx.utils import tree_flatten

    from pcd_tools.engine.host.blas import import_mlx

    mx = import_mlx()
    weights = g.hf_weights("llama", tied=False, seed=2)
    model = g.reference("llama", weights, tied=False)
    d = tmp_path / "tiny-mlx"
    d.mkdir()
    mx.save_safetensors(str(d / "model.safetensors"), dict(tree_flatten(model.parameters())))
    config = {
        "model_type": "llama",
        "hidden_size": g.HIDDEN,
        "num_hidden_layers": g.LAYERS,
        "intermediate_size": g.FFN,
        "num_attention_heads": g.HEADS,
        "num_key_value_heads": g.KV_HEADS,
        "rms_norm_eps": 1e-5,
        "vocab_size": g.VOCAB,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "max_position_embeddings": 256,
    }
    (d / "config.json").write_text(json.dumps(config))
    tok = GGUFTokenizer(g.tiny_meta())
    tok.backend.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "chat_template": g.TEMPLATE,
                "eos_token": "<|im_end|>",
                "bos_token": None,
                "model_max_length": 256,
            }
        )
    )
    dec = Decider.load(str(d))
    assert dec.loaded.source == "mlx" and dec.loaded.context_window == 256
    dec.engine.context_window = 4096  # the toy vocabulary makes prompts long; RoPE has no limit
    assert dec.loaded.dtype == "float32"
    got = dec.decide(SCHEMA, CONTEXT)
    ref_dec = Decider(LoadedModel(model, tok, "ref", "test", "", "llama", 4096, "float32", "cpu"))
    ref = ref_dec.decide(SCHEMA, CONTEXT)
    # the Hugging Face tokenizer (via mlx_lm.load) gives the GGUF tokenizer's ids
    text = 'hello world, hello!\n  "topic": "hello world",'
    assert dec.loaded.tokenizer.encode(text) == tok.encode(text)
    assert dec.engine.plan(SCHEMA).head_ids == ref_dec.engine.plan(SCHEMA).head_ids
    for n, p in _probs(ref).items():
        np.testing.assert_allclose(_probs(got)[n], p, atol=1e-4)
