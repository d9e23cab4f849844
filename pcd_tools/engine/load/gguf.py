"""Load a GGUF file as an mlx-lm model and a `tokenizers` tokenizer.

mlx-lm has no GGUF loader. This module reads the header itself, takes the tensors that
`mx.load` decodes correctly, dequantizes the rest with gguf-py, and maps llama.cpp's
names and layouts back to the Hugging Face ones that mlx-lm expects. The tokenizer is
rebuilt from the metadata by `gguf_tokenizer`.
"""

from __future__ import annotations

import mmap
import os
import struct
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pcd_tools.errors import ModelLoadError

from ..._lazy import mlx_lm_module
from ..host.blas import import_mlx
from .families import FAMILIES, SUPPORTED_ARCHITECTURES, Family, finish_weights, rope_factors
from .tokenizer import GGUFTokenizer

if TYPE_CHECKING:
    import mlx.core as mx
else:
    mx = import_mlx()  # binds the BLAS before mlx.core loads
import mlx.nn as nn  # only after import_mlx() above

__all__ = ["GGUFInfo", "GGUFTokenizer", "load_gguf"]

# Types that mx.load decodes, each checked against gguf-py on one row per file (`_verify`).
# Not Q4_K: mlx 0.32 applies one sub-block scale to both nibble halves.
_MX_TYPES = frozenset({"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q2_K", "Q6_K"})
_GROUP = 32  # the group size of the MLX-quantized triples mx.load returns
# `encoded=None` keeps a file's matrices encoded unless a dense float32 load costs at most
# this many bytes and an eighth of the machine's RAM (`dense_fits`: the copies plus the
# load's scratch of the largest, the embedding table): small models (the embedded 135M:
# 0.6 GB) run 1.1-1.4x faster dense; larger ones would need 5-8x their file in RAM, and a
# small one with a large vocabulary (Gemma 3 270M, 262k tokens: 1.6 GB) peaks above the 1.5B.
AUTO_DENSE_BYTES = 1 << 30

_SCALAR = dict(zip((0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12), "BbHhIif?Qqd", strict=True))
_U64 = struct.Struct("<Q")
_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LLAMA = FAMILIES["llama"]


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


def _strings(buf: Any, pos: int, n: int) -> tuple[list[str], int]:
    """A GGUF array of `n` strings at `pos` (each a u64 byte count, then UTF-8), and the
    position after it. One loop reads the counts; the strings are then decoded in one call,
    joined by NUL (a 151,936-token vocabulary and its merges: 60 ms instead of 200). A
    string holding NUL itself falls back to one decode per string."""
    unpack = _U64.unpack_from
    heads = [0] * n
    p = pos
    try:
        for i in range(n):
            heads[i] = p
            p += 8 + unpack(buf, p)[0]
    except struct.error:
        p = len(buf) + 1
    if p > len(buf):
        raise ValueError("the header is truncated")
    if not n:
        return [], p
    raw = np.frombuffer(buf, np.uint8, p - pos, pos).copy()
    at = np.asarray(heads, np.int64) - pos
    raw[at] = 0  # each count's first byte becomes the separator, its other 7 go
    keep = np.ones(len(raw), bool)
    keep[(at[:, None] + np.arange(1, 8)).ravel()] = False
    out = raw[keep].tobytes().decode("utf-8", errors="replace").split("\x00")[1:]
    if len(out) != n:  # some string holds a NUL
        out = [
            buf[h + 8 : h + 8 + unpack(buf, h)[0]].decode("utf-8", errors="replace") for h in heads
        ]
    return out, p


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
            if etype == 8:  # strings (a vocabulary, merges)
                out, pos = _strings(buf, pos, n)
                return out
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


def _hf_name(gguf_name: str, layer_names: dict[str, str]) -> str:
    base, _, suffix = gguf_name.rpartition(".")
    parts = base.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in layer_names:
        return f"model.layers.{parts[1]}.{layer_names[parts[2]]}.{suffix}"
    return f"{_NAMES.get(base, base)}.{suffix}"


def _unpermute(w: mx.array, n_head: int) -> mx.array:
    """Invert llama.cpp's `permute` of Q/K rows (interleaved RoPE -> HF's half split)."""
    rest = w.shape[1:]
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def _load_weights(
    path: str,
    tensors: dict[str, _Tensor],
    dtype: mx.Dtype | None,
    heads: tuple[int, int] | None,
    family: Family = _LLAMA,
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
        base, hf = name.removesuffix(".weight"), _hf_name(name, family.layer_names)
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


def _model_args(
    meta: dict[str, Any], family: Family, tensors: dict[str, _Tensor]
) -> dict[str, Any]:
    arch = family.arch

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    needed = ("embedding_length", "block_count", "feed_forward_length", "attention.head_count")
    if missing := [f"{arch}.{k}" for k in needed if get(k) is None]:
        raise KeyError(f"missing metadata {missing}")
    hidden, heads = get("embedding_length"), get("attention.head_count")
    args = {
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
    args["rope_theta"] = get("rope.freq_base", 10000.0)  # llama.cpp's default when absent
    kind, factor = get("rope.scaling.type", "none"), get("rope.scaling.factor", 1.0)
    if kind == "linear" or get("rope.scale_linear"):
        args["rope_scaling"] = {"type": "linear", "factor": get("rope.scale_linear", factor)}
    elif kind == "yarn":
        orig = get("rope.scaling.original_context_length", args["max_position_embeddings"])
        args["rope_scaling"] = {"type": "yarn", "factor": factor}
        args["rope_scaling"]["original_max_position_embeddings"] = orig
    return family.model_args(get, args, set(tensors))


def _cpu_weights(
    path: str,
    tensors: dict[str, _Tensor],
    heads: tuple[int, int] | None,
    encoded: bool,
    family: Family = _LLAMA,
) -> tuple[dict[str, mx.array], dict[str, Any]] | None:
    """The CPU loads: weights dequantized by `qweights` (exactly gguf-py's values), dense
    float32 or, with `encoded`, matrices kept in the file's encoding. None where the native
    kernels cannot be built (the caller falls back to `_load_weights`)."""
    from ..kernels.bindings import qweights_library
    from . import qlinear as qweights

    if qweights_library() is None:
        return None
    names = {name: _hf_name(name, family.layer_names) for name in tensors}
    orders = {}
    for hf in names.values():
        proj = hf.rsplit(".", 2)[-2]
        if heads and proj in ("q_proj", "k_proj"):  # llama: undo the converter's permutation
            t = tensors[next(n for n, h in names.items() if h == hf)]
            orders[hf] = qweights.row_order(t.shape[0], heads[proj == "k_proj"])
    return qweights.load_cpu_weights(path, tensors, names, orders, keep_encoded=encoded)


def dense_fits(tensors: Any) -> bool:
    """Whether a dense float32 load of these tensors' matrices fits in `AUTO_DENSE_BYTES`
    and an eighth of the machine's RAM (the rule of `encoded=None`).

    It counts what the load really holds at its peak: every matrix's float32 copy, plus
    the largest one again, dequantized in numpy before MLX copies it (the embedding table,
    which also serves as a tied head; an untied head is one of the copies). On a Gemma 3
    270M (262k-token vocabulary) the copies are 1,022.5 MiB and the embedding 640 MiB:
    the old count (copies only) chose dense and peaked at 1,678 MiB RSS, more than the
    1.5B's encoded load; counted whole (1,662.5 MiB) it stays encoded (504 MiB). The
    embedded SmolLM2-135M counts 513 + 108 MiB and stays dense.
    """
    sizes = [4 * int(np.prod(t.shape)) for t in tensors if len(t.shape) == 2]
    dense = sum(sizes) + max(sizes, default=0)
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: the byte limit alone
        ram = 8 * AUTO_DENSE_BYTES
    return dense <= min(AUTO_DENSE_BYTES, ram // 8)


def load_gguf(
    path: str | os.PathLike, *, dtype: mx.Dtype | None = None, encoded: bool | None = False
) -> tuple[nn.Module, GGUFTokenizer, GGUFInfo]:
    """Load a GGUF file as an mlx-lm model, its tokenizer and its info.

    The architectures are those of `gguf_arch.SUPPORTED_ARCHITECTURES`: llama (and the
    Mistral models written as llama), qwen2, qwen3, gemma3 and phi3.

    Args:
        path: The `.gguf` file.
        dtype: `mx.float32` dequantizes every weight to dense float32 (the CPU path).
            `None` keeps what the file holds: Q4_0, Q4_1 and Q8_0 stay MLX-quantized and
            other quantized types become float16. Another float dtype casts every weight.
        encoded: (CPU) keep every matrix in the file's encoding, memory-mapped, as
            `qweights.GGUFLinear` / `GGUFEmbedding` modules that compute in float32 over
            a dequantized scratch; the scores equal the dense float32 path's. Other
            tensors are float32. Overrides `dtype`. None decides by size: encoded
            unless dense float32 matrices would fit in `dense_fits` (then `dtype`).

    Returns:
        The model (the `Model` of the architecture's mlx-lm module, e.g.
        `mlx_lm.models.qwen3.Model` or `gemma3_text.Model`, in eval mode, weights
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
        family = FAMILIES.get(arch)
        if family is not None:
            arg_dict = _model_args(meta, family, tensors)
    except (ValueError, struct.error, OSError, KeyError) as e:
        raise ModelLoadError(
            f"{path!r} is not a readable GGUF model file ({e}). Re-download it, or convert "
            "the model with a current llama.cpp convert_hf_to_gguf.py.",
            source=path,
        ) from e
    except ModelLoadError as e:  # the mlx-lm class cannot compute what the file asks for
        raise ModelLoadError(
            f"{path!r} cannot be loaded: {e}. Use an MLX or Hugging Face copy of the model.",
            source=path,
        ) from e
    if family is None:
        raise ModelLoadError(
            f"{path!r} holds a {arch!r} model, but pcd-tools loads only GGUF architectures "
            f"{', '.join(map(repr, SUPPORTED_ARCHITECTURES))}. Use a GGUF of a Llama, SmolLM, "
            "Mistral, Qwen2/2.5/3, Gemma 3 or Phi-3/4 model, or an MLX or Hugging Face model.",
            source=path,
        )
    tokenizer = GGUFTokenizer(meta, source=path)
    from gguf import LlamaFileType

    module = mlx_lm_module(f"models.{family.module}")
    heads = (arg_dict["num_attention_heads"], arg_dict["num_key_value_heads"])
    permuted = heads if family.permute_qk else None
    if encoded is None:
        encoded = not dense_fits(tensors.values())
    encoded_weights: dict[str, Any] = {}
    quantized: dict[str, dict] = {}
    try:
        cpu = (
            _cpu_weights(path, tensors, permuted, encoded, family)
            if encoded or (dtype is not None and dtype == mx.float32)
            else None
        )
        if cpu is not None:
            weights, encoded_weights = cpu
        else:
            weights, quantized = _load_weights(path, tensors, dtype, permuted, family)
    except (ValueError, OSError) as e:
        raise ModelLoadError(
            f"The tensors of {path!r} cannot be read ({e}); the file may be truncated. "
            "Re-download it.",
            source=path,
        ) from e
    finish_weights(family, weights)
    rope_factors(weights, arg_dict)
    try:
        args = module.ModelArgs.from_dict(arg_dict)
    except (ValueError, TypeError) as e:
        raise ModelLoadError(
            f"The metadata of {path!r} does not make an mlx-lm {family.module} model: {e}",
            source=path,
        ) from e
    model = module.Model(args)
    if (factors := weights.pop("rope_freqs.weight", None)) is not None:
        for layer in model.layers:
            rope = _FreqsRoPE(arg_dict["head_dim"], args.rope_theta, factors.astype(mx.float32))
            layer.self_attn.rope = rope
    nn.quantize(model, class_predicate=lambda p, _: quantized.get(p, False))
    if encoded_weights:
        from .qlinear import install

        install(model, encoded_weights, weights)
    try:
        if hasattr(model, "sanitize"):  # phi3's class has none
            weights = model.sanitize(weights)
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise ModelLoadError(
            f"{path!r} does not fit an mlx-lm {family.module} model: {e}", source=path
        ) from e
    if encoded_weights:  # SwiGLU MLPs over file-encoded matrices stay in numpy between them
        from .gguf_mlp import install_mlps

        install_mlps(model)
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
