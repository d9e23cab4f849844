"""GGUF weights kept in their file encoding on CPU, multiplied over a reused float32 scratch.

On CPU, `gguf.load_gguf` (unless dense float32 weights are asked for) puts a `GGUFLinear`
in place of every `nn.Linear` and a `GGUFEmbedding` in place of the token embedding.
Each holds its tensor as the file stores it (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K,
F16, BF16 or F32), as a read-only view of the memory-mapped file: loading reads no
weights, and the weights cost the page cache, not the heap.

A call multiplies in float32, exactly as the dense path does (`_qweights.c`): one panel
of rows of the matrix at a time is dequantized into a per-thread scratch, on the
request's threads, and multiplied by the bound BLAS's `cblas_sgemm` with the arguments
MLX uses for a dense `x @ W.T`. The dequantized values equal gguf-py's bit for bit and
the GEMM is the same, so the scores equal the dense float32 path's (tests check 1e-5;
on this machine they are bit-identical). Only one panel of float32 weights exists per
thread at a time. The token embedding dequantizes the rows a call looks up; a tied head
is a quantized matmul like the others.

GPU engines (Metal, CUDA) never get these modules: MLX keeps its own quantized weights
there (`load_gguf(dtype=None)`). This is where CPU and GPU differ.

Needs a C compiler and a bound fast BLAS (`platform.sgemm_address()`); without them the
CPU load falls back to dense float32 weights (`available()` says why).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from pcd_tools.errors import InvalidArgumentError, NativeBuildError

from ..host.blas import import_mlx, sgemm_address
from ..host.threads import thread_budget
from ..kernels.bindings import qweights_error, qweights_library
from ..kernels.gguf_types import GGUF_TYPES
from ..kernels.paths import PATHS

mx = import_mlx()
import mlx.nn as nn  # noqa: E402

__all__ = [
    "GGML_TYPES",
    "GGUFEmbedding",
    "GGUFLinear",
    "QTensor",
    "auto_compute",
    "available",
    "dequantize",
    "product_at_rows",
    "set_compute",
]

# ggml type name -> (type id, weights per block, bytes per block): what the kernel reads
# (every type of gguf_types, the one table).
GGML_TYPES: dict[str, tuple[int, int, int]] = GGUF_TYPES
# Float32 bytes of one dequantized panel (the per-thread scratch). A matrix that fits is
# multiplied in one GEMM call, as the dense path does: bit-identical results. Larger ones
# (output heads, 7B MLPs) go in panels; OpenBLAS then blocks the GEMM differently and
# results differ from one call by a few float32 ulps (measured <= 6e-7 relative).
# One call was also the fastest measured (1 MB to 16 MB panels: 1.4-2.6x slower than one
# call on a contended 2-core EPYC; BENCHMARKS.md).
# `PCD_QPANEL_BYTES` overrides it (`panel_bytes`).
PANEL_BYTES = 64 << 20


def panel_bytes() -> int:
    """`$PCD_QPANEL_BYTES` (a positive number of bytes), else `PANEL_BYTES`.

    Raises:
        InvalidArgumentError: for a value that is not a positive integer.
    """
    env = os.environ.get("PCD_QPANEL_BYTES", "").strip()
    if not env:
        return PANEL_BYTES
    if not env.isdigit() or int(env) <= 0:
        raise InvalidArgumentError(
            f"PCD_QPANEL_BYTES={env!r} is not accepted; expected a positive integer number "
            f"of bytes (default {PANEL_BYTES}, one 64 MiB float32 panel)."
        )
    return int(env)


_local = threading.local()


def available() -> tuple[bool, str]:
    """Whether quantized CPU weights can be used here, and if not, why."""
    if qweights_library() is None:
        return False, f"the quantized-weight kernels could not be built: {qweights_error()}"
    if not sgemm_address():
        return False, "no fast BLAS was bound before mlx was imported"
    return True, "on"


def _threads() -> int:
    """Threads for dequantizing: the engine's count for this request (from the thread
    budget, `host.threads`, handed over by `cpu_ops.active`) when its kernels are on."""
    from ..kernels import cpu_ops as cpu_kernels

    return int(getattr(cpu_kernels._state, "threads", 1)) if cpu_kernels._on() else 1


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


class QTensor:
    """A 2-D GGUF tensor in its file encoding.

    Args:
        data: The raw rows, (rows, row bytes) uint8 (a view of the memory-mapped file).
        type_name: The ggml type name, e.g. "Q4_K".
        cols: Weights per row.
        rows: Optional int32 order of the rows: row i is stored row `rows[i]` (llama's
            un-permuted Q/K rows).
    """

    def __init__(self, data: np.ndarray, type_name: str, cols: int, rows: np.ndarray | None = None):
        if type_name not in GGML_TYPES:
            raise ValueError(
                f"tensor type {type_name} has no CPU kernel; supported: {sorted(GGML_TYPES)}"
            )
        self.type_name = type_name
        self.type_id, per, nbytes = GGML_TYPES[type_name]
        if cols % per or data.ndim != 2 or data.shape[1] != cols // per * nbytes:
            raise ValueError(
                f"a {type_name} row of {cols} weights needs {cols // per * nbytes} bytes in "
                f"blocks of {per}; got data of shape {data.shape}"
            )
        self.data = data
        self.rows = None if rows is None else np.ascontiguousarray(rows, np.int32)
        self.shape = (int(data.shape[0]), int(cols))
        self.ndim = 2
        self.nbytes = int(data.nbytes)
        # "float32" (dequantized panels + sgemm) or "int8" / "bf16" (`qgemm`), set by
        # `set_compute`; the int8 / bf16 view of the same bytes is made on first use
        self.compute = "float32"
        self._qmatrix: Any = None

    def dequantize(self, rows: np.ndarray | None = None, threads: int = 1) -> np.ndarray:
        """Float32 rows: all of them, or those at `rows` (int indices, any shape)."""
        lib = qweights_library()
        if lib is None:
            raise NativeBuildError(
                f"the quantized-weight kernels are unavailable: {qweights_error()}"
            )
        if rows is None:
            idx = self.rows
            n = self.shape[0]
        else:
            flat = np.asarray(rows).reshape(-1).astype(np.int64)
            if flat.size and (flat.min() < 0 or flat.max() >= self.shape[0]):
                raise IndexError(f"row index out of range [0, {self.shape[0]})")
            idx = (flat if self.rows is None else self.rows[flat]).astype(np.int32)
            n = int(flat.size)
        out = np.empty((n, self.shape[1]), np.float32)
        if n:
            rc = lib.pcd_q_dequant_rows(
                self.type_id,
                self.data.ctypes.data,
                self.data.shape[1],
                self.shape[1],
                _ptr(idx),
                0,
                n,
                out.ctypes.data,
                max(1, threads),
                PATHS["auto"],
            )
            if rc != 0:
                raise ValueError(f"cannot dequantize a {self.type_name} tensor of {self.shape}")
        return out if rows is None else out.reshape(*np.shape(rows), self.shape[1])

    def take_rows(self, rows: np.ndarray) -> QTensor:
        """These rows alone, in this tensor's encoding and compute mode: row i of the
        result is row `rows[i]` (a copy of its blocks). Each output of a product is its
        own row's sum, so the result's outputs are this tensor's at those rows (the
        output head at a field's allowed tokens, `passes.head.head_at`)."""
        idx = np.asarray(rows, np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.shape[0]):
            raise IndexError(f"row index out of range [0, {self.shape[0]})")
        stored = idx if self.rows is None else self.rows[idx]
        sub = QTensor(np.ascontiguousarray(self.data[stored]), self.type_name, self.shape[1])
        sub.compute = self.compute
        return sub

    def matmul(
        self,
        x: np.ndarray,
        threads: int = 1,
        bias: np.ndarray | None = None,
        out: np.ndarray | None = None,
        activations: Any = None,
    ) -> np.ndarray:
        """x (m, cols) float32 times this tensor transposed (+ bias): (m, rows) float32,
        in this tensor's `compute` mode; written into `out` ((m, rows) float32, C order)
        when given. `activations`: x as `activations_for` quantized it (int8 only)."""
        if self.compute != "float32":
            return self._qgemm(x, threads, bias, out, activations)
        if activations is not None:
            raise ValueError("activations are the int8 route's; this tensor computes float32")
        lib = qweights_library()
        gemm = sgemm_address()
        if lib is None or not gemm:
            raise NativeBuildError("quantized matmul needs the native kernels and a fast BLAS")
        n, k = self.shape
        x = np.ascontiguousarray(x, np.float32)
        m = int(x.shape[0])
        if out is None:
            out = np.empty((m, n), np.float32)
        elif out.shape != (m, n) or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"out must be C-contiguous float32 of shape {(m, n)}")
        panel = max(1, min(n, panel_bytes() // (4 * k)))
        scratch = _scratch(panel * k)
        rc = lib.pcd_q_matmul(
            gemm,
            self.type_id,
            self.data.ctypes.data,
            self.data.shape[1],
            _ptr(self.rows),
            n,
            k,
            x.ctypes.data,
            m,
            out.ctypes.data,
            n,
            panel,
            scratch.ctypes.data,
            max(1, threads),
            _ptr(bias),
            PATHS["auto"],
        )
        if rc != 0:
            raise ValueError(f"cannot multiply by a {self.type_name} tensor of {self.shape}")
        return out

    def _matrix(self) -> Any:
        from ..kernels import qgemm

        if self._qmatrix is None:
            self._qmatrix = qgemm.prepare(self.data, self.type_name, self.shape)
        return self._qmatrix

    def act_block(self) -> int | None:
        """Values per activation scale of this tensor's int8 route: 256 for K-quants
        (llama.cpp's Q8_K, the faster int8 route on every CPU), 32 for the other types;
        None outside int8."""
        if self.compute != "int8":
            return None
        return 256 if self._matrix().kquant else 32

    def activations_for(self, x: np.ndarray, threads: int = 1) -> Any:
        """x quantized as this tensor's int8 route quantizes it, for `matmul(...,
        activations=)` on every tensor of the same `act_block` that reads the same x."""
        from ..kernels import qgemm

        block = self.act_block()
        if block is None:
            raise ValueError(f"{self.type_name} tensor computes {self.compute}, not int8")
        return qgemm.quantize_activations(
            np.ascontiguousarray(x, np.float32), threads=max(1, threads), block=block
        )

    def _qgemm(
        self,
        x: np.ndarray,
        threads: int,
        bias: np.ndarray | None,
        out: np.ndarray | None = None,
        activations: Any = None,
    ) -> np.ndarray:
        """`matmul` on the int8 / bf16 kernels, over the same bytes (no copy)."""
        m = self._matrix()
        block = self.act_block() if m.kquant else None  # K-quants: per 256 (act_block)
        direct = self.rows is None
        y = m.matmul(
            np.ascontiguousarray(x, np.float32),
            mode=self.compute,
            threads=max(1, threads),
            act_block=block,
            out=out if direct else None,
            activations=activations,
        )
        if not direct:  # stored row rows[i] is output i
            y = y[:, self.rows]
            if out is not None:
                out[...] = y
                y = out
        if bias is not None:
            y += bias
        return np.ascontiguousarray(y)


def set_compute(model: Any, mode: str) -> int:
    """Sets the compute mode of every file-encoded matrix of `model` that has an int8 /
    bf16 kernel (the others, e.g. F16 or BF16 tensors, stay float32).

    Args:
        model: An mlx-lm model with `GGUFLinear` / `GGUFEmbedding` modules.
        mode: `"float32"`, `"int8"` or `"bf16"`.

    Returns:
        How many matrices now run in `mode`.
    """
    from ..kernels.qgemm import GGML_TYPES as KERNEL_TYPES

    n = 0
    for _, m in model.named_modules():
        if isinstance(m, (GGUFLinear, GGUFEmbedding)):
            qt = m.weight
            if mode == "float32" or qt.type_name in KERNEL_TYPES:
                qt.compute = mode
                n += 1
    return n


#: Encoded matrix bytes from which `auto` takes int8 for 32-block files on a SIMD int8 CPU.
INT8_MIN_BYTES = 256 << 20


def auto_compute(model: Any) -> str:
    """The compute mode `compute="auto"` picks for a model loaded in its file's encoding.

    `"int8"` where a SIMD int8 kernel runs and it pays (BENCHMARKS.md, "Quantized GEMM
    kernels", "int8 on AVX2" parts 1-4):
    - K-quant matrices (Q4_K, Q5_K, Q6_K) hold at least half of the encoded matrix bytes,
      as in the Q4_K_M files users run: on AVX-512 VNNI the column-panel kernel, 2.5-3x
      faster than float32 at 1.5B; on AVX-VNNI / AVX2 the 8-lane K kernels, 1.2-1.3x
      warm and 1.04x in a cold prefill at 1.5B on a Zen 3;
    - also files of at least `INT8_MIN_BYTES` (256 MiB) of encoded matrices in any type,
      whose 32-block matrices (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) run the column-panel
      32-block kernels (AVX-512 VNNI, AVX-VNNI, AVX2): Qwen2.5-0.5B's Q4_K_M file (85%
      Q5_0 / Q8_0) had a 1.37-1.53x faster cold prefill in int8 on a Zen 3, and
      1.53-1.81x faster warm requests on a Zen 4 with AVX-512 VNNI. Smaller files stay
      float32 (the embedded 135M kept encoded: 1.13-1.17x, not worth int8's distance
      from the reference numbers).

    Otherwise `"float32"`, as with the portable C kernel and dense models.

    Args:
        model: An mlx-lm model, with `GGUFLinear` / `GGUFEmbedding` modules when it was
            loaded encoded (a dense model has none: `"float32"`).

    Returns:
        `"int8"` or `"float32"`.
    """
    total = kq = 0
    for _, m in model.named_modules():
        if isinstance(m, (GGUFLinear, GGUFEmbedding)):
            total += m.weight.data.nbytes
            if m.weight.type_name in ("Q4_K", "Q5_K", "Q6_K"):
                kq += m.weight.data.nbytes
    if not total:
        return "float32"
    from ..kernels import qgemm

    try:
        isa = qgemm.isa()
    except NativeBuildError:  # no compiler: the float32 route needs no int8 kernels
        return "float32"
    if isa not in ("avx512vnni", "avxvnni", "avx2"):
        return "float32"
    return "int8" if kq * 2 >= total or total >= INT8_MIN_BYTES else "float32"


def _scratch(n: int) -> np.ndarray:
    """This thread's float32 scratch of at least n floats (grown, never shrunk)."""
    buf = getattr(_local, "scratch", None)
    if buf is None or buf.size < n:
        buf = _local.scratch = np.empty(n, np.float32)
    return buf


def dequantize(tensor: QTensor, threads: int | None = None) -> np.ndarray:
    """The whole tensor as dense float32 (rows in model order)."""
    return tensor.dequantize(threads=threads or thread_budget())


def _as_numpy(x: Any) -> np.ndarray:
    if x.dtype != mx.float32:
        x = x.astype(mx.float32)
    mx.eval(x)
    return np.array(x, copy=False)


class GGUFLinear(nn.Module):
    """A linear layer over a GGUF tensor in its file encoding (float32 arithmetic).

    Args:
        weight: The (out, in) weight.
        bias: Optional float32 bias (out,).
    """

    gguf_encoded = True  # read by decode_parts without importing this module

    def __init__(self, weight: QTensor, bias: Any = None):
        super().__init__()
        self.weight = weight
        if bias is not None:
            self.bias = bias

    def _extra_repr(self) -> str:
        return f"{self.weight.shape[1]}, {self.weight.shape[0]}, {self.weight.type_name}"

    def numpy_bias(self) -> np.ndarray | None:
        """The bias as float32 numpy, or None."""
        return _as_numpy(self["bias"]) if "bias" in self else None

    def __call__(self, x: Any) -> Any:
        lead = x.shape[:-1]
        xn = _as_numpy(x).reshape(-1, x.shape[-1])
        threads = _threads()
        acts = _shared_activations(x, xn, self.weight, threads)
        y = self.weight.matmul(xn, threads, self.numpy_bias(), activations=acts)
        return mx.array(y).reshape(*lead, self.weight.shape[0])


def product_at_rows(layer: Any, x: Any, rows: np.ndarray) -> np.ndarray:
    """x (..., in) times the rows `rows` of a GGUF layer's weight (a `GGUFLinear`, with
    its bias at those rows, or a `GGUFEmbedding` read as a tied head): (..., len(rows))
    float32 numpy, each output that row's own sum in the layer's compute mode."""
    lead = x.shape[:-1]
    bias = layer.numpy_bias() if isinstance(layer, GGUFLinear) else None
    y = layer.weight.take_rows(rows).matmul(
        _as_numpy(x).reshape(-1, x.shape[-1]),
        _threads(),
        None if bias is None else np.ascontiguousarray(bias[rows]),
    )
    return y.reshape(*lead, len(rows))


_memo = threading.local()


def _shared_activations(x: Any, xn: np.ndarray, weight: QTensor, threads: int) -> Any:
    """`weight.activations_for(xn)`, quantized once for consecutive int8 products of the
    same input (attention's q, k and v read one `x`): the last input's activations are
    kept per thread, with the input itself, so identity cannot be a reused id."""
    block = weight.act_block()
    if block is None:
        return None
    last = getattr(_memo, "last", None)
    if last is not None and last[0] is x and last[1] == block:
        return last[2]
    acts = weight.activations_for(xn, threads)
    _memo.last = (x, block, acts)
    return acts


class GGUFEmbedding(nn.Module):
    """A token embedding over a GGUF tensor: looks up and dequantizes only the rows used.

    Args:
        weight: The (vocab, dims) table.
    """

    gguf_encoded = True  # read by decode_parts without importing this module

    def __init__(self, weight: QTensor):
        super().__init__()
        self.weight = weight

    def _extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, {self.weight.shape[1]}, {self.weight.type_name}"

    def __call__(self, ids: Any) -> Any:
        mx.eval(ids)
        return mx.array(self.weight.dequantize(np.array(ids, copy=False), _threads()))

    def as_linear(self, x: Any) -> Any:
        """The table as a tied output head: x @ table.T, a quantized matmul."""
        lead = x.shape[:-1]
        y = self.weight.matmul(_as_numpy(x).reshape(-1, x.shape[-1]), _threads())
        return mx.array(y).reshape(*lead, self.weight.shape[0])


def row_order(rows: int, n_head: int) -> np.ndarray:
    """The row order that undoes llama.cpp's Q/K `permute` (gguf `_unpermute` on indices)."""
    idx = np.arange(rows, dtype=np.int32)
    return idx.reshape(n_head, rows // n_head // 2, 2).swapaxes(1, 2).reshape(-1)


def load_cpu_weights(
    path: str,
    tensors: dict[str, Any],
    hf_names: dict[str, str],
    row_orders: dict[str, np.ndarray],
    keep_encoded: bool,
    threads: int | None = None,
) -> tuple[dict[str, Any], dict[str, QTensor]]:
    """Read a GGUF file's tensors for a CPU model.

    Args:
        path: The file.
        tensors: GGUF name -> its `_Tensor` (type, numpy-order shape, absolute offset).
        hf_names: GGUF name -> mlx-lm parameter name.
        row_orders: mlx-lm parameter name -> row order (llama's Q/K weights and biases).
        keep_encoded: Keep 2-D weights in the file's encoding (`QTensor`s over the
            memory-mapped file); False dequantizes them to dense float32.
        threads: Threads for dequantizing (default: the thread budget,
            `threads.thread_budget()`).

    Returns:
        Dense float32 MLX arrays by mlx-lm name (vectors, and matrices when not kept
        encoded), and `QTensor`s by mlx-lm module name ("model.layers.0.mlp.up_proj").
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

    threads = threads or thread_budget()
    mm = np.memmap(path, np.uint8, "r")
    dense: dict[str, Any] = {}
    encoded: dict[str, QTensor] = {}
    for name, t in tensors.items():
        hf = hf_names[name]
        order = row_orders.get(hf)
        block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[t.type]]
        rows = int(np.prod(t.shape[:-1])) if len(t.shape) > 1 else 1
        row_bytes = t.shape[-1] // block * nbytes
        raw = mm[t.offset : t.offset + rows * row_bytes]
        if raw.size != rows * row_bytes:
            raise ValueError(f"tensor {name} runs past the end of the file")
        raw = raw.reshape(rows, row_bytes)
        if t.type not in GGML_TYPES:  # e.g. IQ*: gguf-py, dense
            w = quants.dequantize(np.asarray(raw), GGMLQuantizationType[t.type])
            w = w.reshape(t.shape).astype(np.float32)
            dense[hf] = mx.array(w[order] if order is not None else w)
            continue
        qt = QTensor(raw, t.type, int(t.shape[-1]), order if len(t.shape) == 2 else None)
        if keep_encoded and len(t.shape) == 2 and hf.endswith(".weight"):
            encoded[hf.removesuffix(".weight")] = qt
            continue
        w = qt.dequantize(threads=threads).reshape(t.shape)
        if order is not None and len(t.shape) == 1:
            w = w[order]
        dense[hf] = mx.array(w)
    return dense, encoded


def install(model: Any, encoded: dict[str, QTensor], biases: dict[str, Any]) -> None:
    """Put `GGUFLinear` / `GGUFEmbedding` modules in place of the model's dense ones.

    Args:
        model: The freshly built mlx-lm model.
        encoded: `QTensor`s by module name (from `load_cpu_weights`).
        biases: Float32 weights by parameter name, where the replaced modules' biases are.
    """
    for module_name, qt in encoded.items():
        *parents, leaf = module_name.split(".")
        parent: Any = model
        for part in parents:
            parent = parent[int(part)] if isinstance(parent, list) else getattr(parent, part)
        old = getattr(parent, leaf)
        if isinstance(old, nn.Embedding):
            setattr(parent, leaf, GGUFEmbedding(qt))
        elif isinstance(old, nn.Linear):
            setattr(parent, leaf, GGUFLinear(qt, biases.get(f"{module_name}.bias")))
        else:
            raise ValueError(f"{module_name} is a {type(old).__name__}, not a Linear or Embedding")
