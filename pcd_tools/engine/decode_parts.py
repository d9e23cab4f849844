"""What native decoding reads from an MLX model, and how many threads a step uses.

The parts of `fast_decode` that do not touch the native library: the float32 weights of
linear and embedding layers (dequantized where MLX holds them quantized), whether a model
can be decoded natively at all, the RoPE tables probed from the model's own rope module,
the decode ISA and thread count from the environment, the thread tuner, and which
weights the steps read (`check_weights`: the GGUF file's blocks or an 8-bit copy) and
what they multiply them by (`pick_activations`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from .platform import import_mlx

mx = import_mlx()

__all__ = [
    "ACTIVATIONS",
    "WEIGHTS",
    "available_memory",
    "check_weights",
    "pick_activations",
    "unsupported_reason",
]

ARCHS = ("mlx_lm.models.llama", "mlx_lm.models.qwen2")
QB = 32  # inputs per quantization block
_ISAS = {"auto": 0, "avx512": 512, "512": 512, "avx2": 256, "256": 256, "scalar": 1, "1": 1}


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


def _rope_tables(rope: Any, head_dim: int, n: int, check: bool) -> tuple[Any, ...]:
    """cos and sin (n, dims / 2) of the model's rope module at positions [0, n), probed
    from the module itself (it rotates pairs (i1[k], i2[k]) by angle k); its layout and
    rotated dims. With `check`, None unless they reproduce the module on random vectors."""
    dims = int(getattr(rope, "dims", head_dim))
    trad = bool(getattr(rope, "traditional", False))
    idx = np.arange(dims)
    i1, i2 = (idx[0::2], idx[1::2]) if trad else (idx[: dims // 2], idx[dims // 2 :])
    probe = np.zeros((1, 1, n, head_dim), np.float32)
    probe[..., i1] = 1.0
    out = np.array(rope(mx.array(probe), offset=0).astype(mx.float32))[0, 0]
    cos, sin = np.ascontiguousarray(out[:, i1]), np.ascontiguousarray(out[:, i2])
    rng = np.random.default_rng(0)
    for off in (0, 7, n - 2) if check else ():
        x = rng.standard_normal((2, head_dim)).astype(np.float32)
        want = np.array(rope(mx.array(x[None, None]), offset=off).astype(mx.float32))[0, 0]
        c, s_, got = cos[off : off + 2], sin[off : off + 2], x.copy()
        got[:, i1] = x[:, i1] * c - x[:, i2] * s_
        got[:, i2] = x[:, i1] * s_ + x[:, i2] * c
        if not np.allclose(got, want, rtol=1e-4, atol=1e-4):
            return None, None, trad, dims
    return cos, sin, trad, dims


def _isa_from_env(isa: str | int | None) -> int:
    if isa is None:
        isa = os.environ.get("PCD_DECODE_ISA", "auto")
    key = str(isa).strip().lower()
    if key not in _ISAS:
        raise InvalidArgumentError(
            f"decode ISA {isa!r} is not known; accepted: {sorted(set(_ISAS) - {'512', '256', '1'})}"
        )
    return _ISAS[key]


def _default_threads() -> int:
    """`$PCD_DECODE_THREADS`, else the CPUs this process may use (its affinity mask, less
    a cgroup quota: `cpus.usable_cpus`)."""
    from .cpus import usable_cpus

    env = os.environ.get("PCD_DECODE_THREADS", "").strip()
    if not env:
        return usable_cpus()
    if not env.isdigit() or int(env) <= 0:
        raise InvalidArgumentError(
            f"PCD_DECODE_THREADS={env!r} is not accepted; expected a positive integer (the "
            "decode step's threads), or unset for the CPUs this process may use."
        )
    return int(env)


class _ThreadTuner:
    """How many of the pool's threads a step uses: the count with the fastest recent
    steps (per batch size class), trying each count again every 16th step. Where other
    processes hold the cores, fewer threads win (each waits less at the step's 121
    barriers): on this 2-core VM at a load average of ~4, 1 thread took 19.9 ms/token and
    2 took 26.5 ms. A fixed count (`threads=` or `PCD_DECODE_THREADS`) is never tuned.
    `workers.ThreadFit` tunes the engine's passes with it over two counts of its own."""

    def __init__(self, n: int, fixed: bool):
        self.n, self.fixed, self.calls = n, fixed, 0
        self.times: dict[tuple[int, int], list[float]] = {}

    def pick(self, batch: int, counts: tuple[int, ...] | None = None) -> int:
        """The count to use: one of `counts` (default 1 to `n`)."""
        if self.fixed or self.n == 1:
            return self.n
        self.calls += 1
        key = min(batch.bit_length(), 4)
        counts = counts or tuple(range(1, self.n + 1))
        for t in counts:
            if len(self.times.get((key, t), ())) < 2:
                return t
        if self.calls % 16 == 0:
            return counts[(self.calls // 16) % len(counts)]
        return min(counts, key=lambda t: float(np.median(self.times[(key, t)])))

    def record(self, batch: int, threads: int, seconds: float) -> None:
        if not self.fixed:
            recent = self.times.setdefault((min(batch.bit_length(), 4), threads), [])
            recent.append(seconds)
            del recent[:-5]


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


_CGROUP = "/sys/fs/cgroup"  # the cgroup file system (a test points it elsewhere)


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def available_memory() -> int:
    """Bytes of memory available now: MemAvailable (the physical size where unknown), and
    no more than this process's cgroup leaves under its limit (v2 `memory.max` less
    `memory.current`, or v1 `memory.limit_in_bytes` less `memory.usage_in_bytes`)."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    if avail is None:
        try:
            avail = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (ValueError, OSError, AttributeError):
            avail = 1 << 62
    for limit, used in (
        ("memory.max", "memory.current"),
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
    ):
        cap, cur = _read_int(f"{_CGROUP}/{limit}"), _read_int(f"{_CGROUP}/{used}")
        if cap is not None and cur is not None and cap < 1 << 60:  # v1 writes a huge "no limit"
            avail = min(avail, max(0, cap - cur))
    return avail


def _copy_bytes(model: Any) -> int:
    """What an 8-bit copy of the model's GGUF-encoded matrices would take (1.25 bytes a
    weight: a byte, and a float32 scale and minimum per 32)."""
    n = 0
    for _, m in model.named_modules():
        if getattr(m, "gguf_encoded", False):
            rows, cols = m.weight.shape
            n += rows * cols * 5 // 4
    return n
