"""Ray Serve: the `pcd serve` app as a deployment, batched across callers with `@serve.batch`.

Each replica loads the model once, builds the very FastAPI app `pcd serve` runs
(`pcd_tools.serve.create_app`: the same endpoints, API key and limits) and serves it
through `serve.ingress`. The app's batcher is replaced by `ServeBatcher`, which hands each
decision job to the replica's `@serve.batch` method; a batch of jobs is scored with one
`decide_many` call per compatible group, and its size is recorded in `/metrics`
(`pcd_batch_size`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pcd_tools.errors import InvalidArgumentError

from .data import ModelSource, check_model_source, load_calibration, load_decider, model_name
from .data import size_threads as _size_threads
from .job import connect

if TYPE_CHECKING:
    from ray import serve

__all__ = ["deployment", "run_server"]


@functools.lru_cache(maxsize=1)
def serve_batcher_class() -> type:
    """`ServeBatcher`: a `MicroBatcher` whose jobs run through a `@serve.batch` method.

    Built on first use, in the replica, because it subclasses the serve extra's class.
    """
    from pcd_tools.serve.batcher import Job, MicroBatcher
    from pcd_tools.serve.errors import ApiError, QueueFullError

    class ServeBatcher(MicroBatcher):
        """Queues each job on the replica's event loop for `batch_fn`, a `@serve.batch`
        method that calls `run_jobs` with the jobs Ray Serve gathered.

        Args:
            decider: The replica's decider.
            batch_fn: The `@serve.batch` method (one job in, awaited).
            max_queue: Jobs that may wait at once; more get 429.
            metrics: The app's metrics (batch sizes, queue waits, rejections).
        """

        def __init__(
            self, decider: Any, batch_fn: Callable[[Job], Any], *, max_queue: int, metrics: Any
        ):
            super().__init__(decider, max_queue=max_queue, metrics=metrics)
            self._batch_fn = batch_fn
            self._event_loop: asyncio.AbstractEventLoop | None = None
            self._waiting: set[int] = set()
            self._pending = 0
            self._tasks: set[asyncio.Future[Any]] = set()
            self._live = False

        def start(self) -> None:
            self._event_loop = asyncio.get_running_loop()  # the app's lifespan runs on it
            with self._cond:
                self._stopping = False
                self._live = True
            self._initialised.set()

        def stop(self, *, drain: bool = True, timeout: float | None = None) -> None:
            with self._cond:
                self._stopping = True
                if drain:
                    self._cond.wait_for(lambda: self._pending == 0, timeout)
                self._live = False

        @property
        def running(self) -> bool:
            return self._live and not self._stopping

        @property
        def depth(self) -> int:
            return len(self._waiting)

        def submit(self, job: Job) -> Any:
            loop = self._event_loop
            with self._cond:
                if self._stopping or loop is None:
                    raise ApiError(503, "shutting_down", "The server is shutting down.")
                if len(self._waiting) >= self.max_queue:
                    if self.metrics is not None:
                        self.metrics.reject()
                    wait = (len(self._waiting) + 1) * self._per_job_s
                    raise QueueFullError(len(self._waiting), self.max_queue, wait)
                self._waiting.add(id(job))
                self._pending += 1
            job.enqueued = time.perf_counter()
            coro = self._drive(job)
            try:
                here = asyncio.get_running_loop()
            except RuntimeError:
                here = None
            if here is loop:
                task = loop.create_task(coro)
                self._tasks.add(task)  # a task nobody references may be collected
                task.add_done_callback(self._tasks.discard)
            else:
                asyncio.run_coroutine_threadsafe(coro, loop)
            return job.future

        async def _drive(self, job: Job) -> None:
            try:
                await self._batch_fn(job)
            except BaseException as e:
                with contextlib.suppress(Exception):  # cancelled or already answered
                    if not job.future.done():
                        job.future.set_exception(e)
            finally:
                with self._cond:
                    self._waiting.discard(id(job))
                    self._pending -= 1
                    self._cond.notify_all()

        def run_jobs(self, jobs: list[Job]) -> None:
            """Scores one `@serve.batch` batch: one `decide_many` per compatible group."""
            with self._cond:
                for job in jobs:
                    self._waiting.discard(id(job))
            live = [j for j in jobs if j.future.set_running_or_notify_cancel()]
            if len(live) < len(jobs) and self.metrics is not None:
                self.metrics.cancel(len(jobs) - len(live))
            groups: dict[Any, list[Job]] = {}
            for job in live:
                groups.setdefault(job.key, []).append(job)
            for group in groups.values():
                try:
                    self._run(group)
                except BaseException as e:  # never leave an accepted job unanswered
                    for job in group:
                        if not job.future.done():
                            job.future.set_exception(e)

    return ServeBatcher


def deployment(
    model: ModelSource = None,
    *,
    calibration: Any = None,
    api_key: str | None = None,
    name: str = "pcd",
    num_replicas: int | None = None,
    autoscaling_config: dict[str, Any] | None = None,
    num_cpus_per_replica: float = 2.0,
    max_batch: int = 16,
    batch_wait_ms: float = 2.0,
    max_queue: int = 256,
    max_batch_tokens: int = 8192,
    max_body_bytes: int = 1 << 20,
    max_questions: int = 64,
    warmup: bool = True,
    max_ongoing_requests: int | None = None,
    **options: Any,
) -> serve.Deployment:
    """The `pcd serve` app as a Ray Serve deployment: `serve.run(deployment(...).bind())`.

    Args:
        model: What each replica loads: None (the embedded model), a path, a Hugging
            Face id, or a callable returning a `Decider` (called in the replica).
        calibration: A `Calibration` or its path (read here), applied in every replica.
        api_key: When set, `/v1/*` and `/metrics` need `Authorization: Bearer <key>`.
        name: The deployment's name.
        num_replicas: Fixed replica count (default 1); leave None with
            `autoscaling_config`.
        autoscaling_config: Ray Serve's autoscaling settings (`min_replicas`,
            `max_replicas`, `target_ongoing_requests`, ...), passed through.
        num_cpus_per_replica: CPUs each replica reserves; its threads follow.
        max_batch: Most requests per `@serve.batch` batch.
        batch_wait_ms: How long a batch waits for more requests (`batch_wait_timeout_s`).
        max_queue: Requests that may wait in a replica before 429.
        max_batch_tokens: As for `create_app` (the app's length checks).
        max_body_bytes: Largest request body (413 above).
        max_questions: Questions per request (413 above).
        warmup: Score a small schema when a replica starts; `/ready` waits for it.
        max_ongoing_requests: Requests Ray Serve sends a replica at once (default
            `max_queue + max_batch`, so that the app's own 429 applies).
        **options: More `serve.deployment` options (`ray_actor_options`,
            `health_check_period_s`, ...), passed through.

    Returns:
        A `ray.serve.Deployment`; `.bind()` makes the application.

    Raises:
        InvalidArgumentError: for a loaded `Decider` as `model` or a limit below 1.
        ImportError: when the `ray` extra is not installed.
    """
    from ray import serve

    check_model_source(model)
    limits = {"max_batch": max_batch, "max_queue": max_queue, "max_questions": max_questions}
    for key, v in {**limits, "max_body_bytes": max_body_bytes}.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InvalidArgumentError(f"{key} must be an int >= 1; got {v!r}.")
    if num_replicas is not None and autoscaling_config is not None:
        raise InvalidArgumentError("pass num_replicas or autoscaling_config, not both.")
    cal = load_calibration(calibration)
    app_kw: dict[str, Any] = {
        "api_key": api_key,
        "max_queue": max_queue,
        "max_batch": max_batch,
        "max_batch_tokens": max_batch_tokens,
        "batch_wait_ms": batch_wait_ms,
        "max_body_bytes": max_body_bytes,
        "max_questions": max_questions,
        "warmup": warmup,
    }

    class PCDServer:
        """One replica: the model, the `pcd serve` app and its `@serve.batch` batcher."""

        def __init__(self) -> None:
            self.decider = load_decider(model, cal, _size_threads(num_cpus_per_replica))
            self.batcher: Any = None

        def __serve_build_asgi_app__(self) -> Any:
            from pcd_tools.serve.app import create_app

            app = create_app(self.decider, **app_kw)
            srv = app.state.pcd
            self.batcher = serve_batcher_class()(
                self.decider, self.decide_batch, max_queue=max_queue, metrics=srv.metrics
            )
            srv.batcher = self.batcher
            return app

        @serve.batch(max_batch_size=max_batch, batch_wait_timeout_s=max(0.0, batch_wait_ms) / 1e3)
        async def decide_batch(self, jobs: list[Any]) -> list[None]:
            await asyncio.to_thread(self.batcher.run_jobs, jobs)
            return [None] * len(jobs)

    settings: dict[str, Any] = {
        "name": name,
        "ray_actor_options": {"num_cpus": num_cpus_per_replica},
        "max_ongoing_requests": max_ongoing_requests or max_queue + max_batch,
        **options,
    }
    if autoscaling_config is not None:
        settings["autoscaling_config"] = autoscaling_config
    else:
        settings["num_replicas"] = num_replicas or 1
    return serve.deployment(**settings)(serve.ingress()(PCDServer))


def _replicas(kwargs: dict[str, Any]) -> str:
    scale = kwargs.get("autoscaling_config")
    if scale:
        return f"{scale.get('min_replicas', 1)}-{scale.get('max_replicas', '?')} (autoscaling)"
    return str(kwargs.get("num_replicas") or 1)


def run_server(
    model: ModelSource = None,
    *,
    address: str | None = "auto",
    host: str = "127.0.0.1",
    port: int = 8000,
    on_ready: Callable[[dict[str, Any]], None] | None = None,
    stop: threading.Event | None = None,
    **kwargs: Any,
) -> None:
    """`pcd serve --ray`: runs the deployment on Ray Serve until stopped (Ctrl-C).

    Args:
        model: As for `deployment`.
        address: `auto` (the running cluster, else a local one), `local` or a cluster
            address (see `pcd_tools.ray.job.connect`).
        host: The address Serve's HTTP proxy binds.
        port: Its port.
        on_ready: Called once the application is running, with `event`, `url`, `model`,
            `replicas` and `auth`.
        stop: Stop when this event is set (default: run until interrupted).
        **kwargs: `deployment` options.
    """
    import ray
    from ray import serve

    started_here = connect(address)
    serve.start(http_options={"host": host, "port": port})
    app = deployment(model, **kwargs)
    serve.run(app.bind(), name=app.name, route_prefix="/")
    if on_ready is not None:
        on_ready(
            {
                "event": "serving",
                "url": f"http://{host}:{port}",
                "model": model_name(model),
                "replicas": _replicas(kwargs),
                "auth": bool(kwargs.get("api_key")),
            }
        )
    try:
        while not (stop is not None and stop.wait(0.5)):
            if stop is None:
                time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        serve.delete(app.name)
        if started_here:
            serve.shutdown()
            ray.shutdown()
