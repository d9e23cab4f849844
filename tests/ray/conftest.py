"""Ray, started once for the whole test session (`ray.init(num_cpus=2)`) and stopped at the end.

The workers import the tests package (the tiny model's factory lives in `tests.conftest`),
so the repository root is put on their `PYTHONPATH`.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def ray_session():
    ray = pytest.importorskip("ray")
    pytest.importorskip("pyarrow")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=256 * 1024 * 1024,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    try:
        yield ray
    finally:
        try:
            from ray import serve

            serve.shutdown()
        finally:
            ray.shutdown()


@pytest.fixture(scope="session")
def tiny_factory():
    """What an actor or replica loads: the tiny random-weight model, built in the worker."""
    from tests.conftest import tiny_decider

    return functools.partial(tiny_decider, 0)
