"""Load a GGUF file as an mlx-lm model and a `tokenizers` tokenizer.

mlx-lm has no GGUF loader. This module reads the header itself, takes the tensors that
`mx.load` decodes correctly, dequantizes the rest with gguf-py, and maps llama.cpp's
names and layouts back to the Hugging Face ones that mlx-lm expects.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import warnings
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from pcd_tools.errors import ModelLoadError

__all__ = ["GGUFInfo", "GGUFTokenizer", "load_gguf"]

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")

# Types that mx.load decodes, each checked against gguf-py on one row per file (`_verify`).
# Not Q4_K: mlx 0.32 applies one sub-block scale to both nibble halves.
_MX_TYPES = frozenset({"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q2_K", "Q6_K"})
_GROUP = 32  # the group size of the MLX-quantized triples mx.load returns

_SCALAR = dict(zip((0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12), "BbHhIif?Qqd", strict=True))
_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
_SPLIT_PRE = {"llama-bpe": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}
_DIGIT_PRE = ("smollm", "starcoder", "refact")  # single digits, then GPT-2's regex
_GPT2_PRE = ("gpt-2", "default")
_END_TOKENS = "<|im_end|> <|endoftext|> <|eot_id|> <|end_of_text|> <|eom_id|> <|end|> </s>"


@dataclass(frozen=True)
class GGUFInfo:
    """What a GGUF file declares about itself.

    Args:
        path: The file that was loaded.
        architecture: `general.architecture`, e.g. "llama".
        name: `general.name`, or the file name when absent.
        context_length: The model's context window in tokens.
        vocab_size: Rows of the token embedding.
        file_type: The llama.cpp file type, e.g. "Q4_1" or "Q4_K_M".
        tensor_types: ggml type name -> number of tensors of that type.
    """

    path: str
    architecture: str
    name: str
    context_length: int
    vocab_size: int
    file_type: str
    tensor_types: dict[str, int]


@dataclass(frozen=True)
class _Tensor:
    type: str
    shape: tuple[int, ...]  # numpy order; GGUF lists dims fastest-first
    offset: int  # absolute, in bytes


def _read_header(path: str) -> tuple[dict[str, Any], dict[str, _Tensor]]:
    """Parse metadata and tensor infos (20x faster than GGUFReader on a 49k vocab)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise ValueError(f"it starts with {bytes(buf[:4])!r}, not b'GGUF'")
        pos = 4

        def take(fmt: str) -> Any:
            nonlocal pos
            pos += struct.calcsize(fmt)
            return struct.unpack_from("<" + fmt, buf, pos - struct.calcsize(fmt))[0]

        def value(vtype: int) -> Any:
            nonlocal pos
            if vtype == 8:
                n = take("Q")
                pos += n
                if pos > len(buf):
                    raise ValueError("the header is truncated")
                return buf[pos - n : pos].decode("utf-8", errors="replace")
            if vtype != 9:
                return take(_SCALAR[vtype])
            etype, n = take("I"), take("Q")
            if etype not in _SCALAR:
                return [value(etype) for _ in range(n)]
            pos += n * struct.calcsize(_SCALAR[etype])
            return np.frombuffer(
                buf, "<" + _SCALAR[etype], n, pos - n * struct.calcsize(_SCALAR[etype])
            ).tolist()

        if (version := take("I")) not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported; 2 or 3 is needed")
        n_tensors, n_kv = take("Q"), take("Q")
        meta = {value(8): value(take("I")) for _ in range(n_kv)}
        infos = []
        for _ in range(n_tensors):
            name, n_dims = value(8), take("I")
            dims = tuple(take("Q") for _ in range(n_dims))
            infos.append((name, dims[::-1], take("I"), take("Q")))
    from gguf import GGMLQuantizationType

    align = int(meta.get("general.alignment", 32))
    start = -(-pos // align) * align
    return meta, {n: _Tensor(GGMLQuantizationType(t).name, s, start + o) for n, s, t, o in infos}


def _dequantize(path: str, t: _Tensor, rows: int | None = None) -> np.ndarray:
    """Dequantize a tensor (or its first `rows` rows, flattened) with gguf-py."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

    qtype = GGMLQuantizationType[t.type]
    block, nbytes = GGML_QUANT_SIZES[qtype]
    shape = (rows or int(np.prod(t.shape[:-1])), t.shape[-1] // block * nbytes)
    out = quants.dequantize(np.asarray(np.memmap(path, np.uint8, "r", t.offset, shape)), qtype)
    return out.reshape(-1) if rows else out.reshape(t.shape)


def _mx_dequantize(w: mx.array, scales: mx.array, biases: mx.array) -> mx.array:
    """Dequantize an MLX affine triple to float32 (5x faster than mx.dequantize on CPU)."""
    bits = w.shape[-1] // scales.shape[-1]
    shifts = mx.arange(0, 32, bits, dtype=mx.uint32)
    q = ((w[..., None] >> shifts) & ((1 << bits) - 1)).reshape(*scales.shape, _GROUP)
    deq = q.astype(mx.float32) * scales[..., None].astype(mx.float32) + biases[..., None]
    return deq.reshape(w.shape[0], -1)


def _verify(path: str, native: dict[str, mx.array], tensors: dict[str, _Tensor]) -> set[str]:
    """Return the types whose `mx.load` decoding matches gguf-py on a tensor's first row."""
    checked = {"F32": True, "F16": True}
    for name, t in tensors.items():
        if t.type in checked or t.type not in _MX_TYPES or name not in native:
            continue
        base, w = name.removesuffix(".weight"), native[name]
        if f"{base}.scales" in native:
            w = _mx_dequantize(w[:1], native[f"{base}.scales"][:1], native[f"{base}.biases"][:1])
        got = np.array(w.reshape(-1, w.shape[-1])[0].astype(mx.float32))
        ref = _dequantize(path, t, rows=1)
        tol = 4e-3 * np.abs(ref).max()
        checked[t.type] = got.shape == ref.shape and np.allclose(got, ref, 4e-3, tol)
        if not checked[t.type]:
            warnings.warn(f"mx.load decodes {t.type} wrongly; using gguf-py", stacklevel=3)
    return {k for k, ok in checked.items() if ok}


def _hf_name(gguf_name: str) -> str:
    base, _, suffix = gguf_name.rpartition(".")
    parts = base.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}"
    return f"{_NAMES.get(base, base)}.{suffix}"


def _unpermute(w: mx.array, n_head: int) -> mx.array:
    """Invert llama.cpp's `permute` of Q/K rows (interleaved RoPE -> HF's half split)."""
    rest = w.shape[1:]
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def _load_weights(
    path: str, tensors: dict[str, _Tensor], dtype: mx.Dtype | None, heads: tuple[int, int] | None
) -> tuple[dict[str, mx.array], dict[str, dict]]:
    """Return mlx-lm-named weights and the `to_quantized` arguments of quantized modules."""
    native: dict[str, mx.array]
    try:
        native = mx.load(path)  # type: ignore[assignment]
    except Exception:  # it rejects a whole file that holds Q5_x, Q3_K, IQ*, ...
        native = {}
    trusted = _verify(path, native, tensors)
    weights: dict[str, mx.array] = {}
    quantized: dict[str, dict] = {}
    for name, t in tensors.items():
        base, hf = name.removesuffix(".weight"), _hf_name(name)
        if t.type not in trusted or name not in native:  # e.g. mx.load drops TQ1_0 silently
            keep = {"F32": mx.float32, "BF16": mx.bfloat16}.get(t.type, mx.float16)
            weights[hf] = mx.array(_dequantize(path, t)).astype(dtype or keep)
        elif f"{base}.scales" not in native:
            weights[hf] = native[name].astype(dtype or native[name].dtype)
        elif dtype is None:  # keep the MLX-quantized triple
            module = hf.removesuffix(".weight")
            for part in ("weight", "scales", "biases"):
                weights[f"{module}.{part}"] = native[f"{base}.{part}"]
            bits = native[name].shape[-1] // native[f"{base}.scales"].shape[-1]
            quantized[module] = {"group_size": _GROUP, "bits": bits}
        else:
            triple = [native[f"{base}.{p}"] for p in ("weight", "scales", "biases")]
            weights[hf] = _mx_dequantize(*triple).astype(dtype)
    for key in list(weights):  # llama: undo the converter's Q/K permutation
        proj = key.rsplit(".", 2)[-2]
        if heads and proj in ("q_proj", "k_proj"):  # rows are output channels: triples too
            weights[key] = _unpermute(weights[key], heads[proj == "k_proj"])
    return weights, quantized


class _FreqsRoPE(nn.Module):
    """RoPE with llama.cpp's per-dimension `rope_freqs` factors (Llama 3.1 scaling)."""

    def __init__(self, dims: int, base: float, factors: mx.array):
        super().__init__()
        self.dims = dims
        self._freqs = base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims) * factors

    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        return mx.fast.rope(
            x, self.dims, traditional=False, base=None, scale=1.0, offset=offset, freqs=self._freqs
        )


def _model_args(meta: dict[str, Any], arch: str, tensors: dict[str, _Tensor]) -> dict[str, Any]:
    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    needed = ("embedding_length", "block_count", "feed_forward_length", "attention.head_count")
    if missing := [f"{arch}.{k}" for k in needed if get(k) is None]:
        raise KeyError(f"missing metadata {missing}")
    hidden, heads = get("embedding_length"), get("attention.head_count")
    args = {
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": get("block_count"),
        "intermediate_size": get("feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads),
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-6),
        "vocab_size": tensors["token_embd.weight"].shape[0],
        "head_dim": get("attention.key_length", hidden // heads),
        "max_position_embeddings": get("context_length", 4096),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "mlp_bias": "blk.0.ffn_up.bias" in tensors,
    }
    if get("rope.freq_base") is not None:
        args["rope_theta"] = get("rope.freq_base")
    kind, factor = get("rope.scaling.type", "none"), get("rope.scaling.factor", 1.0)
    if kind == "linear" or get("rope.scale_linear"):
        args["rope_scaling"] = {"type": "linear", "factor": get("rope.scale_linear", factor)}
    elif kind == "yarn":
        orig = get("rope.scaling.original_context_length", args["max_position_embeddings"])
        args["rope_scaling"] = {"type": "yarn", "factor": factor}
        args["rope_scaling"]["original_max_position_embeddings"] = orig
    return args


def load_gguf(
    path: str | os.PathLike, *, dtype: mx.Dtype | None = None
) -> tuple[nn.Module, GGUFTokenizer, GGUFInfo]:
    """Load a llama or qwen2 GGUF file as an mlx-lm model, its tokenizer and its info.

    Args:
        path: The `.gguf` file.
        dtype: `mx.float32` dequantizes every weight to dense float32 (the CPU path).
            `None` keeps what the file holds: Q4_0, Q4_1 and Q8_0 stay MLX-quantized and
            other quantized types become float16. Another float dtype casts every weight.

    Returns:
        The model (`mlx_lm.models.llama.Model` or `qwen2.Model`, in eval mode, weights
        evaluated), a `GGUFTokenizer` and a `GGUFInfo`.

    Raises:
        ModelLoadError: The file is missing, is not a readable GGUF file, or holds an
            architecture or tokenizer that pcd-tools cannot load.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ModelLoadError(
            f"GGUF file not found: {path!r}. Check the path, or pass a Hugging Face repo id "
            "or an MLX model directory instead.",
            source=path,
        )
    try:
        meta, tensors = _read_header(path)
        arch = meta["general.architecture"]
        if arch in SUPPORTED_ARCHITECTURES:
            arg_dict = _model_args(meta, arch, tensors)
    except (ValueError, struct.error, OSError, KeyError) as e:
        raise ModelLoadError(
            f"{path!r} is not a readable GGUF model file ({e}). Re-download it, or convert "
            "the model with a current llama.cpp convert_hf_to_gguf.py.",
            source=path,
        ) from e
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"{path!r} holds a {arch!r} model, but pcd-tools loads only GGUF architectures "
            f"{' and '.join(map(repr, SUPPORTED_ARCHITECTURES))}. Use a GGUF of a Llama, "
            "SmolLM or Qwen2/2.5 model, or an MLX or Hugging Face model.",
            source=path,
        )
    tokenizer = GGUFTokenizer(meta, source=path)
    from gguf import LlamaFileType
    from mlx_lm.models import llama, qwen2

    module = llama if arch == "llama" else qwen2
    args = module.ModelArgs.from_dict(arg_dict)
    heads = (args.num_attention_heads, args.num_key_value_heads) if arch == "llama" else None
    try:
        weights, quantized = _load_weights(path, tensors, dtype, heads)
    except (ValueError, OSError) as e:
        raise ModelLoadError(
            f"The tensors of {path!r} cannot be read ({e}); the file may be truncated. "
            "Re-download it.",
            source=path,
        ) from e
    model = module.Model(args)
    if (factors := weights.pop("rope_freqs.weight", None)) is not None:
        for layer in model.layers:
            rope = _FreqsRoPE(arg_dict["head_dim"], args.rope_theta, factors.astype(mx.float32))
            layer.self_attn.rope = rope
    nn.quantize(model, class_predicate=lambda p, _: quantized.get(p, False))
    try:
        model.load_weights(list(model.sanitize(weights).items()), strict=True)
    except ValueError as e:
        raise ModelLoadError(
            f"{path!r} does not fit an mlx-lm {arch} model: {e}", source=path
        ) from e
    model.eval()
    mx.eval(model.parameters())
    matrices = Counter(t.type for t in tensors.values() if len(t.shape) == 2)
    try:
        file_type = LlamaFileType(int(meta.get("general.file_type", -1))).name
    except ValueError:  # absent or unknown: name the commonest matrix type
        file_type = max(matrices, key=matrices.__getitem__, default="unknown")
    info = GGUFInfo(
        path=path,
        architecture=arch,
        name=meta.get("general.name") or os.path.basename(path),
        context_length=int(args.max_position_embeddings),
        vocab_size=args.vocab_size,
        file_type=file_type.removeprefix("MOSTLY_").removeprefix("ALL_"),
        tensor_types=dict(Counter(t.type for t in tensors.values())),
    )
    return model, tokenizer, info


def _bpe(meta: dict[str, Any], pre: str) -> tuple[Any, Any, Any]:
    """Model, pre-tokenizer and decoder of a byte-level BPE (`"gpt2"`) vocabulary."""
    from tokenizers import Regex, decoders, models
    from tokenizers import pre_tokenizers as pt

    vocab = {tok: i for i, tok in enumerate(meta["tokenizer.ggml.tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    model = models.BPE(vocab, merges, ignore_merges=pre in ("llama-bpe", "smaug-bpe"))
    byte_level: Any = pt.ByteLevel(add_prefix_space=False, use_regex=pre not in _SPLIT_PRE)
    if pre in _DIGIT_PRE:
        pre_tok = pt.Sequence([pt.Digits(individual_digits=True), byte_level])
    elif pre in _SPLIT_PRE:
        pre_tok = pt.Sequence([pt.Split(Regex(_SPLIT_PRE[pre]), "isolated"), byte_level])
    else:
        pre_tok = byte_level
    return model, pre_tok, decoders.ByteLevel()


def _sentencepiece(meta: dict[str, Any]) -> tuple[Any, Any, Any]:
    """Model, pre-tokenizer and decoder of a SentencePiece BPE (`"llama"`) vocabulary."""
    from tokenizers import decoders, models, pre_tokenizers

    tokens = meta["tokenizer.ggml.tokens"]
    scores = meta.get("tokenizer.ggml.scores") or [-float(i) for i in range(len(tokens))]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    # SentencePiece stores no merges: each split of a piece into two pieces is one,
    # ranked by the merged piece's score.
    splits = [
        (-scores[i], tok[:k], tok[k:]) for tok, i in vocab.items() for k in range(1, len(tok))
    ]
    merges = [(a, b) for _, a, b in sorted(s for s in splits if s[1] in vocab and s[2] in vocab)]
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk] if unk is not None else None
    model = models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True)
    prefix = meta.get("tokenizer.ggml.add_space_prefix", True)
    pre_tok = pre_tokenizers.Metaspace(prepend_scheme="first" if prefix else "never", split=False)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    return model, pre_tok, decoders.Sequence(steps + [decoders.Strip(" ", 1, 0)] * prefix)


class GGUFTokenizer:
    """A `tokenizers` tokenizer rebuilt from GGUF metadata, with the model's chat template.

    Args:
        meta: The GGUF metadata (`tokenizer.ggml.*` and `tokenizer.chat_template`).
        source: The file it came from, for messages.

    Attributes:
        backend: The underlying `tokenizers.Tokenizer`.
        bos_token_id: The BOS id, if the file declares one.
        eos_token_id: The EOS id, if the file declares one.
        eos_token_ids: Ids that end a turn: EOS/EOT ids and tokens like `<|im_end|>`.
        add_bos: Whether the model expects BOS first. `encode` never adds it.
        chat_template: The Jinja chat template, if any.
        pre: The pre-tokenizer reproduced (`tokenizer.ggml.pre`, "default" if unknown).

    Raises:
        ModelLoadError: The vocabulary type is neither "gpt2" nor "llama".
    """

    def __init__(self, meta: dict[str, Any], *, source: str | None = None):
        from tokenizers import AddedToken, Tokenizer

        kind, self.pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre", "default")
        if kind == "gpt2":
            if self.pre not in (*_DIGIT_PRE, *_SPLIT_PRE, *_GPT2_PRE):
                warnings.warn(
                    f"{source}: unknown tokenizer.ggml.pre {self.pre!r}; using GPT-2's regex, "
                    "so some text may tokenize differently than in llama.cpp.",
                    stacklevel=2,
                )
                self.pre = "default"
            model, pre_tok, decoder = _bpe(meta, self.pre)
        elif kind == "llama":
            model, pre_tok, decoder = _sentencepiece(meta)
        else:
            raise ModelLoadError(
                f"{source!r} has a {kind!r} tokenizer; pcd-tools rebuilds only 'gpt2' "
                "(byte-level BPE) and 'llama' (SentencePiece) tokenizers from GGUF.",
                source=source,
            )
        self.backend = Tokenizer(model)
        self.backend.pre_tokenizer, self.backend.decoder = pre_tok, decoder
        tokens = meta["tokenizer.ggml.tokens"]
        types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        # CONTROL (3) and USER_DEFINED (4) tokens: matched whole before BPE, kept by decode.
        added = [
            AddedToken(t, special=True, normalized=False)
            for t, ty in zip(tokens, types, strict=False)
            if ty in (3, 4)
        ]
        self.backend.add_special_tokens(added)
        self.bos_token_id: int | None = meta.get("tokenizer.ggml.bos_token_id")
        self.eos_token_id: int | None = meta.get("tokenizer.ggml.eos_token_id")
        ids = {meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")}
        ids |= {self.backend.token_to_id(t) for t in _END_TOKENS.split()}
        self.eos_token_ids: set[int] = {i for i in ids if i is not None}
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama"))
        self.chat_template: str | None = meta.get("tokenizer.chat_template")
        self._template: Any = None

    @property
    def vocab_size(self) -> int:
        """Number of tokens in the vocabulary, special tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token text maps to its one id. No BOS is added."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, special tokens included."""
        return self.backend.decode(list(ids), skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        """Id of a vocabulary entry such as "Ġhello", or None."""
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str:
        """Vocabulary entry of an id, as the GGUF file spells it.

        Raises:
            IndexError: The id is outside the vocabulary.
        """
        if (token := self.backend.id_to_token(token_id)) is None:
            raise IndexError(f"Token id {token_id} is outside the vocabulary of {self.vocab_size}")
        return token

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Render `messages` with the model's chat template in a sandboxed Jinja env.

        Args:
            messages: Chat messages, each with "role" and "content".
            add_generation_prompt: Whether to open the assistant turn at the end.
            **kwargs: Extra template variables, e.g. `tools`.

        Raises:
            ModelLoadError: The GGUF file has no chat template.
        """
        if self.chat_template is None:
            raise ModelLoadError(
                "This GGUF file has no tokenizer.chat_template; use the GGUF of an instruct "
                "model, which ships one."
            )
        if self._template is None:
            from jinja2.exceptions import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message: str) -> None:
                raise TemplateError(message)

            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
            )
            env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(
                x, ensure_ascii=False, indent=indent
            )
            env.globals["raise_exception"] = raise_exception
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._template = env.from_string(self.chat_template)
        bos, eos = (
            "" if i is None else self.id_to_token(i) for i in (self.bos_token_id, self.eos_token_id)
        )
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos,
            eos_token=eos,
            **kwargs,
        )
