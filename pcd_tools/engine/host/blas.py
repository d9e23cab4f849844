"""Platform setup: bind a fast BLAS into MLX on Linux CPU, and describe the device.

The `mlx[cpu]` wheel links netlib reference BLAS (about 6 GFLOP/s). Loading a real BLAS
with `RTLD_GLOBAL` *before* `mlx.core` is imported makes libmlx resolve `cblas_sgemm` to
it (300+ GFLOP/s); after the import it has no effect. So the engine imports mlx only
through `import_mlx()`, which calls `setup_blas()` first. This module never imports mlx
at top level.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import platform
import site
import sys
import sysconfig
import threading
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pcd_tools.errors import BlasSetupError, NativeBuildError

from . import openblas_core
from .build import cache_dir, compile_c

__all__ = [
    "BlasInfo",
    "DeviceInfo",
    "PcdPerformanceWarning",
    "blas_status",
    "cache_dir",
    "compile_c",
    "device_info",
    "ensure_fast_path",
    "import_mlx",
    "measure_gflops",
    "set_blas_threads",
    "setup_blas",
    "sgemm_address",
    "slow_blas_message",
]

FAST_GFLOPS = 50.0
OPENBLAS_THREAD_TIMEOUT = 4  # log2 of the cycles an idle OpenBLAS thread spins
_SHIM_SOURCE = Path(__file__).with_name("_blas_shim.c")
_FIX = (
    "Fix: `pip install scipy-openblas32` with a C compiler (cc/gcc) on PATH, or "
    "`apt-get install libopenblas0-pthread`, or set PCD_BLAS=/path/to/libopenblas.so; "
    "then restart Python (the BLAS must be bound before mlx is imported)."
)


class PcdPerformanceWarning(UserWarning):
    """MLX runs on a slow code path (for example reference BLAS on Linux CPU)."""


@dataclass(frozen=True)
class BlasInfo:
    """Which BLAS MLX's CPU matmuls go through.

    Args:
        name: Source, e.g. "scipy-openblas32 (shim)", "openblas (system)", "mkl",
            "reference", "accelerate", "n/a (gpu)".
        path: Library bound in, if any.
        fast: Measured GFLOP/s >= 50, or macOS Accelerate.
        gflops: Measured float32 GEMM speed through mlx; None until measured.
        bound_before_import: A library was bound in before `mlx.core` was imported.
        note: What happened, and how to fix it when slow.
    """

    name: str
    path: str | None
    fast: bool
    gflops: float | None
    bound_before_import: bool
    note: str


@dataclass(frozen=True)
class DeviceInfo:
    """The device MLX computes on.

    Args:
        device: "cpu", "metal" or "cuda".
        default_dtype: "float32" on CPU (half precision is scalar there); "keep" on GPU.
        cpu_count: CPU cores this process may use.
        mlx_version: `mlx.core.__version__`.
    """

    device: str
    default_dtype: str
    cpu_count: int
    mlx_version: str


_lock = threading.RLock()
_info: BlasInfo | None = None
_measured: BlasInfo | None = None
_set_threads: Any = None  # ctypes function taking one int, if the bound BLAS has one
_warned = False


def _sgemm_owner() -> str | None:
    """Return the file that provides `cblas_sgemm` in the global symbol scope, if any."""
    try:
        addr = ctypes.cast(ctypes.CDLL(None).cblas_sgemm, ctypes.c_void_p)
    except AttributeError:
        return None
    info = (ctypes.c_void_p * 4)()  # Dl_info: fname, fbase, sname, saddr
    for lib in (None, "libdl.so.2"):  # dladdr moved into libc in glibc 2.34
        dladdr = getattr(ctypes.CDLL(lib), "dladdr", None)
        if dladdr is not None and dladdr(addr, info) and info[0]:
            return os.fsdecode(ctypes.string_at(info[0]))
    return "<unknown>"


def _unique(paths: list[str]) -> list[str]:
    """`paths` without the ones that resolve to a library already listed (symlinks)."""
    seen: set[str] = set()
    out = []
    for p in paths:
        real = os.path.realpath(p)
        if real not in seen:
            seen.add(real)
            out.append(p)
    return out


def _candidates() -> list[tuple[str, str]]:
    """List (name, path) of BLAS libraries to try, in order of preference."""
    arch = sysconfig.get_config_var("MULTIARCH") or f"{platform.machine()}-linux-gnu"
    system = [
        f"/usr/lib/{arch}/openblas-pthread/libopenblas.so.0",
        f"/usr/lib/{arch}/openblas-openmp/libopenblas.so.0",
        f"/usr/lib/{arch}/libopenblas.so.0",
        "/usr/lib64/libopenblasp.so.0",
        "/usr/lib64/libopenblas.so.0",
        "/usr/lib64/libopenblaso.so.0",
    ]
    found = [("openblas (system)", p) for p in _unique(system) if os.path.exists(p)]
    if not found and (lib := ctypes.util.find_library("openblas")):
        found.append(("openblas (system)", lib))
    prefixes = dict.fromkeys([sys.prefix, site.USER_BASE or sys.prefix])
    found += [
        ("mkl", f"{p}/lib/libmkl_rt.so.2")
        for p in prefixes
        if os.path.exists(f"{p}/lib/libmkl_rt.so.2")
    ]
    for sp in dict.fromkeys([*site.getsitepackages(), sysconfig.get_paths()["purelib"]]):
        if os.path.exists(lib := f"{sp}/cmeel.prefix/lib/libopenblas.so.0"):
            found.append(("cmeel-openblas", lib))
    spec = importlib.util.find_spec("scipy_openblas32")  # locates it without importing it
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if os.path.exists(lib := f"{loc}/lib/libscipy_openblas.so"):
            found.append(("scipy-openblas32 (shim)", lib))
    return found


def _build_shim() -> tuple[Path, str]:
    """Compile `_blas_shim.c` into the cache once; return its path and a note."""
    try:
        return compile_c(_SHIM_SOURCE, "shim", libs=("-ldl",), subdir="blas")
    except NativeBuildError as exc:
        raise BlasSetupError(f"{exc}; install gcc or set PCD_BLAS") from exc


def sgemm_address() -> int | None:
    """Address of the bound fast `cblas_sgemm` (what MLX's matmuls call), else None.

    None unless `setup_blas()` bound a library before mlx was imported: MLX's own
    reference BLAS is not worth calling directly.
    """
    info = setup_blas()
    if not info.bound_before_import or info.name in ("reference", "accelerate"):
        return None
    try:
        fn = ctypes.CDLL(None).cblas_sgemm
    except AttributeError:
        return None
    return ctypes.cast(fn, ctypes.c_void_p).value


def _bind(path: str, check: bool = False) -> tuple[str, Any, bool]:
    """Bind `path` globally (through the shim if its symbols are prefixed).

    Args:
        path: The library.
        check: Refuse an OpenBLAS whose kernels are too old for this CPU.

    Returns:
        A note, the thread-setting function or None, and whether the shim was used.

    Raises:
        BlasSetupError: The library cannot be loaded or has no usable GEMM.
        WeakKernelsError: `check` is set and the library's kernels are too old for this CPU.
    """
    local = os.RTLD_NOW | os.RTLD_LOCAL  # inspect first; promote to global only if usable
    # OpenBLAS reads this when it loads. By default an idle BLAS thread spins for 2^28
    # cycles (~0.1 s) after each call, holding a core that the engine's own threads (two
    # CPU streams, the native attention) need; 2^4 lets it sleep at once. Measured on
    # 2 cores: the triage prefill's attention 381 -> 278 ms, and the baselines' decode
    # steps are no slower. A value the user set is kept.
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", str(OPENBLAS_THREAD_TIMEOUT))
    # Its pool is sized when it loads: to this process's thread budget (its CPUs, not the
    # host's cores).
    from .threads import thread_budget

    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(thread_budget()))
    try:
        lib = ctypes.CDLL(path, mode=local)
    except OSError as exc:
        raise BlasSetupError(f"cannot load {path}: {exc}") from exc
    if hasattr(lib, "cblas_sgemm"):
        kernels = openblas_core.kernels_note(lib, path, check)
        ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        for fn in ("openblas_set_num_threads", "MKL_Set_Num_Threads"):
            if hasattr(lib, fn):
                return f"bound {path}{kernels}", getattr(lib, fn), False
        return f"bound {path}{kernels}", None, False
    if not hasattr(lib, "scipy_cblas_sgemm"):
        raise BlasSetupError(f"{path} exports neither cblas_sgemm nor scipy_cblas_sgemm")
    kernels = openblas_core.kernels_note(lib, path, check)
    shim_path, note = _build_shim()
    try:
        shim = ctypes.CDLL(str(shim_path), mode=local)
    except OSError as exc:  # a corrupt or foreign cached build: the next candidate
        raise BlasSetupError(f"cannot load the BLAS shim {shim_path}: {exc}") from exc
    if not shim.pcd_blas_bind(os.fsencode(path), b"scipy_"):
        raise BlasSetupError(f"the shim found no scipy_cblas_*gemm in {path}")
    ctypes.CDLL(str(shim_path), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    return f"bound {path}{kernels} via {note}", shim.pcd_blas_set_num_threads, True


def _unbound(name: str, note: str, path: str | None = None) -> BlasInfo:
    return BlasInfo(name, path, name == "accelerate", None, False, note)


def _resolve() -> BlasInfo:
    """Find and bind a BLAS (the body of `setup_blas`)."""
    global _set_threads
    if sys.platform == "darwin":
        return _unbound("accelerate", "macOS: MLX uses Accelerate.")
    if not sys.platform.startswith("linux"):
        return _unbound("default", "No BLAS binding on this platform.")
    owner = _sgemm_owner()
    if "mlx.core" in sys.modules:
        note = "mlx.core was imported before setup_blas(); the BLAS must be bound before "
        note += "the first mlx import (import mlx only through import_mlx()). " + _FIX
        return _unbound("preloaded" if owner else "reference", note, owner)
    if owner:  # e.g. LD_PRELOAD=libopenblas.so: already global, nothing to do
        return BlasInfo("preloaded", owner, False, None, True, f"{owner} was preloaded")
    env = os.environ.get("PCD_BLAS", "").strip()
    if env.lower() == "reference":
        return _unbound("reference", "PCD_BLAS=reference: MLX keeps its reference BLAS.")
    if env:
        try:
            note, _set_threads, shim = _bind(env)
        except BlasSetupError as exc:
            msg = f"PCD_BLAS={env!r}: expected a library exporting cblas_sgemm or "
            raise BlasSetupError(msg + f"scipy_cblas_sgemm; {exc}") from exc
        return BlasInfo("PCD_BLAS (shim)" if shim else "PCD_BLAS", env, False, None, True, note)
    failures = []
    weak: list[tuple[str, str]] = []  # usable, but with kernels too old for this CPU
    # Every candidate checked, then (filled by the first round) the weak ones unchecked:
    # still far better than the reference BLAS.
    for check, candidates in ((True, _candidates()), (False, weak)):
        for name, path in candidates:
            try:
                note, _set_threads, _ = _bind(path, check=check)
            except openblas_core.WeakKernelsError as exc:
                failures.append(f"passed over {name}: {exc}")
                weak.append((name, path))
                continue
            except BlasSetupError as exc:
                failures.append(f"{name}: {exc}")
                continue
            return BlasInfo(name, path, False, None, True, "; ".join([*failures, note]))
    return _unbound("reference", "; ".join(failures or ["no OpenBLAS/MKL found"]) + ". " + _FIX)


def setup_blas() -> BlasInfo:
    """Bind the fastest BLAS found into MLX. Idempotent; must run before mlx is imported.

    Linux order: `PCD_BLAS` (a path, or `reference` to disable), system OpenBLAS, pip
    `mkl`, pip `cmeel-openblas`, pip `scipy-openblas32` through a compiled C shim. An
    OpenBLAS whose kernels are too old for this CPU (`openblas_core`: an old library that
    does not know the CPU) is passed over, and bound only if nothing else binds. A
    library already global (LD_PRELOAD) is kept; on macOS MLX uses Accelerate.

    Returns:
        What was bound; `gflops` is None (see `blas_status`).

    Raises:
        BlasSetupError: `PCD_BLAS` names a library that cannot be bound.
    """
    global _info
    with _lock:
        if _info is None:
            _info = _resolve()
        return _info


def import_mlx() -> Any:
    """Run `setup_blas()`, then import and return `mlx.core`."""
    setup_blas()
    import mlx.core as mx

    return mx


def measure_gflops(n: int = 512, repeats: int = 7) -> float:
    """Time an n×n float32 matmul through mlx on the CPU stream.

    Args:
        n: Matrix size.
        repeats: Timed runs after one warm-up; the fastest is used, so a busy machine
            does not make a fast BLAS look slow.

    Returns:
        GFLOP/s (2·n³ flops per matmul).
    """
    mx = import_mlx()
    with mx.stream(mx.cpu):
        a = mx.random.normal((n, n), dtype=mx.float32)
        b = mx.random.normal((n, n), dtype=mx.float32)
        mx.eval(a, b, a @ b)
        times = []
        for _ in range(max(1, repeats)):
            start = time.perf_counter()
            mx.eval(a @ b)
            times.append(time.perf_counter() - start)
    return 2.0 * n**3 / max(min(times), 1e-9) / 1e9


def blas_status(measure: bool = True) -> BlasInfo:
    """Return `setup_blas()`'s result, with `gflops` and `fast` measured (once, cached)."""
    global _measured
    with _lock:
        info = setup_blas()
        if _measured is not None or not measure:
            return _measured or info
        gflops = measure_gflops()
        if gflops < FAST_GFLOPS and info.bound_before_import:  # a busy moment? once more
            gflops = max(gflops, measure_gflops())
        fast = gflops >= FAST_GFLOPS or info.name == "accelerate"
        note = info.note
        if not fast and info.bound_before_import:
            note += f" (bound, but GEMM runs at only {gflops:.1f} GFLOP/s)"
        if device_info().device != "cpu" and not info.bound_before_import:
            info = replace(info, name="n/a (gpu)")
        _measured = replace(info, gflops=gflops, fast=fast, note=note)
        return _measured


def ensure_fast_path() -> BlasInfo:
    """Measure once; on a slow Linux CPU path, warn once with how to fix it."""
    global _warned
    info = blas_status()
    with _lock:
        slow_linux_cpu = not info.fast and sys.platform.startswith("linux")
        if slow_linux_cpu and not _warned and device_info().device == "cpu":
            _warned = True
            warnings.warn(PcdPerformanceWarning(slow_blas_message(info)), stacklevel=2)
    return info


def slow_blas_message(info: BlasInfo, load: float | None = None) -> str:
    """What a slow float32 matmul means, worded for what was found.

    - A fast BLAS bound before mlx, timed while the machine was busy (load average at or
      above half the usable CPUs, `cpus.busy`): contention, nothing to reinstall; the
      message says how many CPUs other processes held ("load average 1.99 on 2 usable
      CPUs: another process holds a CPU").
    - The same on a machine that was not busy: a CPU quota, throttling or a weak build;
      the load measured and the CPU budget are named and nothing is reinstalled either.
    - No fast BLAS bound (MLX's reference BLAS): how to install one.

    Args:
        info: The measured BLAS status.
        load: The 1-minute load average (read when None).
    """
    from .cpus import busy, cpu_budget

    budget = cpu_budget()
    is_busy, load = busy(budget.cpus, load)
    rate = f"{info.gflops or 0:.1f} GFLOP/s for a float32 matmul"
    cpus = f"{budget.cpus} usable CPUs ({budget.source})"
    measured = f"load average {load:.2f} on {cpus}: {_held(load, budget.cpus)}"
    if info.bound_before_import and is_busy:
        return (
            f"The bound BLAS ({info.name}) ran at {rate} while this machine was busy "
            f"({measured}), so PCD runs slower until that work ends. The BLAS is bound "
            f"correctly; nothing needs reinstalling. Details: {info.note}"
        )
    if info.bound_before_import:
        return (
            f"The bound BLAS ({info.name}) ran at only {rate} while this machine was not "
            f"busy ({measured}). It is bound correctly, so look for a CPU quota or "
            "throttling (PCD sizes its threads from the affinity mask and the cgroup quota; "
            "PCD_THREADS overrides), or point PCD_BLAS at another OpenBLAS or MKL. "
            f"Details: {info.note}"
        )
    return (
        f"MLX uses a slow BLAS on this Linux CPU ({rate}, {info.name}); PCD will be 10-50x "
        f"slower. {_FIX} Details: {info.note}"
    )


def _held(load: float, cpus: int) -> str:
    """How many of `cpus` other processes held at a load average of `load`, in words (the
    whole runnable threads it counts, this process's own included)."""
    n = int(load)
    if n < 1:
        return "no other process held a CPU"
    if n >= cpus:
        return f"other processes hold all {cpus} CPUs" if cpus > 1 else "another process holds it"
    if n == 1:
        return "another process holds a CPU"
    return f"other processes hold {n} of the {cpus} CPUs"


def set_blas_threads(n: int) -> bool:
    """Set the bound BLAS's thread count; return False if it has no such control."""
    if n < 1:
        raise ValueError(f"Expected a thread count >= 1. Received: {n!r}")
    with _lock:
        setup_blas()
        if _set_threads is None:
            return False
        _set_threads(ctypes.c_int(n))
        return True


def device_info() -> DeviceInfo:
    """Describe MLX's default device (imports mlx through `import_mlx`)."""
    mx = import_mlx()
    device = "cpu"
    if mx.default_device().type == mx.gpu:
        cuda = getattr(getattr(mx, "cuda", None), "is_available", None)
        device = "cuda" if cuda is not None and cuda() else "metal"
    from .cpus import usable_cpus

    return DeviceInfo(
        device, "float32" if device == "cpu" else "keep", usable_cpus(), mx.__version__
    )
