"""What native decoding reads from an MLX model.

The parts of `native_steps` that do not touch the native library: the float32 weights of
linear and embedding layers (dequantized where MLX holds them quantized), whether a model
can be decoded natively at all, which weights the steps read (`check_weights`: the GGUF
file's blocks or an 8-bit copy) and what they multiply them by (`pick_activations`). The
RoPE probe is `kernels.cpu_ops.rope_tables` and the decode ISA `kernels.paths.decode_isa`;
the thread count and tuner, and the memory probe live in `host/` (`threads`,
`cgroups.available_memory`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ...errors import InvalidArgumentError
from ..host.blas import import_mlx

mx = import_mlx()

__all__ = [
    "ACTIVATIONS",
    "WEIGHTS",
    "check_weights",
    "pick_activations",
    "unsupported_reason",
]

ARCHS = ("mlx_lm.models.llama", "mlx_lm.models.qwen2")
QB = 32  # inputs per quantization block


def _np(a: Any) -> np.ndarray:
    """A float32 numpy array of an MLX array: a view when it is float32 already."""
    if a.dtype != mx.float32:
        a = a.astype(mx.float32)
    mx.eval(a)
    return np.ascontiguousarray(np.array(a, copy=False))


def _dense(layer: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """A linear layer's float32 weight (out, in) and bias."""
    import mlx.nn as nn

    bias = _np(layer["bias"]) if "bias" in layer else None
    if getattr(layer, "gguf_encoded", False):  # qweights.GGUFLinear: dequantize this one only
        return layer.weight.dequantize(threads=2), bias  # numpy float32, no MLX buffer
    if isinstance(layer, nn.QuantizedLinear):
        w = mx.dequantize(layer.weight, layer.scales, layer.biases, layer.group_size, layer.bits)
    elif isinstance(layer, nn.Linear):
        w = layer.weight
    else:
        raise TypeError(f"{type(layer).__name__} is not a linear layer")
    return _np(w), bias


def _embedding(emb: Any) -> np.ndarray:
    import mlx.nn as nn

    if getattr(emb, "gguf_encoded", False):  # qweights.GGUFEmbedding
        return emb.weight.dequantize(threads=2)
    if isinstance(emb, nn.QuantizedEmbedding):
        return _np(mx.dequantize(emb.weight, emb.scales, emb.biases, emb.group_size, emb.bits))
    return _np(emb.weight)


def unsupported_reason(model: Any, device: str) -> str | None:
    """Why native int8 decoding cannot run `model` on `device`, or None if it can."""
    import mlx.nn as nn

    if device != "cpu":
        return f"the engine runs on {device!r}; native decoding is for CPU engines"
    if type(model).__module__ not in ARCHS:
        return f"{type(model).__module__}.{type(model).__name__} is not a llama or qwen2 model"
    inner: Any = getattr(model, "model", None)
    layers = list(getattr(inner, "layers", []) or [])
    if not layers or not hasattr(inner, "embed_tokens"):
        return "the model has no transformer layers or token embedding to read"
    if any(getattr(layer, "use_sliding", False) for layer in layers):
        return "the model has sliding-window attention layers"
    a = layers[0].self_attn
    if not all(isinstance(n, nn.RMSNorm) for n in (layers[0].input_layernorm, inner.norm)):
        return "the model's norms are not RMSNorm"
    args = getattr(model, "args", None)
    hidden = int(getattr(args, "hidden_size", 0) or 0)
    inter = int(getattr(args, "intermediate_size", 0) or 0)
    width = int(a.q_proj.weight.shape[0])  # output rows: the same for quantized layers
    if not hidden or not inter or hidden % QB or inter % QB or width % QB:
        return (
            f"the hidden ({hidden}), MLP ({inter}) or attention ({width}) width is not a "
            f"multiple of {QB}"
        )
    return None


WEIGHTS = ("auto", "file", "copy")


def env_choice(
    value: Any, source: str, env: tuple[str, str | None], choices: tuple[str, ...], accepted: str
) -> str:
    """`value`, else the variable `env` = (name, its value; stripped, lower case), else
    `"auto"`, checked to be one of `choices`; `accepted` says in the error what each means.

    Raises:
        InvalidArgumentError: naming the option or the variable, and what is accepted.
    """
    if value is None:
        if not env[1]:
            return "auto"
        value, source = env[1].strip().lower(), env[0]
    if not isinstance(value, str) or value not in choices:
        raise InvalidArgumentError(f"{source}={value!r} is not {accepted}")
    return value


def check_weights(value: Any, source: str = "weights") -> str:
    """Which weights the steps read: `value`, else `$PCD_DECODE_WEIGHTS`, else `"auto"`.

    Raises:
        InvalidArgumentError: for a value that is not one of `WEIGHTS`.
    """
    return env_choice(
        value,
        source,
        ("PCD_DECODE_WEIGHTS", os.environ.get("PCD_DECODE_WEIGHTS")),
        WEIGHTS,
        "a decode weights choice; accepted: 'auto' (the GGUF file's own blocks where the "
        "model computes in int8, else an 8-bit copy unless it would take over a quarter of "
        "the available memory), 'file' (the file's own blocks, no copy) or 'copy' (an 8-bit "
        "copy).",
    )


ACTIVATIONS = ("auto", "float32", "int8")


def pick_activations(value: Any, model: Any) -> str:
    """What the steps multiply the file's blocks by: float32 activations, or activations
    quantized to 8 bits (integer dots, the int8 passes' arithmetic).

    Args:
        value: `"float32"`, `"int8"`, or `"auto"` / None: `"int8"` where the model's
            GGUF-encoded matrices compute in int8 (`Decider.load(compute=...)`, whose
            `"auto"` takes int8 for K-quant files on SIMD CPUs), else `"float32"`.
        model: The mlx-lm model.

    Raises:
        InvalidArgumentError: for a value not in `ACTIVATIONS`.
    """
    if value is None:
        value = "auto"
    if not isinstance(value, str) or value not in ACTIVATIONS:
        raise InvalidArgumentError(
            f"activations={value!r} is not one of {list(ACTIVATIONS)}: 'float32' (the file's "
            "weights times float32 activations), 'int8' (activations quantized to 8 bits, "
            "integer dots) or 'auto' (int8 where the model's matrices compute in int8)"
        )
    if value != "auto":
        return value
    for _, m in model.named_modules():
        if getattr(m, "gguf_encoded", False) and getattr(m.weight, "compute", "") == "int8":
            return "int8"
    return "float32"


def _copy_bytes(model: Any) -> int:
    """What an 8-bit copy of the model's GGUF-encoded matrices would take (1.25 bytes a
    weight: a byte, and a float32 scale and minimum per 32)."""
    n = 0
    for _, m in model.named_modules():
        if getattr(m, "gguf_encoded", False):
            rows, cols = m.weight.shape
            n += rows * cols * 5 // 4
    return n
