"""pytest-benchmark fixtures. Not part of the normal test run (`testpaths = ["tests"]`).

Run with::

    python -m pytest benchmarks --benchmark-only            # all scenarios
    python -m pytest benchmarks --benchmark-only -k triage  # one scenario

`PCD_BENCH_ROUNDS` sets the timed rounds per benchmark (default 5, after one warm-up).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROUNDS = int(os.environ.get("PCD_BENCH_ROUNDS", "5"))
SCENARIO_DIR = Path(__file__).parent / "scenarios"


@pytest.fixture(scope="session")
def scenarios():
    from pcd_tools.bench.run import load_scenarios

    return load_scenarios(SCENARIO_DIR)


@pytest.fixture(scope="session")
def decider():
    from pcd_tools import Decider

    return Decider.load(os.environ.get("PCD_BENCH_MODEL") or None)


def run_pedantic(benchmark, fn, *, setup=None):
    """Times `fn` for ROUNDS rounds after one warm-up round; returns its last result."""
    return benchmark.pedantic(fn, setup=setup, rounds=ROUNDS, iterations=1, warmup_rounds=1)
