"""How many threads: the one place the engine decides it.

- `thread_budget()`: the threads this process's passes, BLAS and thread pools are sized
  by. A budget set with `set_thread_budget` (`pcd_tools.ray.size_threads` sets the
  actor's share of its node), else the CPUs this process may use (`cpus.usable_cpus`:
  the affinity mask, less a cgroup quota, or `PCD_THREADS`). Read on every call, so a
  budget set after an engine is built holds for its next request.
- `request_threads()`: the count for the request about to run: the budget, less the CPUs
  other processes hold right now (`cpus.runnable_others`); `PCD_THREADS` or
  `PCD_ADAPTIVE_THREADS=0` fix it at the budget. `passes.workers.ThreadFit` picks between
  the two counts by which ran faster lately.
- `decode_threads()`: the native decode's pool: `PCD_DECODE_THREADS`, else the budget.
- `kernel_threads(threads)`: a native kernel's count (`kernels.qgemm`, dequantizing a
  GGUF load): `threads` checked, else the budget. Inside a request the engine hands its
  count to the kernels (`kernels.cpu_ops.active`), which `load.qlinear` reads.
- `ThreadTuner`: which count of a pool's threads has been fastest lately (the decode
  steps and `ThreadFit`).
"""

from __future__ import annotations

import os

import numpy as np

from ...errors import InvalidArgumentError
from .cpus import runnable_others, threads_override, usable_cpus

__all__ = [
    "ThreadTuner",
    "decode_threads",
    "kernel_threads",
    "request_threads",
    "set_thread_budget",
    "thread_budget",
]

_budget: int | None = None  # set by `set_thread_budget`; None: `usable_cpus()`


def thread_budget() -> int:
    """The threads this process's passes, BLAS and pools are sized by: the budget set by
    `set_thread_budget`, else `cpus.usable_cpus()` (affinity mask, cgroup quota,
    `PCD_THREADS`).

    Raises:
        InvalidArgumentError: for a `PCD_THREADS` that is not an int >= 1 (no budget set).
    """
    return usable_cpus() if _budget is None else _budget


def set_thread_budget(n: int | None) -> int:
    """Sets this process's thread budget (`thread_budget`); None goes back to the CPUs
    it may use. The BLAS's own pool is not resized here (`blas.set_blas_threads`).

    Args:
        n: Threads, an int >= 1, or None.

    Returns:
        The budget now in force.

    Raises:
        InvalidArgumentError: for anything but None or an int >= 1.
    """
    global _budget
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise InvalidArgumentError(f"a thread budget must be an int >= 1 or None; got {n!r}")
    _budget = n
    return thread_budget()


def request_threads(
    cpus: int | None = None,
    others: int | None = None,
    host: int | None = None,
    env: str | bool | None = True,
) -> int:
    """Threads for the pass about to run: `cpus` less the CPUs other processes hold now.

    Other processes' runnable threads are counted host-wide; in a process limited to
    `cpus` of the host's `host` CPUs, their share of ours is `others * cpus / host`,
    rounded. The count is never below 1. With `PCD_THREADS` set, or
    `PCD_ADAPTIVE_THREADS=0`, it is always `cpus`: the user chose.

    Args:
        cpus: The budget (`thread_budget()` when None).
        others: Runnable threads of other processes (`runnable_others()` when None).
        host: The host's CPUs (`os.cpu_count()` when None).
        env: `PCD_THREADS`; `True` reads the environment.

    Raises:
        InvalidArgumentError: for a `PCD_THREADS` that is not an int >= 1.
    """
    n = thread_budget() if cpus is None else max(1, int(cpus))
    fixed = threads_override(env)
    if fixed is not None or n == 1 or os.environ.get("PCD_ADAPTIVE_THREADS", "1").strip() == "0":
        return n
    o = runnable_others() if others is None else max(0, int(others))
    h = max(n, host or os.cpu_count() or n)
    held = int(o * n / h + 0.5)
    return max(1, n - held)


def decode_threads() -> int:
    """`$PCD_DECODE_THREADS`, else the thread budget (`thread_budget`: the CPUs this
    process may use, or the budget set)."""
    env = os.environ.get("PCD_DECODE_THREADS", "").strip()
    if not env:
        return thread_budget()
    if not env.isdigit() or int(env) <= 0:
        raise InvalidArgumentError(
            f"PCD_DECODE_THREADS={env!r} is not accepted; expected a positive integer (the "
            "decode step's threads), or unset for the CPUs this process may use."
        )
    return int(env)


def kernel_threads(threads: int | None = None) -> int:
    """A native kernel's threads: `threads`, else the thread budget (`thread_budget`).

    Raises:
        InvalidArgumentError: for a `threads` that is not None or an int >= 1.
    """
    if threads is None:
        return thread_budget()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise InvalidArgumentError(f"threads must be an int >= 1 or None; got {threads!r}")
    return threads


class ThreadTuner:
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
