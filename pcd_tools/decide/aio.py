"""Async decisions: `Decider.adecide` / `adecide_many`, micro-batched on the engine worker.

Awaiting a decision never blocks the event loop. Each request is checked at once (so a bad
argument raises in the caller), then queued; the engine's single worker thread
(`pcd_tools.decide.worker`) drains the queue. When it picks up work it takes the oldest request
and every queued request that can share its `decide_many` call (same schema, options and
decider), up to `max_batch` contexts. While a batch runs, new awaiters queue up, so
concurrent callers are batched together as the server batches its requests; an idle
decider runs a lone request at once. After each batch the drain hands the worker back,
so other queued model calls (LangChain tools, routers) are not starved.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import threading
import weakref
from collections.abc import Awaitable, Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .worker import submit_to_worker

if TYPE_CHECKING:
    from ..answers.result import Decision
    from ..schema import Schema
    from .options import DecideOptions
    from .state import DecidesMany

__all__ = ["DecisionQueue", "queue_for"]

MAX_BATCH = 32


@dataclass(eq=False)
class _Item:
    schema: Schema
    context: str
    options: DecideOptions
    key: Hashable
    future: Future[Decision[Any]] = field(default_factory=Future)


class DecisionQueue:
    """Queued decisions of one decider, drained in micro-batches on its engine worker.

    Args:
        decider: The decider whose `decide_many` scores the batches.
        max_batch: Most contexts per `decide_many` call.
    """

    def __init__(self, decider: DecidesMany, max_batch: int = MAX_BATCH):
        self._decider = weakref.ref(decider)
        self.max_batch = max_batch
        self._pending: collections.deque[_Item] = collections.deque()
        self._lock = threading.Lock()
        self._scheduled = False
        self.batches = 0  # decide_many calls made (for tests and telemetry)

    def submit(
        self, schema: Schema, contexts: Sequence[str], options: DecideOptions
    ) -> list[Future[Decision[Any]]]:
        """Queues one request per context; returns their futures, in order."""
        key = (schema.fingerprint(), options)
        items = [_Item(schema, c, options, key) for c in contexts]
        with self._lock:
            self._pending.extend(items)
            schedule = not self._scheduled
            self._scheduled = True
        if schedule:
            self._schedule()
        return [it.future for it in items]

    def _schedule(self) -> None:
        decider = self._decider()
        if decider is None:  # the decider is gone: nothing can answer
            self._fail_all(RuntimeError("the Decider was garbage-collected"))
            return
        submit_to_worker(decider, self._drain_once)

    def _take(self) -> list[_Item]:
        with self._lock:
            batch: list[_Item] = []
            rest: collections.deque[_Item] = collections.deque()
            key = None
            for it in self._pending:
                if it.future.cancelled():
                    continue
                if key is None:
                    key = it.key
                if it.key == key and len(batch) < self.max_batch:
                    batch.append(it)
                else:
                    rest.append(it)
            self._pending = rest
            return batch

    def _drain_once(self) -> None:
        batch = self._take()
        try:
            if batch:
                self._run(batch)
        finally:
            with self._lock:
                more = bool(self._pending)
                self._scheduled = more
            if more:
                self._schedule()

    def _run(self, batch: list[_Item]) -> None:
        decider = self._decider()
        live = [it for it in batch if it.future.set_running_or_notify_cancel()]
        if not live:
            return
        if decider is None:
            for it in live:
                it.future.set_exception(RuntimeError("the Decider was garbage-collected"))
            return
        head = live[0]
        try:
            decisions = decider.decide_many(
                head.schema, [it.context for it in live], options=head.options, batch_size=len(live)
            )
            self.batches += 1
        except Exception as e:
            if len(live) == 1:
                live[0].future.set_exception(e)
                return
            # One bad request must not fail its batch-mates: answer each on its own.
            for it in live:
                _decide_alone(it, decider)
            return
        for it, d in zip(live, decisions):
            it.future.set_result(d)

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            items, self._pending = list(self._pending), collections.deque()
            self._scheduled = False
        for it in items:
            if it.future.set_running_or_notify_cancel():
                it.future.set_exception(exc)


def _decide_alone(item: _Item, decider: DecidesMany) -> None:
    """Decides one queued item on its own, resolving its (running) future either way."""
    try:
        d = decider.decide_many(item.schema, [item.context], options=item.options, batch_size=1)
        item.future.set_result(d[0])
    except Exception as e:
        item.future.set_exception(e)


_QUEUES: weakref.WeakKeyDictionary[Any, DecisionQueue] = weakref.WeakKeyDictionary()
_QUEUES_LOCK = threading.Lock()


def queue_for(decider: DecidesMany) -> DecisionQueue:
    """The decision queue of `decider` (one per `Decider` object, created on first use)."""
    with _QUEUES_LOCK:
        q = _QUEUES.get(decider)
        if q is None:
            q = DecisionQueue(decider)
            _QUEUES[decider] = q
        return q


async def gather(
    futures: list[Future[Decision[Any]]],
    progress: Callable[[int, int], Awaitable[None] | None] | None = None,
) -> list[Decision[Any]]:
    """Awaits queued decisions, in order; cancelling the awaiter, or one decision failing,
    cancels those not yet started.

    Args:
        futures: The queued decisions.
        progress: Called as `progress(done, total)` after each decision completes (in
            completion order); it may be a coroutine function.
    """
    wrapped = [asyncio.wrap_future(f) for f in futures]
    try:
        if progress is None:
            return list(await asyncio.gather(*wrapped))
        for done, next_done in enumerate(asyncio.as_completed(wrapped), start=1):
            await next_done
            report = progress(done, len(wrapped))
            if inspect.isawaitable(report):
                await report
        return [w.result() for w in wrapped]
    except BaseException:
        for f in futures:
            f.cancel()
        raise
