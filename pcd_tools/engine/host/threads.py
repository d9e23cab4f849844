"""Thread counts the engine tunes as it runs: `decode_threads()` (the native decode's
pool) and `ThreadTuner` (which count of a pool's threads has been fastest lately, used by
the decode steps and by `passes.workers.ThreadFit`)."""

from __future__ import annotations

import os

import numpy as np

from ...errors import InvalidArgumentError
from .cpus import usable_cpus

__all__ = ["ThreadTuner", "decode_threads"]


def decode_threads() -> int:
    """`$PCD_DECODE_THREADS`, else the CPUs this process may use (its affinity mask, less
    a cgroup quota: `cpus.usable_cpus`)."""
    env = os.environ.get("PCD_DECODE_THREADS", "").strip()
    if not env:
        return usable_cpus()
    if not env.isdigit() or int(env) <= 0:
        raise InvalidArgumentError(
            f"PCD_DECODE_THREADS={env!r} is not accepted; expected a positive integer (the "
            "decode step's threads), or unset for the CPUs this process may use."
        )
    return int(env)


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
