"""GGUF families beyond llama / qwen2: qwen3, gemma3 and phi3, each as a tiny random-weight
file written the way llama.cpp's converter writes it, checked against mlx-lm's own model
class loaded with the same weights, then decided through the `Decider`."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
gguf = pytest.importorskip("gguf")

from gguf import MODEL_ARCH  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402
from mlx_lm.models import gemma3_text, phi3, qwen3  # noqa: E402
from tokenizers.pre_tokenizers import ByteLevel  # noqa: E402

from pcd_tools.engine.load.gguf import GGUFTokenizer, load_gguf  # noqa: E402
from pcd_tools.errors import ModelLoadError  # noqa: E402
from tests.oracle import oracle_log_scores, softmax  # noqa: E402
from tests.schemas import Ticket  # noqa: E402

pytestmark = pytest.mark.engine

HIDDEN, HEADS, KV_HEADS, FFN = 64, 4, 2, 128
SEQS = [
    [5, 17, 42, 100, 7, 3, 250, 1, 60, 61, 62, 200],
    [9, 9, 9, 120, 33, 18, 77, 240, 6, 150, 151, 152, 153, 40, 41],
    [11, 12],
]
CONTEXT = "Checkout fails for every EU customer since 9:00; we lose orders. Ünïcødé ✓"

# --- tokenizers --------------------------------------------------------------------------------

_MERGES = ["Ġ h", "e l", "el l", "Ġh ell", "Ġhell o", "o r", "Ġ w", "Ġw or", "l d", "Ġwor ld"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)  # Qwen3's template, reduced to its turns and its thinking switch
PHI3 = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\n' + m['content'] + '<|end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
GEMMA3 = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}"
    "{%- set prefix = messages[0]['content'] + '\n\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for m in turns -%}{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}{%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (prefix if loop.first else '') }}"
    "{{ m['content'] | trim }}{{ '<end_of_turn>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)  # Gemma 3's template for text turns: the system turn folds into the first user turn


def bpe_vocab(specials: list[str]) -> dict:
    tokens = specials + sorted(ByteLevel.alphabet()) + [m.replace(" ", "") for m in _MERGES]
    return {
        "model": "gpt2",
        "tokens": tokens,
        "types": [3] * len(specials) + [1] * (len(tokens) - len(specials)),
        "merges": _MERGES,
    }


def sentencepiece_vocab() -> dict:
    pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "he", "ll", "hell", "hello", "▁w", "or", "▁wor", "ld", "▁world"]  # fmt: skip
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)] + pieces
    return {
        "model": "llama",
        "tokens": tokens,
        "types": [3, 3, 3, 2, 3, 3] + [6] * 256 + [1] * len(pieces),
        "scores": [0.0] * (len(specials) + 256) + [-float(i) for i in range(len(pieces))],
    }


QWEN3_VOCAB = bpe_vocab(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"])
PHI3_VOCAB = bpe_vocab(["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"])
GEMMA3_VOCAB = sentencepiece_vocab()


# --- weights in mlx-lm (Hugging Face) layout, and the file the converter writes -------------------


def hf_weights(arch: str, layers: int, vocab: int, head_dim: int, *, tied: bool, seed: int):
    """Random weights named as mlx-lm's model class names them. Large Q/K make attention
    peaked, so a wrong head layout or position changes the logits a lot."""
    rng = np.random.default_rng(seed)

    def w(*shape: int, std: float = 0.1) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    # Gemma's norms compute x * (1 + w): its stored weights sit around 0, the others' around 1.
    def norm(n: int) -> np.ndarray:
        return w(n, std=0.3) + (0.0 if arch == "gemma3" else 1.0)

    q, kv = HEADS * head_dim, KV_HEADS * head_dim
    out = {
        "model.embed_tokens.weight": w(vocab, HIDDEN, std=1.0),
        "model.norm.weight": norm(HIDDEN),
    }
    if not tied:
        out["lm_head.weight"] = w(vocab, HIDDEN)
    for i in range(layers):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.o_proj.weight": w(HIDDEN, q),
            p + "mlp.down_proj.weight": w(HIDDEN, FFN),
            p + "input_layernorm.weight": norm(HIDDEN),
            p + "post_attention_layernorm.weight": norm(HIDDEN),
        }
        if arch == "phi3":
            out[p + "self_attn.qkv_proj.weight"] = np.concatenate(
                [w(q, HIDDEN, std=0.4), w(kv, HIDDEN, std=0.4), w(kv, HIDDEN)]
            )
            out[p + "mlp.gate_up_proj.weight"] = w(2 * FFN, HIDDEN)
            continue
        out |= {
            p + "self_attn.q_proj.weight": w(q, HIDDEN, std=0.4),
            p + "self_attn.k_proj.weight": w(kv, HIDDEN, std=0.4),
            p + "self_attn.v_proj.weight": w(kv, HIDDEN),
            p + "mlp.gate_proj.weight": w(FFN, HIDDEN),
            p + "mlp.up_proj.weight": w(FFN, HIDDEN),
            p + "self_attn.q_norm.weight": norm(head_dim),
            p + "self_attn.k_norm.weight": norm(head_dim),
        }
        if arch == "gemma3":
            out[p + "pre_feedforward_layernorm.weight"] = norm(HIDDEN)
            out[p + "post_feedforward_layernorm.weight"] = norm(HIDDEN)
    return out


def to_gguf_tensors(arch: str, weights: dict[str, np.ndarray], layers: int) -> dict:
    """What convert_hf_to_gguf.py writes: names from gguf-py's own tensor map; Gemma3's
    norms as 1 + w (`Gemma3Model.norm_shift`); no Q/K permutation for these families."""
    names = gguf.get_tensor_name_map(getattr(MODEL_ARCH, arch.upper()), layers)
    out = {}
    for hf, arr in weights.items():
        base, _, suffix = hf.rpartition(".")
        name = names.get_name(base)
        assert name is not None, hf
        if arch == "gemma3" and hf.endswith("norm.weight"):
            arr = arr + np.float32(1.0)
        out[f"{name}.{suffix}"] = arr
    return out


def write_file(path, arch: str, tensors: dict, meta: dict, vocab: dict, template: str | None):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for key, value in meta.items():
        getattr(w, f"add_{key}")(value)
    w.add_tokenizer_model(vocab["model"])
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["types"])
    if vocab["model"] == "gpt2":
        w.add_tokenizer_pre("qwen2")
        w.add_token_merges(vocab["merges"])
        w.add_add_bos_token(False)
        w.add_eos_token_id(0)
    else:
        w.add_token_scores(vocab["scores"])
        w.add_add_space_prefix(False)  # Gemma3Model.set_vocab
        w.add_add_bos_token(True)
        w.add_bos_token_id(2)
        w.add_eos_token_id(1)
        w.add_unk_token_id(3)
    if template is not None:
        w.add_chat_template(template)
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def common_meta(layers: int, head_dim: int, base: float) -> dict:
    return {
        "context_length": 4096, "embedding_length": HIDDEN, "block_count": layers,
        "feed_forward_length": FFN, "head_count": HEADS, "head_count_kv": KV_HEADS,
        "layer_norm_rms_eps": 1e-6, "rope_freq_base": base, "key_length": head_dim,
        "value_length": head_dim,
    }  # fmt: skip


def reference(module, args, weights: dict[str, np.ndarray]):
    model = module.Model(module.ModelArgs(**args))
    if hasattr(model, "sanitize"):
        weights = model.sanitize(dict(weights))
    model.load_weights([(k, mx.array(v)) for k, v in weights.items()], strict=True)
    model.eval()
    return model


def logits(model, seq: list[int]) -> mx.array:
    out = model(mx.array([seq]))
    mx.eval(out)
    return out


def assert_same_logits(got, want, atol: float = 1e-4) -> float:
    worst = max(float(mx.abs(logits(got, s) - logits(want, s)).max().item()) for s in SEQS)
    assert worst <= atol, worst
    return worst


def max_diff(a, b) -> float:
    return max(float(mx.abs(logits(a, s) - logits(b, s)).max().item()) for s in SEQS)


# --- the families -----------------------------------------------------------------------------


def qwen3_case(tmp_path, *, tied: bool = False, seed: int = 0):
    # Qwen3's heads are wider than hidden / heads (0.6B: 16 x 128 over 1024).
    layers, head_dim, vocab = 2, 32, len(QWEN3_VOCAB["tokens"])
    weights = hf_weights("qwen3", layers, vocab, head_dim, tied=tied, seed=seed)
    path = write_file(
        tmp_path / "qwen3.gguf", "qwen3", to_gguf_tensors("qwen3", weights, layers),
        common_meta(layers, head_dim, 1_000_000.0), QWEN3_VOCAB, CHATML,
    )  # fmt: skip
    args = dict(
        model_type="qwen3", hidden_size=HIDDEN, num_hidden_layers=layers, intermediate_size=FFN,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=head_dim,
        rms_norm_eps=1e-6, vocab_size=vocab, rope_theta=1_000_000.0,
        max_position_embeddings=4096, tie_word_embeddings=tied,
    )  # fmt: skip
    return path, reference(qwen3, args, weights), weights, args


GEMMA_WINDOW = 4


def gemma3_case(tmp_path, *, seed: int = 0):
    # Six layers: llama.cpp's pattern makes layers 0-4 local (window 4, RoPE base 10000,
    # unscaled) and layer 5 global (base 1e6, linear scaling 8, as Gemma 3 4B+ ships).
    layers, head_dim, vocab = 6, 16, len(GEMMA3_VOCAB["tokens"])
    weights = hf_weights("gemma3", layers, vocab, head_dim, tied=True, seed=seed)
    meta = common_meta(layers, head_dim, 1_000_000.0) | {
        "sliding_window": GEMMA_WINDOW,
        "rope_scaling_type": gguf.RopeScalingType.LINEAR,
        "rope_scaling_factor": 8.0,
    }
    path = write_file(
        tmp_path / "gemma3.gguf", "gemma3", to_gguf_tensors("gemma3", weights, layers), meta,
        GEMMA3_VOCAB, GEMMA3,
    )  # fmt: skip
    args = dict(
        model_type="gemma3_text", hidden_size=HIDDEN, num_hidden_layers=layers,
        intermediate_size=FFN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        head_dim=head_dim, rms_norm_eps=1e-6, vocab_size=vocab, rope_theta=1_000_000.0,
        rope_local_base_freq=10000.0, query_pre_attn_scalar=head_dim,
        sliding_window=GEMMA_WINDOW, sliding_window_pattern=6, max_position_embeddings=4096,
        rope_scaling={"type": "linear", "factor": 8.0},
    )  # fmt: skip
    return path, reference(gemma3_text, args, weights), weights, args


def phi3_case(tmp_path, *, longrope: bool = False, seed: int = 0):
    # Partial RoPE as in Phi-4-mini (0.75 of each head); LongRoPE factors as tensors.
    layers, head_dim, vocab, rope_dims = 2, 16, len(PHI3_VOCAB["tokens"]), 12
    weights = hf_weights("phi3", layers, vocab, head_dim, tied=False, seed=seed)
    tensors = to_gguf_tensors("phi3", weights, layers)
    meta = common_meta(layers, head_dim, 10000.0) | {
        "rope_dimension_count": rope_dims,
        "rope_scaling_orig_ctx_len": 1024,
        "sliding_window": 0,
    }
    scaling = None
    if longrope:
        rng = np.random.default_rng(seed + 100)
        long_f = (1 + 3 * rng.random(rope_dims // 2)).astype(np.float32)
        short_f = (1 + rng.random(rope_dims // 2)).astype(np.float32)
        tensors |= {"rope_factors_long.weight": long_f, "rope_factors_short.weight": short_f}
        scaling = {
            "type": "longrope",
            "long_factor": long_f.tolist(),
            "short_factor": short_f.tolist(),
        }
    path = write_file(tmp_path / "phi3.gguf", "phi3", tensors, meta, PHI3_VOCAB, PHI3)
    args = dict(
        model_type="phi3", hidden_size=HIDDEN, num_hidden_layers=layers, intermediate_size=FFN,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, rms_norm_eps=1e-6,
        vocab_size=vocab, rope_theta=10000.0, partial_rotary_factor=rope_dims / head_dim,
        max_position_embeddings=4096, original_max_position_embeddings=1024,
        rope_scaling=scaling,
    )  # fmt: skip
    return path, reference(phi3, args, weights), weights, args


# --- logits against mlx-lm ----------------------------------------------------------------------


@pytest.mark.parametrize("tied", [False, True])
def test_qwen3_equals_mlx_lm_model(tmp_path, tied):
    path, want, weights, args = qwen3_case(tmp_path, tied=tied)
    model, tok, info = load_gguf(path, dtype=mx.float32)

    assert isinstance(model, qwen3.Model)
    assert (model.args.head_dim, model.args.tie_word_embeddings) == (32, tied)
    assert (info.architecture, tok.pre) == ("qwen3", "qwen2")
    assert_same_logits(model, want)
    # the q/k norms matter: unit norms in their place change the logits
    flat = {k: (np.ones_like(v) if "_norm." in k else v) for k, v in weights.items()}
    assert max_diff(model, reference(qwen3, args, flat)) > 1e-2


def test_gemma3_equals_mlx_lm_model(tmp_path):
    path, want, weights, args = gemma3_case(tmp_path)
    model, _, info = load_gguf(path, dtype=mx.float32)

    assert isinstance(model, gemma3_text.Model)
    a = model.args
    assert (a.sliding_window, a.sliding_window_pattern, a.rope_local_base_freq) == (4, 6, 1e4)
    assert (a.rope_theta, a.query_pre_attn_scalar, a.rope_scaling) == (
        1e6, 16, {"type": "linear", "factor": 8.0},
    )  # fmt: skip
    assert "lm_head" not in model  # tied: the embedding is the head
    assert (info.architecture, info.vocab_size) == ("gemma3", len(GEMMA3_VOCAB["tokens"]))
    # the norms hold w (mlx-lm adds the 1), not the file's 1 + w
    norm = np.array(model.model.layers[0].pre_feedforward_layernorm.weight)
    np.testing.assert_allclose(
        norm, weights["model.layers.0.pre_feedforward_layernorm.weight"], atol=1e-6
    )
    assert_same_logits(model, want)
    # Each Gemma part is visible in the logits, so getting one wrong fails this test:
    # the file's 1 + w loaded as is, no sliding window, the window's RoPE base on all layers.
    stored = {k: (v + 1 if k.endswith("norm.weight") else v) for k, v in weights.items()}
    assert max_diff(model, reference(gemma3_text, args, stored)) > 1e-2
    assert (
        max_diff(model, reference(gemma3_text, args | {"sliding_window_pattern": 1}, weights))
        > 1e-2
    )
    assert max_diff(model, reference(gemma3_text, args | {"rope_theta": 1e4}, weights)) > 1e-2


def test_gemma3_without_a_window_is_all_global(tmp_path):
    # llama.cpp: a gemma3 file without attention.sliding_window has no local layers.
    layers, head_dim, vocab = 6, 16, len(GEMMA3_VOCAB["tokens"])
    weights = hf_weights("gemma3", layers, vocab, head_dim, tied=True, seed=3)
    path = write_file(
        tmp_path / "g.gguf", "gemma3", to_gguf_tensors("gemma3", weights, layers),
        common_meta(layers, head_dim, 1_000_000.0), GEMMA3_VOCAB, None,
    )  # fmt: skip
    model, _, _ = load_gguf(path, dtype=mx.float32)
    assert model.args.sliding_window_pattern == 1
    assert all(not layer.self_attn.is_sliding for layer in model.layers)
    args = dict(
        model_type="gemma3_text", hidden_size=HIDDEN, num_hidden_layers=layers,
        intermediate_size=FFN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        head_dim=head_dim, rms_norm_eps=1e-6, vocab_size=vocab, rope_theta=1_000_000.0,
        query_pre_attn_scalar=head_dim, sliding_window_pattern=1,
        max_position_embeddings=4096,
    )  # fmt: skip
    assert_same_logits(model, reference(gemma3_text, args, weights))


@pytest.mark.parametrize("longrope", [False, True])
def test_phi3_equals_mlx_lm_model(tmp_path, longrope):
    path, want, weights, args = phi3_case(tmp_path, longrope=longrope)
    model, _, info = load_gguf(path, dtype=mx.float32)

    assert isinstance(model, phi3.Model)
    assert model.args.partial_rotary_factor == 0.75
    rope = model.model.layers[0].self_attn.rope  # nn.RoPE, or SuScaledRoPE for LongRoPE
    assert getattr(rope, "dim", getattr(rope, "dims", None)) == 12
    assert info.architecture == "phi3"
    assert_same_logits(model, want)
    if longrope:
        assert model.args.rope_scaling["long_factor"] == args["rope_scaling"]["long_factor"]
        assert max_diff(model, reference(phi3, args | {"rope_scaling": None}, weights)) > 1e-2


def test_mistral_gguf_is_a_llama_file_with_its_own_head_width(tmp_path):
    # convert_hf_to_gguf.py writes Mistral (MistralForCausalLM) as `llama`, Q/K permuted;
    # Mistral Nemo's heads (128) are narrower than hidden / heads (160): key_length says so.
    from mlx_lm.models import llama

    from tests.engine.test_gguf import permute

    layers, head_dim, vocab = 2, 8, len(PHI3_VOCAB["tokens"])
    weights = hf_weights("qwen3", layers, vocab, head_dim, tied=False, seed=4)
    weights = {k: v for k, v in weights.items() if "_norm." not in k}  # llama: no q/k norms
    tensors = to_gguf_tensors("llama", weights, layers)
    for i in range(layers):
        for name, n in (("attn_q", HEADS), ("attn_k", KV_HEADS)):
            tensors[f"blk.{i}.{name}.weight"] = permute(tensors[f"blk.{i}.{name}.weight"], n)
    path = write_file(
        tmp_path / "mistral.gguf", "llama", tensors, common_meta(layers, head_dim, 1e6),
        PHI3_VOCAB, None,
    )  # fmt: skip
    model, _, info = load_gguf(path, dtype=mx.float32)
    args = dict(
        model_type="llama", hidden_size=HIDDEN, num_hidden_layers=layers, intermediate_size=FFN,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=head_dim,
        rms_norm_eps=1e-6, vocab_size=vocab, rope_theta=1e6, max_position_embeddings=4096,
        tie_word_embeddings=False,
    )  # fmt: skip
    assert (info.architecture, model.args.head_dim) == ("llama", 8)
    assert_same_logits(model, reference(llama, args, weights))


# --- what the mlx-lm classes cannot compute is refused, by name -------------------------------------


def test_gemma3_logit_softcapping_is_refused(tmp_path):
    layers, head_dim, vocab = 6, 16, len(GEMMA3_VOCAB["tokens"])
    weights = hf_weights("gemma3", layers, vocab, head_dim, tied=True, seed=5)
    meta = common_meta(layers, head_dim, 1e6) | {"final_logit_softcapping": 30.0}
    path = write_file(
        tmp_path / "cap.gguf", "gemma3", to_gguf_tensors("gemma3", weights, layers), meta,
        GEMMA3_VOCAB, None,
    )  # fmt: skip
    with pytest.raises(ModelLoadError, match=r"cap\.gguf.*soft-caps its logits at 30\.0") as e:
        load_gguf(path)
    assert e.value.source == str(path)


def test_partial_rope_outside_phi3_is_refused(tmp_path):
    layers, head_dim, vocab = 2, 32, len(QWEN3_VOCAB["tokens"])
    weights = hf_weights("qwen3", layers, vocab, head_dim, tied=True, seed=6)
    meta = common_meta(layers, head_dim, 1e6) | {"rope_dimension_count": 16}
    path = write_file(
        tmp_path / "p.gguf", "qwen3", to_gguf_tensors("qwen3", weights, layers), meta,
        QWEN3_VOCAB, None,
    )  # fmt: skip
    with pytest.raises(ModelLoadError, match=r"rotates 16 of 32 head dims"):
        load_gguf(path)


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "neox.gguf"), "gptneox")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(
        ModelLoadError,
        match=r"holds a 'gptneox' model.*'gemma3', 'llama', 'phi3', 'qwen2', 'qwen3'\.",
    ):
        load_gguf(tmp_path / "neox.gguf")


# --- tokenizers and chat templates ----------------------------------------------------------


def meta_of(vocab: dict, template: str, **extra) -> dict:
    meta = {
        "tokenizer.ggml.model": vocab["model"], "tokenizer.ggml.tokens": vocab["tokens"],
        "tokenizer.ggml.token_type": vocab["types"], "tokenizer.chat_template": template,
    }  # fmt: skip
    if vocab["model"] == "gpt2":
        meta |= {"tokenizer.ggml.merges": vocab["merges"], "tokenizer.ggml.pre": "qwen2"}
    else:
        meta |= {"tokenizer.ggml.scores": vocab["scores"], "tokenizer.ggml.add_space_prefix": False,
                 "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1,
                 "tokenizer.ggml.add_bos_token": True}  # fmt: skip
    return meta | extra


def test_qwen3_template_answers_without_thinking():
    tok = GGUFTokenizer(meta_of(QWEN3_VOCAB, CHATML))
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    thinking = tok.apply_chat_template([{"role": "user", "content": "Hi"}], enable_thinking=True)
    assert thinking.endswith("<|im_start|>assistant\n")
    ids = tok.encode(text)
    assert tok.token_to_id("<think>") in ids and tok.token_to_id("</think>") in ids


def test_gemma3_tokenizer_and_template():
    tok = GGUFTokenizer(meta_of(GEMMA3_VOCAB, GEMMA3))
    # add_space_prefix is False: no "▁" is put before the first word
    assert [tok.id_to_token(i) for i in tok.encode("hello world")] == ["hello", "▁world"]
    assert tok.decode(tok.encode("hello wé\n")) == "hello wé\n"  # bytes via <0x..> pieces
    end = tok.token_to_id("<end_of_turn>")
    assert tok.add_bos and tok.eos_token_ids == {1, end}
    text = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    assert text == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    ids = tok.encode(text)
    assert ids[:2] == [2, tok.token_to_id("<start_of_turn>")]


# --- the Decider on each family ------------------------------------------------------------------


def decide_and_check(path, modes: list[str]) -> None:
    from pcd_tools import Decider

    # "quantized" keeps the file's matrices encoded; float32 is the dense path ("auto"
    # picks it for files this small)
    for dtype, shown in (("quantized", "gguf-"), ("float32", "float32"), ("auto", "float32")):
        decider = Decider.load(path, dtype=dtype)
        assert decider.loaded.dtype.startswith(shown), (dtype, decider.loaded.dtype)
        check_decider(decider, modes)


def check_decider(decider, modes: list[str]) -> None:
    from pcd_tools.schema import compile_schema

    sch = compile_schema(Ticket)
    plan = decider.engine.plan(sch)
    if decider.loaded.add_bos:  # the template's own BOS is kept once, not doubled
        assert plan.head_ids[0] == decider.loaded.bos_token_id != plan.head_ids[1]
    for mode in modes:
        d = decider.decide(sch, CONTEXT, mode=mode)
        for f in sch.fields:
            z = oracle_log_scores(decider, sch, CONTEXT, f.name)
            np.testing.assert_allclose(d.fields[f.name].log_scores, z, atol=1e-3, rtol=0)
            got = np.array(list(d.fields[f.name].distribution.values()))
            assert np.abs(got - softmax(z)).max() < 1e-4, (mode, f.name)
            assert d.fields[f.name].label == f.choices[int(np.argmax(z))].label


def test_decider_on_qwen3(tmp_path):
    path, *_ = qwen3_case(tmp_path, seed=7)
    decide_and_check(path, ["packed", "batched", "sequential"])


def test_decider_on_gemma3(tmp_path):
    # the prompt is hundreds of tokens against a window of 4: every local layer's mask counts
    path, *_ = gemma3_case(tmp_path, seed=8)
    decide_and_check(path, ["packed", "batched", "sequential"])


def test_decider_on_phi3(tmp_path):
    path, *_ = phi3_case(tmp_path, longrope=True, seed=9)
    decide_and_check(path, ["packed", "batched", "sequential"])


@pytest.mark.parametrize("case", [qwen3_case, gemma3_case, phi3_case])
def test_quantized_matrices_per_family(tmp_path, case):
    # Q8_0 embedding, Q4_0 matrices (phi3's fused qkv and gate_up too): float32 equals the
    # mlx-lm class holding the dequantized values.
    path, _, weights, args = case(tmp_path)
    stored = {}
    reader = gguf.GGUFReader(str(path))
    arch = reader.fields["general.architecture"].contents()
    quantized = tmp_path / "q.gguf"
    w = gguf.GGUFWriter(str(quantized), arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        w.add_key_value(field.name, field.contents(), field.types[0], field.types[-1])
    for t in reader.tensors:
        arr = np.array(t.data)
        qt = (T.Q8_0 if t.name == "token_embd.weight" else T.Q4_0) if arr.ndim == 2 else T.F32
        w.add_tensor(t.name, gguf.quants.quantize(arr, qt), raw_dtype=None if qt == T.F32 else qt)
        stored[t.name] = gguf.quants.dequantize(gguf.quants.quantize(arr, qt), qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    layers = args["num_hidden_layers"]
    names = gguf.get_tensor_name_map(getattr(MODEL_ARCH, arch.upper()), layers)
    want = {}
    for hf, arr in weights.items():
        base, _, suffix = hf.rpartition(".")
        want[hf] = stored[f"{names.get_name(base)}.{suffix}"] if arr.ndim == 2 else arr
    module = {"qwen3": qwen3, "gemma3": gemma3_text, "phi3": phi3}[arch]
    model, _, info = load_gguf(quantized, dtype=mx.float32)
    assert info.tensor_types["Q4_0"] > 0 and info.tensor_types["Q8_0"] == 1
    assert_same_logits(model, reference(module, args, want))
