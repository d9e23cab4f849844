"""`pcd models --doctor`: what this machine runs, gathered in one place.

The device and MLX, the BLAS bound into MLX and its measured rate, the native CPU
kernels, the compute modes a GGUF file can run in, the int8 kernel and its measured peak, what decodes
generated fields (`decode_status`), the CPU budget, and every slower path taken with its
reason (`fallbacks`: the native libraries that fell back in this process, and those the
doctor found off).
"""

from __future__ import annotations

import os
import platform
from typing import Any

from ..errors import InvalidArgumentError, NativeBuildError
from .decode.native_steps import check_decode
from .decode.parts import check_weights
from .host.blas import blas_status, device_info
from .host.build import cache_dir, fallbacks
from .host.cpus import busy, cpu_budget
from .host.threads import decode_threads
from .kernels import qgemm
from .kernels.bindings import cpu_kernels_library, load_decode_kernels
from .kernels.paths import decode_isa, path_name
from .kernels.peak import int8_peak

__all__ = ["decode_status", "doctor"]


def doctor() -> dict[str, Any]:
    """Everything `pcd models --doctor` prints: device, mlx, BLAS, the native CPU kernels
    (`on (...)` or `off: why`), the compute modes, what decodes generated fields, the
    slower paths taken and why (`fallbacks`), the cache, Python."""
    info, dev = blas_status(), device_info()
    kernels = cpu_kernels_library()[1] if dev.device == "cpu" else "off: not a CPU device"
    modes, int8 = _compute_modes(dev.device)
    out: dict[str, Any] = {
        "device": dev.device,
        "default_dtype": dev.default_dtype,
        "cpu_count": dev.cpu_count,
        "cpu_budget": _budget_text(),
        "mlx_version": dev.mlx_version,
        "blas": info.name,
        "blas_path": info.path,
        "blas_gflops": None if info.gflops is None else round(info.gflops, 1),
        "blas_fast": info.fast,
        "blas_bound_before_import": info.bound_before_import,
        "blas_note": info.note,
        "native_kernels": kernels,
        "compute_modes": modes,
        "int8_kernel": int8,
        "prefill_kernel": _prefill_kernel(dev.device),
        "attention_scores": _attention_scores(dev.device),
        "int8_peak": _peak_text(dev.device),
        "compute_auto": (
            f"int8 for a K-quant GGUF kept encoded, or any kept encoded with 256 MiB of "
            f"matrices or more (the {int8} kernels), else float32"
            if int8 in ("avx512vnni", "avx2", "avxvnni")
            else "float32"
            if dev.device == "cpu"
            else "mlx"
        ),
        "cache_dir": str(cache_dir()),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "decode": decode_status(),
    }
    out["fallbacks"] = _fallbacks(out, fallbacks()) or "none"
    return out


def _peak_text(device: str) -> str:
    """The measured int8 peak (`kernels.peak`), the ceiling of a prefill's int8 products."""
    if device != "cpu":
        return "not measured: not a CPU device"
    try:
        peak = int8_peak()
    except NativeBuildError as e:
        return f"not measured: {e}"
    if peak is None:
        return "not measured: the int8 kernels run portable C here"
    if peak.path != "amx":
        return peak.text()
    vnni = int8_peak(path="avx512vnni")
    return peak.text() + ("" if vnni is None else f"; {vnni.text()}")


def _prefill_kernel(device: str) -> str:
    """The kernel of a prefill's int8 products on K-quant weights (activations per 256)."""
    if device != "cpu":
        return "off: not a CPU device (MLX's own kernels)"
    try:
        col = qgemm.column_path()
    except (NativeBuildError, OSError) as e:
        return f"off: {e}"
    return {
        "amx-cols": "amx-cols: AMX tiles for every 16 rows (PCD_AMX=0 turns them off), "
        "AVX-512 VNNI for the rest; the same bits",
        "avx512vnni-cols": "avx512vnni-cols: AVX-512 VNNI across output columns",
        "scalar-cols": "scalar-cols: portable C",
        "none": f"{qgemm.isa()} row panels (no AVX-512 VNNI)",
    }[col]


def _attention_scores(device: str) -> str:
    """What attention's scores multiply in, on the native kernels (`cpu_ops.active`)."""
    if device != "cpu":
        return "off: not a CPU device (MLX's own kernels)"
    lib, note = cpu_kernels_library()
    if not lib:
        return f"off: {note}"
    f32 = f"float32 ({path_name(int(lib.pcd_cpu_kernels_path(0)))})"
    from .kernels.cpu_ops import bf16_scores_run

    if bf16_scores_run():
        return (
            f"amx-bf16 where the matrices compute in int8 or bf16 (PCD_AMX=0 turns them "
            f"off), else {f32}"
        )
    return f32


def _budget_text() -> str:
    b = cpu_budget()
    quota = "none" if b.quota is None else f"{b.quota:g} CPUs"
    load = busy(b.cpus)[1]
    return (
        f"{b.cpus} threads ({b.source}; affinity {b.affinity}, cgroup quota {quota}); "
        f"load average {load:.1f}"
    )


def _compute_modes(device: str) -> tuple[list[str], str]:
    """The `compute=` modes this machine runs on a GGUF file, and the int8 kernel the CPU
    picks (`pcd_tools.engine.kernels.qgemm`), or why there is none."""
    if device != "cpu":
        return ["mlx"], "off: not a CPU device (MLX's own kernels)"
    try:
        return ["float32", *qgemm.available_modes()], qgemm.isa()
    except (NativeBuildError, OSError) as e:
        return ["float32"], f"off: {e}"


def decode_status() -> str:
    """What decodes generated fields here, for `pcd models --doctor`: the mode
    (`$PCD_DECODE`, else "auto") and whether `_decode.c` builds and loads, with its ISA
    path and threads; on failure, what runs instead and why."""
    try:
        mode = check_decode(None)
        weights = check_weights(None)
    except InvalidArgumentError as e:
        return f"error: {e}"
    if mode == "mlx":
        return "mlx: MLX float32 steps (PCD_DECODE=mlx)"
    try:
        lib = load_decode_kernels()
        path = int(lib.pcd_decode_path(decode_isa()))
    except (NativeBuildError, InvalidArgumentError) as e:
        if mode == "int8":
            return f"int8: unavailable, decode='int8' raises DecodeUnavailableError: {e}"
        return f"auto: MLX float32 steps (native int8 decode unavailable: {e})"
    if not path:
        return f"{mode}: the ISA PCD_DECODE_ISA={os.environ.get('PCD_DECODE_ISA')!r} is not on this CPU"
    name = {"avx512": "AVX-512", "avx2": "AVX2+FMA", "scalar": "portable C"}[path_name(path)]
    reads = {
        "auto": "a GGUF kept encoded read from its file blocks with 8-bit activations where "
        "it computes in int8, or when an 8-bit copy would need over a quarter of the "
        "available memory; else the copy",
        "file": "a GGUF kept encoded read from its file blocks",
        "copy": "an 8-bit copy of the weights",
    }[weights]
    return (
        f"{mode}: native int8 steps ({name}, {decode_threads()} threads) on CPU engines "
        f"of llama / qwen2 models, weights={weights}: {reads}; MLX float32 steps elsewhere"
    )


def _fallbacks(doc: dict[str, Any], recorded: dict[str, str]) -> dict[str, str]:
    """Each slower path this machine takes, and why: the libraries that fell back in
    this process (`native.fallbacks`, each warned once) and those the doctor found off."""
    out = dict(recorded)
    blas = doc.get("blas")
    if doc.get("blas_bound_before_import") is False and blas not in ("accelerate", "n/a (gpu)"):
        # A bound BLAS that timed slow on a busy machine is not a fallback; this is.
        out["BLAS"] = f"MLX's own {blas} BLAS ({doc.get('blas_gflops')} GFLOP/s)"
    kernels = str(doc.get("native_kernels", ""))
    if kernels.startswith("off"):
        out.setdefault("_cpu_kernels.c (native CPU kernels)", kernels)
    decode = str(doc["decode"])
    if not decode.startswith(("mlx:", "error:")) and "native int8 steps" not in decode:
        out.setdefault("_decode.c (native int8 decode)", decode)
    return out
