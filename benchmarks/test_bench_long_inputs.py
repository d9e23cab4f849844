"""Long inputs (`pcd_tools.bench.long_inputs`, issue 53): a short sweep, 256 and 1,024 context tokens of
a support thread, the small schema (one bool, one 4-way field), on the suite's model (the
embedded one unless `PCD_BENCH_MODEL`). Per length: PCD warm, PCD cold, PCD's warm floor
(`warm_prefill_ms`), llama.cpp's eval of the same uncached tokens and its grammar decision
(skipped without the `peer` extra or a GGUF model). Every round reads a new context (a new
leading line) of exactly that many tokens; each method's own time is in `extra_info["ms"]`
(the llama.cpp decision's pytest-benchmark time also holds the peer's `settle()` after it).
"""

from __future__ import annotations

import itertools

import pytest
from conftest import run_pedantic

from pcd_tools.bench.long_inputs import METHODS, LongThread, Sweep, build_context, make_peer
from pcd_tools.schema import compile_schema

LENGTHS = [256, 1024]


@pytest.fixture(scope="module")
def sweep(decider):
    schema = compile_schema(LongThread)
    peer, why = make_peer(decider, schema, max(LENGTHS))
    return Sweep(decider, schema, peer), why


@pytest.mark.parametrize("tokens", LENGTHS)
@pytest.mark.parametrize("method", METHODS)
def test_long_input(benchmark, sweep, method, tokens):
    s, why = sweep
    if method not in s.methods:
        pytest.skip(why or "llama.cpp peer unavailable")
    too_long = s.fits(tokens)
    if too_long:
        pytest.skip(too_long)
    encode, decode = s.engine.encode_ids, s.decider.loaded.tokenizer.decode
    rounds = itertools.count()
    rows = []

    def setup():
        ctx, n = build_context(encode, decode, tokens, 0, next(rounds))
        assert n == tokens
        s.prepare(method)
        return (ctx,), {}

    def call(ctx):
        rows.append(s.run(method, ctx))
        return rows[-1]

    row = run_pedantic(benchmark, call, setup=setup)
    benchmark.extra_info.update(
        tokens=tokens,
        ms=[r["ms"] for r in rows[1:]],
        **{k: row[k] for k in ("hit", "answer") if k in row},
    )
    if method == "pcd_warm":
        assert all(r["hit"] for r in rows)
    if method == "pcd_cold":
        assert not any(r["hit"] for r in rows)
