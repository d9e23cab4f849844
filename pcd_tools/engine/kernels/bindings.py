"""The engine's C libraries, loaded with their C signatures declared: one module for all.

Each C source is spelled once, here, and built once per machine into the cache by
`host.build.compile_c`; each loader below loads its library with ctypes and declares the
argument and result types of every function the engine calls (and, for `_decode.c`, the
`Decode*` Structures that mirror its C structs field for field).

- `load_cpu_kernels` / `cpu_kernels_library`: `_cpu_kernels.c` (exact attention, SwiGLU,
  RoPE for MLX's CPU backend). A failure falls back (`build.fall_back` warns once) and
  answers False with a note; the second caches the answer for the process.
- `load_decode_kernels`: `_decode.c` (the native decode steps); a failure raises
  `NativeBuildError` (the caller decides whether `decode="auto"` falls back).
- `qgemm_library`: `_qgemm.c` (`x @ W^T` over GGUF blocks), cached for the process; a
  failure raises `NativeBuildError` (and is retried on the next call).
- `qweights_library`: `_qweights.c` (GGUF dequantization and the float32 product over a
  scratch), cached for the process, None on failure and `qweights_error()` says why.

The BLAS shim (`host/_blas_shim.c`) stays with `host/blas.py`, which binds it before mlx
is imported.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Any

from pcd_tools.errors import NativeBuildError

from ..host.blas import sgemm_address
from ..host.build import compile_c, fall_back

__all__ = [
    "DecodeLayer",
    "DecodeLin",
    "DecodeModel",
    "DecodeRow",
    "cpu_kernels_library",
    "load_cpu_kernels",
    "load_decode_kernels",
    "qgemm_library",
    "qweights_error",
    "qweights_library",
]

_KERNELS_SOURCE = Path(__file__).with_name("_cpu_kernels.c")
_DECODE_SOURCE = Path(__file__).with_name("_decode.c")
_QGEMM_SOURCE = Path(__file__).with_name("_qgemm.c")
_QWEIGHTS_SOURCE = Path(__file__).with_name("_qweights.c")


def _load(path: Path) -> Any:
    """`ctypes.CDLL(path)`, a failure to load being a `NativeBuildError`."""
    try:
        return ctypes.CDLL(str(path))
    except OSError as exc:
        raise NativeBuildError(f"cannot load {path}: {exc}") from exc


# --- _cpu_kernels.c -------------------------------------------------------------------

_kernels_lock = threading.Lock()
_kernels_lib: tuple[Any, str] | None = None


def load_cpu_kernels(fast_blas: bool) -> tuple[Any, str]:
    """Build (once, on disk) and load `_cpu_kernels.c`, its functions declared.

    Args:
        fast_blas: Whether a fast BLAS was bound before mlx (`blas.sgemm_address()`).
            The kernels call no BLAS, but they are used only beside one: without it MLX's
            own matrix products are the bottleneck, and where the platform BLAS is MLX's
            (Accelerate) MLX's attention is the better partner.

    Returns:
        The ctypes library, or False where `PCD_NATIVE_ATTENTION=0`, there is no fast
        BLAS, or the library cannot be built or loaded (then `fall_back` warns once); and
        a note (`on (...)` or `off: why`).
    """
    if os.environ.get("PCD_NATIVE_ATTENTION", "1") == "0":
        return False, "off: PCD_NATIVE_ATTENTION=0"
    if not fast_blas:
        return False, "off: no fast BLAS was bound before mlx was imported"
    try:
        path, note = compile_c(
            _KERNELS_SOURCE, "cpu_kernels", flags=("-O3", "-fno-math-errno"), libs=("-lpthread",)
        )
        lib = _load(path)
    except NativeBuildError as exc:
        fall_back(
            "_cpu_kernels.c (native CPU kernels)",
            "the softmax and SiLU run in numpy and RoPE in MLX",
            exc,
        )
        return False, f"off: {exc}"
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.pcd_attention.argtypes = [p, p, p, p, p, p, i64, *[i32] * 6, ctypes.c_float]
    lib.pcd_attention.argtypes += [i32, i32, i32]
    lib.pcd_attention.restype = i32
    lib.pcd_attention_path.argtypes = [i32, *lib.pcd_attention.argtypes]
    lib.pcd_attention_path.restype = i32
    # path, q, k, v, k2, v2, s1, out, strides, mask, m_sb, b, h, kh, lq, s, d, scale, block, threads
    lib.pcd_attention_split.argtypes = [i32, p, p, p, p, p, i32, p, p, p, i64, *[i32] * 6]
    lib.pcd_attention_split.argtypes += [ctypes.c_float, i32, i32]
    lib.pcd_attention_split.restype = i32
    # path, q, nparts, ks, vs, lens, out, strides, mask, m_sb, mask_from, row_end, re_sb,
    # b, h, kh, lq, d, scale, causal, block, threads
    lib.pcd_attention_parts.argtypes = [i32, p, i32, p, p, p, p, p, p, i64, i32, p, i64]
    lib.pcd_attention_parts.argtypes += [*[i32] * 5]
    lib.pcd_attention_parts.argtypes += [ctypes.c_float, i32, i32, i32]
    lib.pcd_attention_parts.restype = i32
    lib.pcd_attention_simd_width.restype = i32
    lib.pcd_cpu_kernels_path.argtypes = [i32]
    lib.pcd_cpu_kernels_path.restype = i32
    lib.pcd_swiglu.argtypes = [p, p, p, i64, i32, i32]
    lib.pcd_swiglu.restype = i32
    lib.pcd_softmax_row.argtypes = [i32, p, p, i32, i32]
    lib.pcd_softmax_row.restype = ctypes.c_float
    lib.pcd_rope.argtypes = [p, p, p, p, p, p, *[i32] * 7]
    lib.pcd_rope.restype = i32
    return lib, f"on ({lib.pcd_attention_simd_width()}-bit softmax): {note}"


def cpu_kernels_library() -> tuple[Any, str]:
    """The native CPU kernels beside the bound BLAS, loaded once per process.

    Returns:
        `load_cpu_kernels`'s answer: the ctypes library or False, and a note
        (`on (...)` or `off: why`).
    """
    global _kernels_lib
    with _kernels_lock:
        if _kernels_lib is None:
            _kernels_lib = load_cpu_kernels(sgemm_address() is not None)
        return _kernels_lib


# --- _decode.c ------------------------------------------------------------------------


def load_decode_kernels() -> Any:
    """Build (once, on disk) and load `_decode.c`, its functions declared.

    Returns:
        The ctypes library.

    Raises:
        NativeBuildError: A missing source, no C compiler, an unwritable cache, a failed
            compile, or a library that does not load.
    """
    path, _ = compile_c(
        _DECODE_SOURCE, "decode", flags=("-O3", "-fno-math-errno"), libs=("-lpthread", "-lm")
    )
    lib = _load(path)
    p, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    lib.pcd_decode_path.argtypes = [i32]
    lib.pcd_decode_path.restype = i32
    lib.pcd_pool_new.argtypes = [i32, i32]
    lib.pcd_pool_new.restype = p
    lib.pcd_pool_threads.argtypes = [p]
    lib.pcd_pool_threads.restype = i32
    lib.pcd_pool_free.argtypes = [p]
    lib.pcd_pool_free.restype = None
    lib.pcd_decode_step.argtypes = [p, p, p, i32, p, i32, i32]
    lib.pcd_decode_step.restype = i32
    lib.pcd_quantize_q8.argtypes = [p, i64, i64, p, p, p, i32, i32]
    lib.pcd_quantize_q8.restype = None
    lib.pcd_decode_file_block.argtypes = [i32]
    lib.pcd_decode_file_block.restype = i32
    lib.pcd_decode_dequant_rows.argtypes = [p, p, i32, p]
    lib.pcd_decode_dequant_rows.restype = i32
    lib.pcd_decode_matvec.argtypes = [p, p, i32, p, i32]
    lib.pcd_decode_matvec.restype = i32
    lib.pcd_decode_matvec8.argtypes = [p, p, i32, p, i32, i32]
    lib.pcd_decode_matvec8.restype = i32
    lib.pcd_decode_quantize_act.argtypes = [p, i32, i32, i32, p, p, p]
    lib.pcd_decode_quantize_act.restype = i32
    return lib


class DecodeLin(ctypes.Structure):
    """`pcd_lin_t`: one matrix (file blocks, 8-bit or float32), its bias and row order."""

    _fields_ = [
        ("w", ctypes.c_void_p),
        ("s", ctypes.c_void_p),
        ("mn", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("order", ctypes.c_void_p),
        ("row_bytes", ctypes.c_int64),
        ("rows", ctypes.c_int32),
        ("cols", ctypes.c_int32),
        ("type", ctypes.c_int32),
        ("pad", ctypes.c_int32),
    ]


class DecodeLayer(ctypes.Structure):
    """`pcd_layer_t`: a transformer layer's norms and matrices."""

    _fields_ = [
        ("attn_norm", ctypes.c_void_p),
        ("mlp_norm", ctypes.c_void_p),
        *[(n, DecodeLin) for n in ("q", "k", "v", "o", "gate", "up", "down")],
    ]


class DecodeModel(ctypes.Structure):
    """`pcd_model_t`: the shapes, the layers, the head and the RoPE tables."""

    _fields_ = [
        *[
            (n, ctypes.c_int32)
            for n in [
                "n_layers",
                "hidden",
                "n_heads",
                "n_kv_heads",
                "head_dim",
                "inter",
                "vocab",
                "wbits",
                "rope_traditional",
                "rope_dims",
                "rope_len",
                "act8",
            ]
        ],
        ("eps", ctypes.c_float),
        ("attn_scale", ctypes.c_float),
        ("embed", ctypes.c_void_p),
        ("final_norm", ctypes.c_void_p),
        ("rope_cos", ctypes.c_void_p),
        ("rope_sin", ctypes.c_void_p),
        ("layers", ctypes.c_void_p),
        ("head", DecodeLin),
        ("embed_q", DecodeLin),
    ]


class DecodeRow(ctypes.Structure):
    """`pcd_row_t`: one sequence of a step: its token, positions and K/V."""

    _fields_ = [
        ("token", ctypes.c_int32),
        ("n_prefix", ctypes.c_int32),
        ("n_new", ctypes.c_int32),
        ("cap", ctypes.c_int32),
        ("pk", ctypes.c_void_p),
        ("pv", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("nk", ctypes.c_void_p),
        ("nv", ctypes.c_void_p),
    ]


# --- _qgemm.c -------------------------------------------------------------------------

_qgemm_lock = threading.Lock()
_qgemm_lib: Any = None


def qgemm_library() -> Any:
    """Build (once, in the cache) and load `_qgemm.c`, its functions declared.

    Raises:
        NativeBuildError: No C compiler, a failed compile, or a library that does not load.
    """
    global _qgemm_lib
    with _qgemm_lock:
        if _qgemm_lib is not None:
            return _qgemm_lib
        path, _ = compile_c(
            _QGEMM_SOURCE,
            "qgemm",
            flags=("-O3", "-fno-math-errno", "-ffp-contract=off"),
            libs=("-lpthread", "-lm"),
        )
        lib = _load(path)
        p, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
        lib.pcd_qgemm_block.argtypes = [i32, p]
        lib.pcd_qgemm_block.restype = i32
        lib.pcd_qgemm_has_path.argtypes = [i32]
        lib.pcd_qgemm_has_path.restype = i32
        lib.pcd_qgemm_kc_path.argtypes = [i32]
        lib.pcd_qgemm_kc_path.restype = i32
        lib.pcd_int8_peak.argtypes = [i32, i64, i32, p]
        lib.pcd_int8_peak.restype = i64
        lib.pcd_int8_peak_path.argtypes = [i32]
        lib.pcd_int8_peak_path.restype = i32
        lib.pcd_qgemm_quantize.argtypes = [p, i64, i32, i32, p, p, p, i32]
        lib.pcd_qgemm_quantize.restype = i32
        lib.pcd_qgemm_int8.argtypes = [i32, p, i32, i32, p, p, p, i32, p, i64, i32, i32]
        lib.pcd_qgemm_int8.restype = i32
        lib.pcd_qgemm_bf16.argtypes = [i32, p, i32, i32, p, i64, i32, p, i64, i32]
        lib.pcd_qgemm_bf16.restype = i32
        lib.pcd_qgemm_quantize_k.argtypes = [p, i64, i32, i32, p, p, p, i32]
        lib.pcd_qgemm_quantize_k.restype = i32
        lib.pcd_qgemm_quantize_path.argtypes = [p, i64, i32, i32, p, p, p, i32, i32]
        lib.pcd_qgemm_quantize_path.restype = i32
        lib.pcd_qgemm_quantize_k_path.argtypes = [p, i64, i32, i32, p, p, p, i32, i32]
        lib.pcd_qgemm_quantize_k_path.restype = i32
        lib.pcd_qgemm_int8_k.argtypes = [i32, p, i32, i32, p, p, p, i32, p, i64, i32, i32]
        lib.pcd_qgemm_int8_k.restype = i32
        lib.pcd_qgemm_int8_kc.argtypes = [i32, p, i32, i32, p, p, p, i32, p, i64, i32, i32]
        lib.pcd_qgemm_int8_kc.restype = i32
        lib.pcd_qgemm_dequantize.argtypes = [i32, p, i64, i32, i32, i32, p]
        lib.pcd_qgemm_dequantize.restype = None
        _qgemm_lib = lib
        return lib


# --- _qweights.c ----------------------------------------------------------------------

_qweights_lock = threading.Lock()
_qweights_lib: Any = None
_qweights_why = ""


def qweights_library() -> Any:
    """The loaded `_qweights.c` library (built once into the cache), or None.

    Returns None when there is no working C compiler; `qweights_error()` says why.
    """
    global _qweights_lib, _qweights_why
    with _qweights_lock:
        if _qweights_lib is None:
            try:
                path, _ = compile_c(
                    _QWEIGHTS_SOURCE,
                    "qweights",
                    flags=("-O3", "-ffp-contract=off", "-fno-math-errno"),
                    libs=("-lpthread",),
                )
                lib = ctypes.CDLL(str(path))
            except (NativeBuildError, OSError) as exc:
                _qweights_lib, _qweights_why = False, str(exc)
            else:
                p, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
                lib.pcd_q_dequant_rows.argtypes = [i32, p, i64, i64, p, i64, i64, p, i32, i32]
                lib.pcd_q_dequant_rows.restype = i32
                lib.pcd_q_matmul.argtypes = [p, i32, p, i64, p, i64, i64, p, i64, p, i64, i64]
                lib.pcd_q_matmul.argtypes += [p, i32, p, i32]
                lib.pcd_q_matmul.restype = i32
                lib.pcd_q_path.argtypes = [i32]
                lib.pcd_q_path.restype = i32
                _qweights_lib = lib
        return _qweights_lib or None


def qweights_error() -> str:
    """Why `qweights_library()` answered None ("" before a failure)."""
    return _qweights_why
