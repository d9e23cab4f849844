"""A SwiGLU MLP whose three projections are GGUF matrices, run in numpy between them.

mlx-lm's MLP is ``down(swiglu(gate(x), up(x)))``. With `GGUFLinear` projections each of
the three products already runs in numpy (`qweights`), so the unfused module copied
every product into an MLX array and back out: at a 1.5B's 512-row prefill that is three
18 MB copies per layer into fresh pages (about 9% of the prefill's time on a 2-core CPU).
`GGUFMLP` keeps the intermediates in reused numpy buffers (up to `RETAIN_BYTES` each; larger
products get fresh arrays, so long prompts leave no large scratch behind), quantizes ``x`` once for gate
and up when both take the same int8 activations, and applies SwiGLU with the same native
kernel. The numbers are those of the unfused module, bit for bit: the same
products in the same order, the same SwiGLU kernel (calls that the unfused module leaves
to MLX, the small ones, still go the unfused way).

`install_mlps` puts one in place of each layer's MLP whose class computes exactly that
(llama, qwen2 and qwen3 families) and whose projections are all `GGUFLinear`.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..host.blas import import_mlx
from ..kernels import cpu_ops as cpu_kernels
from ..kernels.paths import PATHS
from .qlinear import GGUFLinear, _as_numpy, _shared_activations, _threads

mx = import_mlx()
import mlx.nn as nn  # noqa: E402  (after import_mlx, which binds the BLAS first)

# mlx-lm modules whose `MLP.__call__` is `down_proj(swiglu(gate_proj(x), up_proj(x)))`
SWIGLU_MLP_MODULES = ("mlx_lm.models.llama", "mlx_lm.models.qwen2", "mlx_lm.models.qwen3")

_local = threading.local()

# The most a slot's scratch keeps between calls: a product larger than this (more than
# 1,170 rows of a 1.5B's 8960-wide MLP) gets a fresh array, as in the unfused module, so a
# long prompt leaves at most 3 x 40 MiB per thread behind. It holds a long prompt's
# 1,024-token pieces (`passes.pass_cache.PIECE_TOKENS`) of a 1.5B: a fresh 35 MiB array
# per product is zeroed page by page on every layer (a warm 1k-token decision: 3,541 ms
# at 32 MiB against 3,254 at 40, 6 interleaved pairs, Zen 5).
RETAIN_BYTES = 40 << 20


def _buffer(slot: str, shape: tuple[int, int]) -> np.ndarray:
    """This thread's reused float32 scratch for `slot`, at least `shape`'s size (a fresh
    array above `RETAIN_BYTES`)."""
    size = shape[0] * shape[1]
    if size * 4 > RETAIN_BYTES:
        return np.empty(shape, np.float32)
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    buf = bufs.get(slot)
    if buf is None or buf.size < size:
        buf = bufs[slot] = np.empty(size, np.float32)
    return buf[:size].reshape(shape)


class GGUFMLP(nn.Module):
    """``down(swiglu(gate(x), up(x)))`` over `GGUFLinear` projections, in numpy.

    Args:
        mlp: The mlx-lm MLP it replaces (its projections are kept, under the same names,
            so parameter paths and readers of ``layer.mlp.gate_proj`` are unchanged).
    """

    def __init__(self, mlp: Any):
        super().__init__()
        self.gate_proj = mlp.gate_proj
        self.up_proj = mlp.up_proj
        self.down_proj = mlp.down_proj
        self._unfused = type(mlp).__call__

    def __call__(self, x: Any) -> Any:
        gate: GGUFLinear = self.gate_proj
        up: GGUFLinear = self.up_proj
        down: GGUFLinear = self.down_proj
        n = gate.weight.shape[0]
        rows = 1
        for dim in x.shape[:-1]:
            rows *= int(dim)
        lib = cpu_kernels._native if cpu_kernels._on() else None
        # the unfused module sends small SwiGLU calls (and everything without the native
        # kernels, or off float32) to MLX: keep those numbers by taking its path
        if (
            lib is None
            or x.dtype != mx.float32
            or cpu_kernels._small(rows * n, cpu_kernels.MIN_GATE)
        ):
            return self._unfused(self, x)
        lead = x.shape[:-1]
        threads = _threads()
        xn = _as_numpy(x).reshape(rows, x.shape[-1])
        # gate and up read the same x: one quantization where their int8 blocks agree
        acts = _shared_activations(x, xn, gate.weight, threads)
        g = gate.weight.matmul(xn, threads, gate.numpy_bias(), _buffer("gate", (rows, n)), acts)
        acts = _shared_activations(x, xn, up.weight, threads)
        u = up.weight.matmul(xn, threads, up.numpy_bias(), _buffer("up", (rows, n)), acts)
        h = _buffer("swiglu", (rows, n))
        if lib.pcd_swiglu(
            g.ctypes.data, u.ctypes.data, h.ctypes.data, g.size, threads, PATHS["auto"]
        ):
            raise RuntimeError("the native SwiGLU kernel failed")
        y = down.weight.matmul(h, threads, down.numpy_bias())
        return mx.array(y).reshape(*lead, down.weight.shape[0])


def install_mlps(model: Any) -> int:
    """Replace each layer's SwiGLU MLP over `GGUFLinear` projections by a `GGUFMLP`;
    returns how many were replaced."""
    inner = getattr(model, "model", model)
    count = 0
    for layer in getattr(inner, "layers", None) or []:
        mlp = getattr(layer, "mlp", None)
        if (
            mlp is None
            or type(mlp).__name__ != "MLP"
            or type(mlp).__module__ not in SWIGLU_MLP_MODULES
            or not all(
                isinstance(getattr(mlp, name, None), GGUFLinear)
                for name in ("gate_proj", "up_proj", "down_proj")
            )
        ):
            continue
        layer.mlp = GGUFMLP(mlp)
        count += 1
    return count
