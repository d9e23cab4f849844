"""How many CPUs this process may really use, and how busy they are.

`os.cpu_count()` counts the host's cores. A process pinned to fewer
(`taskset`, Kubernetes' static CPU manager) sees that in `os.sched_getaffinity`; a
container with a CPU quota (`docker --cpus=2`, a Kubernetes CPU limit) sees every core
but may only use `quota / period` of them per period: the kernel throttles the rest. A
BLAS or a stream pool sized to the host then runs more spinning threads than it has
CPUs, and each one waits for the others at every barrier (DESIGN §4: a 300-token
prefill 6x slower under contention).

`usable_cpus()` is the smallest of:

- the affinity mask (`os.sched_getaffinity(0)`);
- the cgroup v2 quota (`cpu.max`: `"<quota> <period>"` or `"max <period>"`) of this
  process's cgroup (`/proc/self/cgroup`), else the cgroup v1 CFS quota
  (`cpu.cfs_quota_us` / `cpu.cfs_period_us`), rounded up (1.5 CPUs -> 2);
- `PCD_THREADS`, when set (an int >= 1): the user's own choice.

`busy()` reads the 1-minute load average against that count (busy from half of it), to
tell a slow BLAS from a busy machine.

`runnable_others()` counts the threads of other processes runnable right now (the
kernel's count of runnable tasks in `/proc/loadavg`, least of a few reads). A pass is a
few hundred BLAS calls, and each waits at its end for every thread it used; with more
runnable threads than CPUs, each wait lasts until the scheduler gets round to the
descheduled one, so `threads.request_threads` takes their share off the thread budget
(`workers.ThreadFit` measures which count is faster).

How many threads to run is decided in `threads.py` (`thread_budget`, which starts from
`usable_cpus()`); this module only counts CPUs.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...errors import InvalidArgumentError
from .cgroups import _read, cgroup_quota

__all__ = [
    "CpuBudget",
    "busy",
    "cgroup_quota",
    "cpu_budget",
    "runnable_others",
    "threads_override",
    "usable_cpus",
]


@dataclass(frozen=True)
class CpuBudget:
    """The CPUs this process may use, and where the limit comes from.

    Args:
        cpus: The count to size thread pools by (>= 1).
        affinity: CPUs in the affinity mask (the host's count where there is none).
        quota: The cgroup CPU quota in CPUs (e.g. 1.5), or None when there is none.
        override: `PCD_THREADS`, when set.
    """

    cpus: int
    affinity: int
    quota: float | None
    override: int | None

    @property
    def source(self) -> str:
        """What set `cpus`: `"PCD_THREADS"`, `"cgroup quota"` or `"affinity"`."""
        if self.override is not None:
            return "PCD_THREADS"
        if self.quota is not None and math.ceil(self.quota) < self.affinity:
            return "cgroup quota"
        return "affinity"


def threads_override(env: str | bool | None = True) -> int | None:
    """`PCD_THREADS` as an int, or None when unset or blank.

    Args:
        env: The value of `PCD_THREADS`; `True` reads the environment.

    Raises:
        InvalidArgumentError: for a `PCD_THREADS` that is not an int >= 1.
    """
    if env is True:
        env = os.environ.get("PCD_THREADS")
    if env is None or env is False or not env.strip():
        return None
    try:
        n = int(env)
    except ValueError:
        n = 0
    if n < 1:
        raise InvalidArgumentError(
            f"PCD_THREADS={env!r} is not accepted; expected an int >= 1 (the CPUs PCD's thread "
            "pools may use), or leave it unset to size them from the affinity mask and the "
            "cgroup CPU quota."
        )
    return n


def cpu_budget(
    affinity: Sequence[int] | None = None,
    quota: float | bool | None = True,
    env: str | bool | None = True,
) -> CpuBudget:
    """The CPUs to size thread pools by (see the module docstring).

    Args:
        affinity: The affinity mask; read from the OS when None.
        quota: The cgroup quota in CPUs, None for none; `True` reads it.
        env: The value of `PCD_THREADS`; `True` reads the environment.

    Raises:
        InvalidArgumentError: for a `PCD_THREADS` that is not an int >= 1.
    """
    if affinity is None:
        mask = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        n_aff = len(mask) if mask else (os.cpu_count() or 1)
    else:
        n_aff = max(1, len(affinity))
    q = cgroup_quota() if quota is True else None if quota is None else float(quota)
    over = threads_override(env)
    cpus = n_aff if q is None else max(1, min(n_aff, math.ceil(q - 1e-9)))
    if over is not None:
        cpus = over
    return CpuBudget(cpus, n_aff, q, over)


def usable_cpus() -> int:
    """The CPUs this process may use: `cpu_budget().cpus`."""
    return cpu_budget().cpus


def busy(cpus: int | None = None, load: float | None = None) -> tuple[bool, float]:
    """Whether the machine is not quiet: the 1-minute load average is at least half of
    `cpus` (on 2 CPUs: 1.0, one CPU held on average over the last minute).

    Half, not all: a timed matmul (or a pass) runs one BLAS thread per usable CPU and
    every call waits for its slowest thread, so a CPU that another process holds slows
    each call to that CPU's share; with half the CPUs held the rate measured is at most
    about half and says nothing of the build. At a load of 1.99 on 2 CPUs a pip install
    held one CPU, which the old rule (load >= cpus) called quiet (issue 52).

    Args:
        cpus: The CPUs to compare with (`usable_cpus()` when None).
        load: The load average (read when None; 0 where the OS has none).

    Returns:
        `(busy, load average)`.
    """
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (OSError, AttributeError):
            load = 0.0
    n = usable_cpus() if cpus is None else cpus
    return load >= n / 2, load


def _running(text: str | None) -> int | None:
    """The runnable-task count of a `/proc/loadavg` line ("0.5 0.4 0.3 2/345 678")."""
    try:
        return int((text or "").split()[3].split("/")[0])
    except (IndexError, ValueError):
        return None


def runnable_others(
    samples: int = 3,
    gap_s: float = 1e-4,
    read: Callable[[], str | None] | None = None,
) -> int:
    """Threads of other processes runnable right now, host-wide (0 where unknown).

    The kernel's count of runnable tasks (`/proc/loadavg`) includes the thread reading
    it, so one is taken off. The least of `samples` reads, `gap_s` apart, so that a
    task that runs for a moment (a shell, a kernel worker) is not taken for a neighbour.

    Args:
        samples: Reads to take the least of.
        gap_s: Seconds between reads.
        read: Returns the text of `/proc/loadavg` (for tests); the file when None.
    """
    reader = read or (lambda: _read(Path("/proc/loadavg")))
    least: int | None = None
    for i in range(max(1, samples)):
        if i:
            time.sleep(gap_s)
        n = _running(reader())
        if n is None:
            return 0
        least = n if least is None else min(least, n)
    return max(0, (least or 0) - 1)
