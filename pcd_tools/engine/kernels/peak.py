"""The CPU's int8 peak: the most int8 operations a second its dot-product instructions
issue, measured with a loop of nothing else (`_qgemm.c`'s `pcd_int8_peak`).

It is the ceiling the int8 GEMM of a prefill is measured against (`pcd models --doctor`,
`pcd bench`'s `prefill_peak_share`): on AVX-512 VNNI one `vpdpbusd` on zmm does 64
multiply-adds (128 operations), on AVX-VNNI 32 on ymm, on AVX2 32 in three instructions;
with AMX (Intel Sapphire Rapids on, where the K-quant prefill runs on the tiles) one
`tdpbssd` does 16 x 16 x 64, and `auto` measures that path.
Each thread runs 12 independent accumulator chains, so the instruction's latency hides
behind the others; the threads start together on a barrier and the rate is the
operations of all over the wall time. The best of a few short runs is kept (a busy
machine only lowers it). The portable path has no probe.
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass
from functools import lru_cache

from .bindings import qgemm_library
from .paths import path_name

__all__ = ["Int8Peak", "int8_peak"]


@dataclass(frozen=True)
class Int8Peak:
    """A measured int8 peak.

    Args:
        path: The kernel path measured (`amx`, `avx512vnni`, `avxvnni`, `avx2`).
        one_thread: GOP/s (10^9 int8 operations a second, 2 per multiply-add) on one thread.
        threads: The threads of the second measurement.
        all_threads: GOP/s on `threads` threads together.
    """

    path: str
    one_thread: float
    threads: int
    all_threads: float

    def text(self) -> str:
        """One line for the doctor."""
        what = "tile products" if self.path == "amx" else "dot products"
        return (
            f"{self.one_thread:,.0f} GOP/s on 1 thread, {self.all_threads:,.0f} on "
            f"{self.threads} ({self.path} {what}, a loop of nothing else)"
        )


def _run(lib: ctypes.CDLL, path: int, iters: int, threads: int) -> float:
    """GOP/s of `threads` threads each running the probe for `iters` iterations."""
    sinks = [ctypes.c_int32() for _ in range(threads)]
    ops = [0] * threads
    start = threading.Barrier(threads + 1)

    def work(i: int) -> None:
        start.wait()
        ops[i] = int(lib.pcd_int8_peak(path, iters, i + 3, ctypes.byref(sinks[i])))

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in pool:
        t.join()
    return sum(ops) / (time.perf_counter() - t0) / 1e9


@lru_cache(maxsize=8)
def int8_peak(
    threads: int | None = None, seconds: float = 0.05, rounds: int = 3, path: str = "auto"
) -> Int8Peak | None:
    """Measures this CPU's int8 peak on one thread and on `threads` (the thread budget
    when None), on `path` (`auto`: the int8 path the GEMM picks, AMX where the K-quant
    prefill runs on the tiles; or `amx`, `avx512vnni`, `avxvnni`, `avx2`); None where
    that path has no probe or does not run here (the portable C). Cached per arguments: a
    process measures it once.

    Raises:
        InvalidArgumentError: for a path name that is not known.
    """
    from ...errors import InvalidArgumentError
    from ..host.threads import thread_budget
    from .paths import PATHS

    if path != "auto" and path not in PATHS:
        raise InvalidArgumentError(
            f"int8 peak path {path!r} is not known; accepted: auto, {', '.join(sorted(PATHS))}"
        )
    lib = qgemm_library()
    path_id = int(lib.pcd_int8_peak_path(0 if path == "auto" else PATHS[path]))
    if not path_id:
        return None
    n = thread_budget() if threads is None else max(1, int(threads))
    t0 = time.perf_counter()
    sink = ctypes.c_int32()
    ops = lib.pcd_int8_peak(path_id, 20_000, 1, ctypes.byref(sink))
    rate = ops / max(time.perf_counter() - t0, 1e-6)
    per_iter = ops / 20_000
    iters = max(1_000, int(rate * seconds / per_iter))
    one = max(_run(lib, path_id, iters, 1) for _ in range(rounds))
    every = max(_run(lib, path_id, iters, n) for _ in range(rounds)) if n > 1 else one
    return Int8Peak(path_name(path_id), one, n, every)
