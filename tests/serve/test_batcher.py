"""MicroBatcher mechanics with a fake decider (no model)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import CancelledError
from types import SimpleNamespace

import pytest

from pcd_tools.decide.options import DecideOptions
from pcd_tools.schema import compile_schema
from pcd_tools.serve.batcher import Job, MicroBatcher
from pcd_tools.serve.errors import QueueFullError
from pcd_tools.serve.metrics import Metrics

pytestmark = pytest.mark.serve

A = compile_schema({"a": {"type": "boolean"}})
B = compile_schema({"b": {"type": "boolean"}})


def _opt(**kw):
    return DecideOptions(scoring="full", **kw)


class FakeDecider:
    """Records each decide_many call; blocks while `gate` is clear; fails on 'boom'."""

    def __init__(self):
        self.calls: list[tuple[str, list[str]]] = []
        self.options: list[dict] = []
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.engine = SimpleNamespace(lock=threading.RLock())

    def decide_many(self, schema, contexts, *, options, batch_size):
        self.started.set()
        self.gate.wait(10)
        self.calls.append((schema.field_names[0], list(contexts)))
        self.options.append({"orders": options.orders, "allow_empty": options.allow_empty})
        if "boom" in contexts:
            raise ValueError("boom")
        return [f"{schema.field_names[0]}:{c}" for c in contexts]


@pytest.fixture
def fake():
    return FakeDecider()


def _blocked(fake, batcher):
    """Holds the worker inside a first batch so that later jobs queue up."""
    fake.gate.clear()
    first = batcher.submit(Job(A, "first"))
    assert fake.started.wait(5)
    return first


def test_jobs_with_the_same_schema_run_in_one_batch_in_order(fake):
    m = Metrics()
    b = MicroBatcher(fake, max_batch=8, metrics=m)
    b.start()
    first = _blocked(fake, b)
    futs = [b.submit(Job(A if i % 2 == 0 else B, f"c{i}")) for i in range(6)]
    assert b.depth == 6
    fake.gate.set()
    assert first.result(5) == "a:first"
    assert [f.result(5) for f in futs] == ["a:c0", "b:c1", "a:c2", "b:c3", "a:c4", "b:c5"]
    b.stop()
    assert fake.calls == [("a", ["first"]), ("a", ["c0", "c2", "c4"]), ("b", ["c1", "c3", "c5"])]
    assert m.batch_size.n == 3 and m.batch_size.total == 7


def test_max_batch_splits_and_different_temperatures_do_not_mix(fake):
    b = MicroBatcher(fake, max_batch=2)
    b.start()
    _blocked(fake, b)
    futs = [b.submit(Job(A, f"c{i}")) for i in range(3)]
    futs.append(b.submit(Job(A, "hot", _opt(temperature=2.0))))
    fake.gate.set()
    for f in futs:
        f.result(5)
    b.stop()
    assert [c for _, c in fake.calls[1:]] == [["c0", "c1"], ["c2"], ["hot"]]


def test_different_orders_and_allow_empty_never_share_a_batch(fake):
    b = MicroBatcher(fake, max_batch=8)
    b.start()
    _blocked(fake, b)
    jobs = [
        Job(A, "o1"),
        Job(A, "o2", _opt(orders=2)),
        Job(A, "o1-again"),
        Job(A, "o2-again", _opt(orders=2)),
        Job(A, "o3", _opt(orders=3)),
        Job(A, " ", _opt(allow_empty=True)),
        Job(A, "o2-empty-ok", _opt(orders=2, allow_empty=True)),
    ]
    futs = [b.submit(j) for j in jobs]
    fake.gate.set()
    for f in futs:
        f.result(5)
    b.stop()
    assert [c for _, c in fake.calls[1:]] == [
        ["o1", "o1-again"],
        ["o2", "o2-again"],
        ["o3"],
        [" "],
        ["o2-empty-ok"],
    ]
    assert fake.options[1:] == [
        {"orders": 1, "allow_empty": False},
        {"orders": 2, "allow_empty": False},
        {"orders": 3, "allow_empty": False},
        {"orders": 1, "allow_empty": True},
        {"orders": 2, "allow_empty": True},
    ]


def test_full_queue_refuses_with_retry_after(fake):
    m = Metrics()
    b = MicroBatcher(fake, max_queue=2, metrics=m)
    b.start()
    _blocked(fake, b)
    b.submit(Job(A, "q1"))
    b.submit(Job(A, "q2"))
    with pytest.raises(QueueFullError) as e:
        b.submit(Job(A, "q3"))
    assert e.value.status == 429
    assert int(e.value.headers["Retry-After"]) >= 1
    assert "max_queue=2" in e.value.message
    assert m.rejected == 1
    fake.gate.set()
    b.stop()


def test_cancelled_jobs_never_run(fake):
    m = Metrics()
    b = MicroBatcher(fake, metrics=m)
    b.start()
    _blocked(fake, b)
    keep = b.submit(Job(A, "keep"))
    gone = b.submit(Job(A, "gone"))
    assert gone.cancel()
    fake.gate.set()
    assert keep.result(5) == "a:keep"
    b.stop()
    with pytest.raises(CancelledError):
        gone.result(0)
    assert all("gone" not in c for _, c in fake.calls)
    assert m.cancelled == 1


def test_a_failing_job_does_not_fail_its_batch(fake):
    b = MicroBatcher(fake)
    b.start()
    _blocked(fake, b)
    ok1, bad, ok2 = (b.submit(Job(A, c)) for c in ("x", "boom", "y"))
    fake.gate.set()
    assert ok1.result(5) == "a:x" and ok2.result(5) == "a:y"
    with pytest.raises(ValueError, match="boom"):
        bad.result(5)
    b.stop()


def test_every_job_is_answered_exactly_once_under_concurrency(fake):
    b = MicroBatcher(fake, max_batch=4, batch_wait_ms=0)
    b.start()
    results: dict[str, list[str]] = {}
    lock = threading.Lock()

    def client(i):
        for j in range(25):
            ctx = f"{i}-{j}"
            fut = b.submit(Job(A if j % 3 else B, ctx))
            fut.add_done_callback(lambda f, ctx=ctx: _record(results, lock, ctx, f.result()))
            fut.result(10)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    b.stop()
    assert len(results) == 200
    assert all(len(v) == 1 and v[0].endswith(":" + k) for k, v in results.items())
    assert sum(len(c) for _, c in fake.calls) == 200


def _record(results, lock, ctx, value):
    with lock:
        results.setdefault(ctx, []).append(value)


def test_stop_without_drain_fails_waiting_jobs_with_503(fake):
    b = MicroBatcher(fake)
    b.start()
    _blocked(fake, b)
    waiting = b.submit(Job(A, "w"))
    threading.Timer(0.2, fake.gate.set).start()
    b.stop(drain=False, timeout=5)
    assert waiting.exception(5).status == 503
    time.sleep(0)
