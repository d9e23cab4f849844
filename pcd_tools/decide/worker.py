"""The engine worker: one long-lived thread per engine runs every queued model call.

Why one thread:

- Async code must never wait on the engine's lock from the event loop thread. Async
  callers queue on the worker and await; calls run one after another, the loop stays free.
- MLX streams and unevaluated arrays belong to the thread that created them, and MLX
  keeps thread-local compile caches whose destructors run when a thread exits (a thread
  that exits while Python shuts down aborts the process). LangChain and LangGraph run
  sync steps on short-lived pool threads, so sync calls are handed to the worker too.
  The worker is a daemon thread that lives as long as the process.

The engine itself works from any thread (its streams are per thread and its cached
prefix K/V is materialised); the worker is about the event loop and thread lifetimes.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["call_model", "engine_session", "run_on_worker", "submit_to_worker"]

R = TypeVar("R")

_WORKERS: weakref.WeakKeyDictionary[Any, _Worker] = weakref.WeakKeyDictionary()
_GUARD = threading.Lock()


class _Worker:
    """A daemon thread draining a queue of calls, one at a time, in order."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self.thread = threading.Thread(target=self._loop, name="pcd-engine", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            fn, fut = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the caller, who re-raises it
                fut.set_exception(exc)

    def submit(self, fn: Callable[[], R]) -> Future[R]:
        fut: Future[R] = Future()
        self.jobs.put((fn, fut))
        return fut

    def stop(self) -> None:
        self.jobs.put(None)


def _engine(decider: Any) -> Any:
    return getattr(decider, "engine", None)


def _worker(decider: Any) -> _Worker:
    key = _engine(decider) or decider
    with _GUARD:
        w = _WORKERS.get(key)
        if w is None:
            w = _Worker()
            _WORKERS[key] = w
            # stop it when the engine is collected, but never at exit: a thread that
            # ends while Python shuts down runs MLX's thread-local destructors too late
            weakref.finalize(key, w.stop).atexit = False
        return w


@contextlib.contextmanager
def engine_session(decider: Any) -> Iterator[None]:
    """Holds `decider`'s engine lock for a call (re-entrant on the same thread)."""
    lock = getattr(_engine(decider), "lock", None)
    if lock is None:
        yield  # a stand-in decider (tests, fakes): nothing to guard
        return
    with lock:
        yield


def _job(decider: Any, fn: Callable[..., R], args: Any, kwargs: Any) -> Callable[[], R]:
    ctx = contextvars.copy_context()  # LangChain run config, LangGraph scratchpad

    def run() -> R:
        with engine_session(decider):
            return ctx.run(fn, *args, **kwargs)

    return run


def call_model(decider: Any, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
    """Runs `fn(*args, **kwargs)` on `decider`'s engine worker and waits for the result.

    Called from the worker itself (a nested call), it runs inline.
    """
    if _engine(decider) is None:
        return fn(*args, **kwargs)
    w = _worker(decider)
    if threading.current_thread() is w.thread:
        return fn(*args, **kwargs)
    return w.submit(_job(decider, fn, args, kwargs)).result()


async def run_on_worker(decider: Any, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
    """Runs `fn(*args, **kwargs)` on `decider`'s engine worker and awaits the result."""
    if _engine(decider) is None:
        return fn(*args, **kwargs)
    fut = _worker(decider).submit(_job(decider, fn, args, kwargs))
    return await asyncio.wrap_future(fut)


def submit_to_worker(decider: Any, fn: Callable[[], R], /) -> Future[R]:
    """Queues `fn()` on `decider`'s engine worker without waiting; returns its future.

    A stand-in decider without an engine (tests, fakes) runs it inline.
    """
    if _engine(decider) is None:
        fut: Future[R] = Future()
        try:
            fut.set_result(fn())
        except BaseException as exc:  # handed to whoever reads the future
            fut.set_exception(exc)
        return fut
    return _worker(decider).submit(_job(decider, fn, (), {}))
