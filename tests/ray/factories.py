"""Model factories that run inside Ray workers (importable there: see conftest)."""

from __future__ import annotations

import time

from tests.conftest import tiny_decider

REGISTRY = "pcd-test-registry"
NAMESPACE = "pcd-tests"


def registering_slow_tiny():
    """The tiny model, slowed to 0.15 s per batch; the actor registers its handle first.

    The registry lets a test find and kill a Ray Data actor mid-job, and see it come back
    (its constructor runs again, so it registers twice).
    """
    import ray

    ctx = ray.get_runtime_context()
    registry = ray.get_actor(REGISTRY, namespace=NAMESPACE)
    ray.get(registry.add.remote(ctx.get_actor_id(), ctx.current_actor))
    decider = tiny_decider(0)
    decide_many = decider.decide_many

    def slow(*args, **kwargs):
        time.sleep(0.15)
        return decide_many(*args, **kwargs)

    decider.decide_many = slow  # type: ignore[method-assign]
    return decider
