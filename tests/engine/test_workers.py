"""The stream workers that run the concurrent parts of a pass."""

from __future__ import annotations

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
