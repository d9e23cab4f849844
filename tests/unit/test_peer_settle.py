"""`baselines.llama_cpp.settle`: the benchmarks wait after each llama.cpp call until no
other thread of the process uses the CPU (its OpenMP threads spin on after it)."""

from __future__ import annotations

import threading
import time

import pytest

from pcd_tools.baselines.llama_cpp import settle

pytestmark = pytest.mark.unit


def test_settle_waits_while_another_thread_spins_and_not_after():
    stop = time.perf_counter() + 0.6

    def spin() -> None:  # a busy thread, as llama.cpp's spinning ones
        x = 0
        while time.perf_counter() < stop:
            x += 1

    t = threading.Thread(target=spin)
    t.start()
    waited = settle(max_s=5.0)
    t.join()
    assert waited >= 0.45  # it waited for the spinning to end
    assert settle(max_s=5.0) < 0.4  # an idle process settles in its first windows


def test_settle_gives_up_after_max_s():
    stop = time.perf_counter() + 1.0

    def spin() -> None:
        while time.perf_counter() < stop:
            pass

    t = threading.Thread(target=spin)
    t.start()
    waited = settle(max_s=0.3)
    t.join()
    assert 0.25 <= waited < 0.8
