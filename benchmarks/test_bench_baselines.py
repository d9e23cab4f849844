"""Autoregressive baselines per scenario: greedy JSON and grammar-constrained JSON.

Both reuse a KV cache of the schema part of the prompt, as PCD's warm requests do.
"""

from __future__ import annotations

import pytest
from conftest import run_pedantic

from pcd_tools.baselines.generation import constrained_json, greedy_json
from pcd_tools.schema import compile_schema

NAMES = ["fraud", "security_audit", "tariff", "triage"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("method", ["greedy", "constrained"])
def test_autoregressive(benchmark, decider, scenarios, name, method):
    sc = scenarios[name]
    schema = compile_schema(sc.schema)
    fn = greedy_json if method == "greedy" else constrained_json
    r = run_pedantic(benchmark, lambda: fn(decider, schema, sc.context))
    benchmark.extra_info.update(
        tokens=r.tokens,
        passes=r.passes,
        prefill_ms=r.prefill_ms,
        is_valid_json=r.is_valid_json,
        schema_match=r.schema_match,
    )
    if method == "constrained":
        assert r.schema_match
