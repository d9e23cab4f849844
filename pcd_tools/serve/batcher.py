"""`MicroBatcher`: one model worker thread with continuous micro-batching.

Requests wait in one bounded FIFO queue. Whenever the model is free, the worker takes the
oldest request plus every queued request that has the same schema fingerprint, options
(`DecideOptions`) and prompt-cache partition, up to `max_batch` requests and
`max_batch_tokens` prompt tokens, and scores them with one `decider.decide_many` call. While a batch runs, new requests queue up, so the
next batch is as large as the load: batches grow with concurrency and stay at one request
when the server is idle.

Guarantees:
- every accepted job's future is resolved exactly once (result or exception);
- a job whose future was cancelled before the worker reached it never runs;
- a full queue refuses new jobs at once with `QueueFullError` (HTTP 429).
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..decide.options import DecideOptions
from .errors import ApiError, QueueFullError

if TYPE_CHECKING:
    from ..answers.result import Decision
    from ..decide.decider import Decider
    from ..schema import Schema
    from .metrics import Metrics

__all__ = ["Job", "MicroBatcher"]


def _server_default() -> DecideOptions:
    # the server's defaults are the Python API's (scoring="auto", docs/server.md)
    return DecideOptions(scoring="auto")


@dataclass(eq=False)
class Job:
    """One decision request waiting for the model.

    Args:
        schema: The compiled schema.
        context: The text to decide on.
        options: The call's checked options (`DecideOptions`: temperature, scoring,
            orders, allow_empty, calibration, pruning, max_new_tokens); default
            `DecideOptions`'s defaults (`scoring="auto"`, as in `Decider.decide`).
        tokens: Prompt tokens (for the per-batch token budget); 0 if unknown.
        cache_key: The caller's prompt-cache partition (`prompt_cache_key`), or None for
            the shared prefix cache; jobs of different partitions never share a batch.
        future: Resolved with the `Decision`, or with the exception that scoring raised.
    """

    schema: Schema
    context: str
    options: DecideOptions = field(default_factory=_server_default)
    tokens: int = 0
    cache_key: str | None = None
    future: Future[Decision[Any]] = field(default_factory=Future)
    enqueued: float = field(default_factory=time.perf_counter)

    @property
    def key(self) -> tuple[str, DecideOptions, str | None]:
        """Jobs with equal keys can share one `decide_many` call."""
        return (self.schema.fingerprint(), self.options, self.cache_key)


class MicroBatcher:
    """Runs queued decision jobs on one worker thread, batching compatible jobs.

    Args:
        decider: The decider whose `decide_many` scores the batches.
        max_queue: Jobs that may wait at once; more are refused with `QueueFullError`.
        max_batch: Most jobs per `decide_many` call.
        max_batch_tokens: Most prompt tokens per batch (the first job always runs).
        batch_wait_ms: When the worker was idle, how long it waits for companions of the
            first job before running it. Under load it never waits.
        metrics: Where batch sizes, durations and queue waits are recorded.
    """

    def __init__(
        self,
        decider: Decider,
        *,
        max_queue: int = 256,
        max_batch: int = 16,
        max_batch_tokens: int = 8192,
        batch_wait_ms: float = 2.0,
        metrics: Metrics | None = None,
    ):
        for name, v in (("max_queue", max_queue), ("max_batch", max_batch)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1; got {v!r}.")
        self.decider = decider
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.max_batch_tokens = max_batch_tokens
        self.batch_wait = max(0.0, batch_wait_ms) / 1e3
        self.metrics = metrics
        self._queue: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._per_job_s = 0.3  # running estimate of model seconds per job, for Retry-After
        self.worker_decider: Any = decider
        self._initialised = threading.Event()
        self._init_error: BaseException | None = None
        self.batches = 0
        self.jobs_started = 0
        self.jobs_run = 0

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Starts the worker thread (idempotent) once its engine is built.

        Raises:
            Exception: whatever building the worker's engine raised.
        """
        with self._cond:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stopping = False
            self._initialised.clear()
            self._thread = threading.Thread(target=self._loop, name="pcd-model-worker", daemon=True)
            self._thread.start()
        self._initialised.wait()
        if self._init_error is not None:
            raise self._init_error

    def stop(self, *, drain: bool = True, timeout: float | None = None) -> None:
        """Stops the worker.

        Args:
            drain: Run the jobs still queued first; otherwise fail them with HTTP 503.
            timeout: Seconds to wait for the worker to finish.
        """
        with self._cond:
            self._stopping = True
            if not drain:
                while self._queue:
                    job = self._queue.popleft()
                    if job.future.set_running_or_notify_cancel():
                        job.future.set_exception(
                            ApiError(503, "shutting_down", "The server is shutting down.")
                        )
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        """Whether the worker thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def depth(self) -> int:
        """Jobs waiting (not yet running)."""
        return len(self._queue)

    # --- submitting -----------------------------------------------------------------------

    def submit(self, job: Job) -> Future[Decision[Any]]:
        """Queues `job` and returns its future.

        Raises:
            QueueFullError: if `max_queue` jobs are already waiting.
            ApiError: 503 if the batcher is stopping.
        """
        with self._cond:
            if self._stopping:
                raise ApiError(503, "shutting_down", "The server is shutting down.")
            if len(self._queue) >= self.max_queue:
                if self.metrics is not None:
                    self.metrics.reject()
                wait = (len(self._queue) + 1) * self._per_job_s
                raise QueueFullError(len(self._queue), self.max_queue, wait)
            job.enqueued = time.perf_counter()
            self._queue.append(job)
            self._cond.notify()
        return job.future

    # --- the worker -----------------------------------------------------------------------

    def _take(self) -> list[Job] | None:
        """Blocks for the next batch; `None` once stopping with an empty queue."""
        with self._cond:
            idle = not self._queue
            while not self._queue:
                if self._stopping:
                    return None
                self._cond.wait()
            if idle and self.batch_wait > 0:
                # Requests that arrive together: give the rest a moment to be queued.
                deadline = time.perf_counter() + self.batch_wait
                while len(self._queue) < self.max_batch and not self._stopping:
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            picked: list[Job] = []
            rest: collections.deque[Job] = collections.deque()
            key = None
            tokens = 0
            dropped = 0
            for job in self._queue:
                if job.future.cancelled():
                    dropped += 1
                    continue
                if key is None:
                    key = job.key
                if (
                    job.key == key
                    and len(picked) < self.max_batch
                    and (not picked or tokens + job.tokens <= self.max_batch_tokens)
                ):
                    if job.future.set_running_or_notify_cancel():
                        self.jobs_started += 1
                        picked.append(job)
                        tokens += job.tokens
                    else:
                        dropped += 1
                else:
                    rest.append(job)
            self._queue = rest
        if dropped and self.metrics is not None:
            self.metrics.cancel(dropped)
        return picked

    def _loop(self) -> None:
        try:
            self.worker_decider = self.decider  # the engine serialises model use itself
        except BaseException as e:
            self._init_error = e
            raise
        finally:
            self._initialised.set()
        while True:
            jobs = self._take()
            if jobs is None:
                return
            if not jobs:
                continue
            try:
                self._run(jobs)
            except BaseException as e:  # never leave an accepted job unanswered
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(e)

    def _decide_many(self, job: Job, contexts: list[str]) -> list[Decision[Any]]:
        if job.cache_key is None:
            return self._call(job, contexts)
        with self.worker_decider.engine.prefix_cache.partition(job.cache_key):
            return self._call(job, contexts)

    def _call(self, job: Job, contexts: list[str]) -> list[Decision[Any]]:
        return self.worker_decider.decide_many(
            job.schema, contexts, options=job.options, batch_size=len(contexts)
        )

    def _run(self, jobs: list[Job]) -> None:
        t0 = time.perf_counter()
        waits = [t0 - j.enqueued for j in jobs]
        head = jobs[0]
        outcomes: list[tuple[bool, Any]]
        try:
            decisions = self._decide_many(head, [j.context for j in jobs])
            outcomes = [(True, d) for d in decisions]
        except Exception as e:
            # a batch failed: run each job on its own so that only the bad one fails
            outcomes = [(False, e)] if len(jobs) == 1 else [self._run_one(j) for j in jobs]
        dt = time.perf_counter() - t0
        self._per_job_s = 0.8 * self._per_job_s + 0.2 * (dt / len(jobs))
        # Count the batch before answering, so that a client never sees stale counters.
        self.batches += 1
        self.jobs_run += len(jobs)
        if self.metrics is not None:
            self.metrics.batch(len(jobs), dt, waits)
        for job, (ok, value) in zip(jobs, outcomes):
            if ok:
                job.future.set_result(value)
            else:
                job.future.set_exception(value)

    def _run_one(self, job: Job) -> tuple[bool, Any]:
        try:
            return True, self._decide_many(job, [job.context])[0]
        except Exception as e:
            return False, e
