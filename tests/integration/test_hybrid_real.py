"""Generated fields on the embedded model: reason, then route, on one cache."""

from __future__ import annotations

import json
from typing import Literal

import numpy as np
import pytest
from pydantic import BaseModel, Field

from pcd_tools.prompt import candidate_text, terminator_for
from pcd_tools.schema import compile_schema
from tests.oracle import log_softmax, prompt_ids, softmax

pytestmark = pytest.mark.integration

TEXT = "I was charged twice for my subscription this month, please refund one payment."


class Route(BaseModel):
    """Route a customer support message to the right team."""

    reason: str = Field(max_length=48, description="One short sentence on what the customer needs")
    route: Literal["billing", "technical", "sales"] = Field(description="The team that handles it")


def test_with_structured_output_reasons_then_routes_with_the_route_probability(real):
    runnable = real.with_structured_output(Route, include_raw=True, max_new_tokens=24)
    out = runnable.invoke(TEXT)
    parsed, meta = out["parsed"], out["raw"].response_metadata
    assert isinstance(parsed, Route) and len(parsed.reason) <= 48
    dist = meta["distributions"]["route"]
    assert set(dist) == {"billing", "technical", "sales"} and abs(sum(dist.values()) - 1) < 1e-9
    assert meta["probabilities"]["route"] == dist[parsed.route] == max(dist.values())
    assert meta["probabilities"]["reason"] is None
    assert json.loads(meta["pcd"]["json_text"]) == parsed.model_dump()


def test_the_route_scored_after_the_reason_equals_one_full_prompt_per_route(real):
    from pcd_tools.engine.host.blas import import_mlx

    mx = import_mlx()
    d = real.decide(Route, TEXT, max_new_tokens=24)
    gen, scored = d.segments
    assert (gen.kind, scored.kind) == ("generated", "scored")
    assert scored.prefix == gen.text == f'\n  "reason": {json.dumps(d.value.reason)},'
    sch = compile_schema(Route)
    f = sch.field("route")
    head = prompt_ids(real, sch, TEXT) + list(gen.token_ids)  # the ids the cache holds
    seqs = [
        real.engine.encode_ids(candidate_text(f, c.literal, terminator_for(sch))) for c in f.choices
    ]
    k = 0
    while all(len(s) > k and s[k] == seqs[0][k] for s in seqs):
        k += 1
    z = []
    for s in seqs:  # one full prompt per route, no cache
        logits = real.engine.model(mx.array([head + s])).astype(mx.float32)[0]
        logp = log_softmax(logits)
        z.append(sum(logp[len(head) + t - 1, s[t]] for t in range(k, len(s))))
    got = np.array(list(d.fields["route"].distribution.values()))
    assert np.abs(got - softmax(np.array(z))).max() < 1e-4
    assert d.fields["route"].probability == got.max()
    assert d.fields["reason"].probability is None and d.fields["reason"].tokens <= 24
