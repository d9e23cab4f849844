"""PCD per scenario: cold (schema prefix not cached), warm, the bare-prefill floor, throughput."""

from __future__ import annotations

import pytest
from conftest import run_pedantic

from pcd_tools.schema import compile_schema

NAMES = ["fraud", "security_audit", "tariff", "triage"]


@pytest.mark.parametrize("name", NAMES)
def test_pcd_warm(benchmark, decider, scenarios, name):
    sc = scenarios[name]
    schema = compile_schema(sc.schema)
    d = run_pedantic(benchmark, lambda: decider.decide(schema, sc.context))
    benchmark.extra_info.update(
        prefill_ms=d.prefill_ms,
        suffix_eval_ms=d.suffix_eval_ms,
        passes=d.sequential_forward_passes,
        prompt_tokens=d.prompt_tokens,
    )


@pytest.mark.parametrize("name", NAMES)
def test_pcd_cold(benchmark, decider, scenarios, name):
    sc = scenarios[name]
    schema = compile_schema(sc.schema)

    def forget_prefix():
        decider.engine.clear_cache()
        decider.engine.plan(schema)  # the token plan stays cached, as in production

    d = run_pedantic(benchmark, lambda: decider.decide(schema, sc.context), setup=forget_prefix)
    assert not d.prefix_cache_hit
    benchmark.extra_info.update(prefill_ms=d.prefill_ms, suffix_eval_ms=d.suffix_eval_ms)


@pytest.mark.parametrize("name", NAMES)
def test_bare_prefill(benchmark, decider, scenarios, name):
    from pcd_tools.baselines.generation import bare_prefill_ms

    sc = scenarios[name]
    schema = compile_schema(sc.schema)
    run_pedantic(benchmark, lambda: bare_prefill_ms(decider, schema, sc.context))


@pytest.mark.parametrize("mode", ["sequential", "decide_many"])
def test_triage_throughput(benchmark, decider, scenarios, mode):
    sc = scenarios["triage"]
    schema = compile_schema(sc.schema)
    ctxs = [sc.contexts[i % len(sc.contexts)] for i in range(32)]
    if mode == "sequential":
        run_pedantic(benchmark, lambda: [decider.decide(schema, c) for c in ctxs])
    else:
        run_pedantic(benchmark, lambda: decider.decide_many(schema, ctxs))
    benchmark.extra_info["contexts"] = len(ctxs)
