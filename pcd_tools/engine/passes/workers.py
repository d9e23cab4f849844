"""CPU stream workers: the threads that run the concurrent parts of a pass, and how
context rows are split into jobs for them.

MLX CPU elementwise ops run single-threaded per stream, so two CPU streams that each
take half the work, with the BLAS at one thread, cut a packed pass nearly in half
(DESIGN §4). MLX evaluation and numpy release the GIL, so plain threads suffice.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ..host import threads as _threads
from ..host.blas import import_mlx, set_blas_threads
from ..host.threads import ThreadTuner
from ..kernels import cpu_ops as cpu_kernels

mx = import_mlx()

__all__ = ["ThreadFit", "row_groups", "run_on_workers"]


class ThreadFit:
    """Threads for each request: the whole thread budget on a quiet machine; beside busy
    neighbours, whichever of two counts has run fastest lately.

    The two counts are the budget (`threads.thread_budget`) and the CPUs the neighbours
    leave of it (`threads.request_threads`). Which is faster depends on the neighbour and
    the request: beside a second PCD server on 2 CPUs, fraud's small warm request took
    2.7 s on 2 threads and 1.3 s fitted (its threads and ours wait for each other at the
    end of every BLAS call); beside two spinning processes, triage's 2 threads beat 1
    (6.2 s against 8.0 s). So each count is tried twice when neighbours appear, the
    faster by median seconds per token of the last 5 busy requests is used, and the other
    is tried again every 16th busy request: the native decode's `ThreadTuner`, over these
    two counts.
    `PCD_THREADS` or `PCD_ADAPTIVE_THREADS=0` fixes the count at the budget.

    Args:
        cpus: A fixed budget; None reads `threads.thread_budget()` at every pick, so a
            budget set later (`set_thread_budget`, ray's `size_threads`) holds.
        suggest: Returns the CPUs the neighbours leave of a budget
            (`threads.request_threads` when None, looked up at every pick).
    """

    def __init__(self, cpus: int | None = None, suggest: Callable[[int], int] | None = None):
        self._cpus, self._suggest = cpus, suggest
        self.budget = self.cpus  # the budget the last pick used
        self.tuner = ThreadTuner(self.budget, fixed=False)
        self.busy = False

    @property
    def cpus(self) -> int:
        """The budget: the fixed one, else `threads.thread_budget()`."""
        return _threads.thread_budget() if self._cpus is None else self._cpus

    def suggest(self, cpus: int) -> int:
        """The CPUs the neighbours leave of `cpus`."""
        return (self._suggest or _threads.request_threads)(cpus)

    def pick(self) -> int:
        """The thread count for the request about to run."""
        cpus = self.budget = self.tuner.n = self.cpus
        fewer = self.suggest(cpus) if cpus > 1 else cpus
        self.busy = fewer < cpus
        if not self.busy:
            return cpus
        return self.tuner.pick(1, (fewer, cpus))

    def record(self, threads: int, seconds: float, tokens: int) -> None:
        """A request's wall time over the tokens it ran; kept only beside neighbours."""
        if self.busy and tokens > 0:
            self.tuner.record(1, threads, seconds / tokens)


class _StreamWorkers:
    """A fixed number of daemon threads, each with its own CPU stream, that run the
    concurrent parts of passes for every engine that uses that many streams.

    They never exit. A thread that holds MLX streams and exits while the interpreter
    shuts down can abort the process ("terminate called without an active exception",
    seen with a `ThreadPoolExecutor`, whose threads are joined at exit).
    """

    def __init__(self, n: int) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], Future[Any]]]
        self._jobs = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._loop, name=f"pcd-stream-{n}-{i}", daemon=True)
            for i in range(n)
        ]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[..., Any], arg: Any) -> Future[Any]:
        """Queues `fn(arg)`; the first free worker runs it."""
        fut: Future[Any] = Future()
        self._jobs.put((fn, (arg,), fut))
        return fut

    def _loop(self) -> None:
        stream = mx.new_stream(mx.cpu)
        while True:
            fn, args, fut = self._jobs.get()
            if not fut.set_running_or_notify_cancel():  # pragma: no cover - never cancelled
                continue
            try:
                with mx.stream(stream):
                    fut.set_result(fn(*args))
            except BaseException as e:  # handed to the waiting caller
                fut.set_exception(e)


_POOLS: dict[int, _StreamWorkers] = {}
_POOLS_LOCK = threading.Lock()


def _workers(n: int) -> _StreamWorkers:
    """The shared pool of exactly `n` stream workers (at most `n` jobs run at once)."""
    with _POOLS_LOCK:
        pool = _POOLS.get(n)
        if pool is None:
            pool = _POOLS[n] = _StreamWorkers(n)
        return pool


def run_on_workers(
    jobs: list[Callable[[], Any]],
    n_workers: int,
    *,
    kernels: bool,
    blas_threads: int,
    after: int | None = None,
    every_size: bool = False,
    bf16_scores: bool = False,
) -> list[Any]:
    """Runs `jobs` at once on the shared pool of `n_workers` stream workers.

    Args:
        jobs: Callables without arguments.
        n_workers: Size of the pool (at most this many jobs run at once).
        kernels: Whether the jobs' model calls go through the CPU kernels.
        blas_threads: BLAS threads while the jobs run.
        after: BLAS threads afterwards (the request's count; the thread budget,
            `threads.thread_budget()`, when None).
        every_size: The kernels take every call size (`cpu_kernels.active`).
        bf16_scores: Attention's scores in bf16 where they run (`cpu_kernels.active`).

    Returns:
        The jobs' results, in order. A job's exception is raised here.
    """

    meter = cpu_kernels.current_meter()  # the caller's: its jobs' attention counts there

    def run(job: Callable[[], Any]) -> Any:
        with (
            cpu_kernels.active(
                kernels, threads=blas_threads, every_size=every_size, bf16_scores=bf16_scores
            ),
            cpu_kernels.metering(meter) if meter is not None else contextlib.nullcontext(),
        ):
            return job()

    set_blas_threads(blas_threads)
    try:
        pool = _workers(n_workers)
        futures = [pool.submit(run, job) for job in jobs]
        return [f.result() for f in futures]
    finally:
        set_blas_threads(_threads.thread_budget() if after is None else after)


def row_groups(
    rows: list[list[int]], pack_tokens: int, *, batch_tokens: int, n_streams: int
) -> list[list[int]]:
    """Splits context rows into jobs of similar length (little padding).

    A job holds rows while its padded prefill tokens plus the rows' fields-pass tokens
    stay within `batch_tokens`, and there is at least one job per CPU stream. Longest
    first, so the stream workers, which take jobs as they free up, finish together.

    Args:
        rows: Token ids of each context row.
        pack_tokens: Fields-pass tokens each row adds.
        batch_tokens: Token budget of one job.
        n_streams: CPU streams that take jobs.

    Returns:
        Per job, the indices of its rows, ascending.
    """
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
    groups: list[list[int]] = []
    for i in order:
        g = groups[-1] if groups else None
        cost = (len(g) + 1) * (len(rows[g[0]]) + pack_tokens) if g else 0
        if g is not None and cost <= batch_tokens:
            g.append(i)
        else:
            groups.append([i])
    want = min(len(rows), n_streams)
    while len(groups) < want:  # split the biggest group until every stream has work
        j = max(range(len(groups)), key=lambda j: len(groups[j]))
        g = groups.pop(j)
        groups[j:j] = [g[: len(g) // 2], g[len(g) // 2 :]]
    return [sorted(g) for g in groups]
