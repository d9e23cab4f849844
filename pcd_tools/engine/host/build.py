"""Native code built on this machine: the compile cache, and the CPU kernels library.

`compile_c` builds a C file into a shared library once per source, flags and machine, in
the pcd-tools cache. `load_cpu_kernels` builds `_cpu_kernels.c` that way and loads it
with its C signatures declared; `cpu_kernels` dispatches to it and `platform.doctor`
reports on it. `load_decode_kernels` does the same for `_decode.c`, the native int8
decode step that `fast_decode` drives. This module imports neither mlx nor the other engine modules, so both can
use it.

Every failure to get a library (a source missing from the install, no compiler, an
unwritable cache, a failed compile or load) is a `NativeBuildError`. Where a slower path
exists (the CPU kernels, `decode="auto"`), the caller falls back through `fall_back`, which
warns once per library and process (`NativeFallbackWarning`) and records the reason for
`pcd models --doctor` (`fallbacks`).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

from pcd_tools.errors import NativeBuildError

__all__ = [
    "DecodeLayer",
    "DecodeLin",
    "DecodeModel",
    "DecodeRow",
    "NativeFallbackWarning",
    "cache_dir",
    "compile_c",
    "fall_back",
    "fallbacks",
    "load_cpu_kernels",
    "load_decode_kernels",
]

_KERNELS_SOURCE = Path(__file__).parents[1] / "kernels" / "_cpu_kernels.c"
_DECODE_SOURCE = Path(__file__).parents[1] / "kernels" / "_decode.c"
_FALLBACKS: dict[str, str] = {}  # library -> why it fell back, in this process
_FALLBACK_LOCK = threading.Lock()


class NativeFallbackWarning(UserWarning):
    """A native library could not be built or loaded, so a slower path (numpy or MLX) runs."""


def fall_back(library: str, instead: str, exc: BaseException) -> None:
    """Record that `library` is unavailable and warn about it once per process.

    Args:
        library: The native library, e.g. `"_decode.c (native int8 decode)"`.
        instead: What runs instead, e.g. `"generated fields decode through MLX"`.
        exc: Why (usually a `NativeBuildError`).
    """
    with _FALLBACK_LOCK:
        first = library not in _FALLBACKS
        _FALLBACKS[library] = f"{exc}; {instead}"
    if first:
        warnings.warn(
            NativeFallbackWarning(
                f"pcd-tools: {library} is unavailable, so {instead} (slower, same results "
                f"within float32 rounding): {exc}. `pcd models --doctor` shows what was found."
            ),
            stacklevel=3,
        )


def fallbacks() -> dict[str, str]:
    """The native libraries that fell back in this process, and why (for the doctor)."""
    with _FALLBACK_LOCK:
        return dict(_FALLBACKS)


def cache_dir() -> Path:
    """Return `$PCD_CACHE_DIR`, else `$XDG_CACHE_HOME/pcd-tools`, else `~/.cache/pcd-tools`."""
    if os.environ.get("PCD_CACHE_DIR"):
        return Path(os.environ["PCD_CACHE_DIR"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "pcd-tools"
    return Path.home() / ".cache" / "pcd-tools"


def compile_c(
    source: Path,
    name: str,
    flags: tuple[str, ...] = (),
    libs: tuple[str, ...] = (),
    subdir: str = "native",
) -> tuple[Path, str]:
    """Compile a C file into a shared library in the cache once (atomically).

    The cached file is keyed by the source, the flags and the machine, so an edited
    source or another architecture gets its own build.

    Args:
        source: The C file.
        name: Stem of the cached library (`<cache>/<subdir>/<name>-<digest>.so`).
        flags: Extra compiler flags.
        libs: Libraries to link, as `-l` arguments.
        subdir: Folder under the cache directory.

    Returns:
        The library's path and a note saying whether it was compiled or reused.

    Raises:
        NativeBuildError: A missing source, no C compiler, an unwritable cache, or a
            failed compile.
    """
    try:
        text = source.read_bytes()
    except OSError as exc:
        raise NativeBuildError(
            f"the C source {source.name} is missing from {source.parent} ({exc.strerror}): "
            "this install of pcd-tools lacks its native sources; reinstall it from a wheel "
            "built with the package data `engine/*.c`"
        ) from exc
    key = text + "\0".join([*flags, *libs, platform.machine()]).encode()
    digest = hashlib.sha256(key).hexdigest()[:16]
    out = cache_dir() / subdir / f"{name}-{digest}.so"
    if out.exists():
        return out, f"reused cached {name} {out}"
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise NativeBuildError(f"no C compiler (cc/gcc) on PATH, so {source.name} cannot be built")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so.tmp", dir=out.parent)
        os.close(fd)
    except OSError as exc:
        raise NativeBuildError(
            f"cannot write {source.name}'s build under {out.parent}: {exc}"
        ) from exc
    try:
        cmd = [cc, "-O2", *flags, "-shared", "-fPIC", str(source), "-o", tmp, *libs]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            err = proc.stderr.strip()[-300:]
            raise NativeBuildError(f"compiling {source.name} with {cc} failed: {err}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)  # atomic: a concurrent process sees no or a whole library
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeBuildError(f"compiling {source.name} with {cc} failed: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out, f"compiled {name} {out}"


def load_cpu_kernels(fast_blas: bool) -> tuple[Any, str]:
    """Build (once, on disk) and load `_cpu_kernels.c`, its functions declared.

    Args:
        fast_blas: Whether a fast BLAS was bound before mlx (`platform.sgemm_address()`).
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
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            raise NativeBuildError(f"cannot load {path}: {exc}") from exc
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
    # path, q, nparts, ks, vs, lens, out, strides, mask, m_sb, mask_from, b, h, kh, lq, d,
    # scale, causal, block, threads
    lib.pcd_attention_parts.argtypes = [i32, p, i32, p, p, p, p, p, p, i64, *[i32] * 6]
    lib.pcd_attention_parts.argtypes += [ctypes.c_float, i32, i32, i32]
    lib.pcd_attention_parts.restype = i32
    lib.pcd_attention_simd_width.restype = i32
    lib.pcd_swiglu.argtypes = [p, p, p, i64, i32, i32]
    lib.pcd_swiglu.restype = i32
    lib.pcd_softmax_row.argtypes = [i32, p, p, i32, i32]
    lib.pcd_softmax_row.restype = ctypes.c_float
    lib.pcd_rope.argtypes = [p, p, p, p, p, p, *[i32] * 7]
    lib.pcd_rope.restype = i32
    return lib, f"on ({lib.pcd_attention_simd_width()}-bit softmax): {note}"


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
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise NativeBuildError(f"cannot load {path}: {exc}") from exc
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


# --- the structures of `_decode.c` (same order and types) ---------------------------------


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
