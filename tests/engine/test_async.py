"""`adecide` / `adecide_many`: the event loop stays free, concurrent awaiters share batches."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from pcd_tools.decide.aio import queue_for
from pcd_tools.errors import ContextTooLongError, InvalidArgumentError, InvalidContextError
from pcd_tools.schema import compile_schema
from tests.conftest import tiny_decider
from tests.schemas import Ticket

pytestmark = pytest.mark.engine

TEXTS = [f"Ticket {i}: the checkout page fails with error {500 + i}." for i in range(6)]


@pytest.fixture()
def fresh():
    # A decider of its own: its queue's batch counter starts at zero.
    return tiny_decider(0)


def _same(a, b):
    for name, f in a.fields.items():
        np.testing.assert_allclose(
            list(f.distribution.values()), list(b.fields[name].distribution.values()), atol=1e-4
        )
        assert f.label == b.fields[name].label


def test_adecide_equals_decide(fresh):
    d = asyncio.run(fresh.adecide(Ticket, TEXTS[0]))
    _same(d, fresh.decide(Ticket, TEXTS[0]))


def test_concurrent_awaiters_are_micro_batched(fresh):
    q = queue_for(fresh)
    # Hold the engine worker busy so that every awaiter is queued before the first batch.
    release = threading.Event()
    from pcd_tools.decide.worker import submit_to_worker

    blocker = submit_to_worker(fresh, release.wait)

    async def main():
        tasks = [asyncio.create_task(fresh.adecide(Ticket, t)) for t in TEXTS]
        await asyncio.sleep(0.05)
        release.set()
        return await asyncio.gather(*tasks)

    out = asyncio.run(main())
    blocker.result(timeout=5)
    assert q.batches == 1
    assert [d.batch.size for d in out] == [len(TEXTS)] * len(TEXTS)
    for t, d in zip(TEXTS, out):
        _same(d, fresh.decide(Ticket, t))


def test_awaiting_never_blocks_the_event_loop(fresh):
    ticks = 0

    async def ticker(stop: asyncio.Event):
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.001)

    async def main():
        stop = asyncio.Event()
        t = asyncio.create_task(ticker(stop))
        t0 = time.perf_counter()
        await fresh.adecide_many(Ticket, TEXTS * 3)
        elapsed = time.perf_counter() - t0
        stop.set()
        await t
        return elapsed

    elapsed = asyncio.run(main())
    # The loop kept running while the engine worked: at least a tick per 20 ms.
    assert ticks >= elapsed / 0.02


def test_bad_arguments_raise_before_anything_is_queued(fresh):
    q = queue_for(fresh)
    with pytest.raises(InvalidArgumentError, match="temperature"):
        asyncio.run(fresh.adecide(Ticket, TEXTS[0], temperature=0))
    with pytest.raises(InvalidContextError, match="empty"):
        asyncio.run(fresh.adecide(Ticket, " "))
    assert q.batches == 0


def test_one_failing_request_does_not_fail_its_batch_mates():
    small = tiny_decider(0)
    plan = small.engine.plan(compile_schema(Ticket))
    # room for "short" and 100 more tokens; the 400-token context does not fit
    small.engine.context_window = (
        small.prompt(Ticket, "short").token_count + plan.extra_tokens + 100
    )
    release = threading.Event()
    from pcd_tools.decide.worker import submit_to_worker

    submit_to_worker(small, release.wait)

    async def main():
        ok = asyncio.create_task(small.adecide(Ticket, "short"))
        bad = asyncio.create_task(small.adecide(Ticket, "x" * 400))
        await asyncio.sleep(0.05)
        release.set()
        return await asyncio.gather(ok, bad, return_exceptions=True)

    ok, bad = asyncio.run(main())
    assert isinstance(bad, ContextTooLongError)
    assert ok.fields["priority"].label in {"P0_CRITICAL", "P1_HIGH", "P2_NORMAL", "P3_LOW"}


def test_different_options_are_not_batched_together(fresh):
    q = queue_for(fresh)

    async def main():
        return await asyncio.gather(
            fresh.adecide(Ticket, TEXTS[0], temperature=1.0),
            fresh.adecide(Ticket, TEXTS[1], temperature=2.0),
        )

    a, b = asyncio.run(main())
    assert a.temperature == 1.0 and b.temperature == 2.0
    assert q.batches == 2
