"""The stream workers that run the concurrent parts of a pass."""

from __future__ import annotations

import os
import threading
import time

import pytest

from tests.conftest import tiny_decider

pytestmark = pytest.mark.engine


def test_at_most_one_job_per_stream_runs_at_once_and_results_keep_order():
    engine = tiny_decider(0, streams=2).engine
    lock = threading.Lock()
    active, peak, names = [0], [0], set()

    def job(i):
        def run():
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
                names.add(threading.current_thread().name)
            time.sleep(0.02)
            with lock:
                active[0] -= 1
            return i

        return run

    for _ in range(2):  # a second call must not grow the pool
        assert engine._parallel([job(i) for i in range(12)]) == list(range(12))
    assert peak[0] == 2
    assert len(names) == 2 and threading.current_thread().name not in names


def test_a_failing_job_raises_in_the_caller_and_the_pool_survives():
    engine = tiny_decider(0, streams=2).engine

    def boom():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        engine._parallel([lambda: 1, boom, lambda: 3])
    assert engine._parallel([lambda: 1, lambda: 2]) == [1, 2]


def test_decide_many_matches_decide_with_many_row_groups(tiny):
    schema = {
        "team": {"type": "enum", "choices": ["billing", "bill_disputes", "tech", "sales"]},
        "urgent": {"type": "boolean"},
    }
    contexts = [("refund please " * (1 + i % 7)) + str(i) for i in range(11)]
    many = tiny.decide_many(schema, contexts)
    for ctx, got in zip(contexts, many):
        want = tiny.decide(schema, ctx)
        for name in want.fields:
            a, b = got.fields[name].distribution, want.fields[name].distribution
            assert max(abs(a[c] - b[c]) for c in a) < 1e-4


def test_a_request_beside_busy_neighbours_runs_on_fewer_threads_with_the_same_answer(
    tiny, monkeypatch
):
    import pcd_tools.engine.scorer as engine_mod
    from pcd_tools.engine.host import threads

    schema = {
        "team": {"type": "enum", "choices": ["billing", "bill_disputes", "tech", "sales"]},
        "urgent": {"type": "boolean"},
    }
    contexts = [("refund please " * (1 + i % 5)) + str(i) for i in range(6)]
    engine = tiny.engine
    monkeypatch.setattr(engine, "n_streams", 2)
    monkeypatch.setattr(threads, "_budget", None)
    threads.set_thread_budget(2)
    quiet = tiny.decide_many(schema, contexts)
    assert engine.threads == 2 and engine.streams_now == 2

    blas: list[int] = []
    monkeypatch.setattr(threads, "request_threads", lambda cpus: cpus - 1)
    monkeypatch.setattr(engine_mod, "set_blas_threads", blas.append)
    workers = set()
    real_run = engine_mod.run_on_workers
    monkeypatch.setattr(
        engine_mod, "run_on_workers", lambda *a, **k: workers.add(1) or real_run(*a, **k)
    )
    before = engine.stats["fewer_threads"]
    busy = tiny.decide_many(schema, contexts)
    assert blas and set(blas) == {1}  # the BLAS ran on one thread
    assert not workers  # and every job on the calling thread: one stream
    assert engine.threads == 1 and engine.streams_now == 1
    assert engine.stats["fewer_threads"] > before
    for a, b in zip(quiet, busy):
        for name in a.fields:
            for label, p in a.fields[name].distribution.items():
                assert abs(p - b.fields[name].distribution[label]) < 1e-5
    monkeypatch.undo()
    engine.fit_threads()  # the shared decider back on every thread


def test_a_spinning_neighbour_is_seen_as_runnable():
    import subprocess
    import sys

    from pcd_tools.engine.host.cpus import runnable_others

    if not os.path.exists("/proc/loadavg"):
        pytest.skip("needs Linux's /proc/loadavg")
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        assert runnable_others() >= 1
    finally:
        hog.kill()
        hog.wait()


def test_thread_fit_uses_every_cpu_when_quiet_and_the_faster_count_beside_neighbours():
    from pcd_tools.engine.passes.workers import ThreadFit

    busy = [False]
    fit = ThreadFit(2, lambda cpus: 1 if busy[0] else cpus)
    assert [fit.pick() for _ in range(3)] == [2, 2, 2]
    fit.record(2, 1.0, 100)  # quiet requests teach it nothing
    assert fit.tuner.times == {}

    busy[0] = True
    speed = {1: 0.01, 2: 0.05}  # seconds per token: one thread is faster here
    tried = []
    for _ in range(40):
        t = fit.pick()
        tried.append(t)
        fit.record(t, speed[t] * 100, 100)
    assert tried[:4] == [1, 1, 2, 2]  # each count twice first
    later = tried[4:]
    assert later.count(1) > later.count(2) >= 1  # the faster one, the other now and then

    speed = {1: 0.09, 2: 0.02}  # the neighbour changed: two threads are faster now
    for _ in range(48):
        t = fit.pick()
        fit.record(t, speed[t] * 100, 100)
    assert [fit.pick() for _ in range(5)].count(2) >= 4

    busy[0] = False
    assert fit.pick() == 2
    assert ThreadFit(1, lambda cpus: 1).pick() == 1
