"""Label sets beyond 255: a 255-label field against the 5,010 ISO 3166-2 subdivisions,
warm, on the same context; and the pruned search against the exhaustive pass on the 599
IANA time zones (small enough to read whole). `benchmarks/labels.py` has the full tables.
"""

from __future__ import annotations

import pytest
from conftest import run_pedantic
from labels import REGION_CONTEXTS, region_labels, region_schema, subset, zone_contexts, zone_schema

from pcd_tools.schema import compile_schema


@pytest.fixture(scope="module")
def region_fields():
    values = region_labels()
    small = subset(values, [g for _, g in REGION_CONTEXTS], 255)
    return {
        "255": compile_schema(region_schema(small, "Region255")),
        "5010": compile_schema(region_schema(values, "Region5010")),
    }


@pytest.mark.parametrize("size", ["255", "5010"])
def test_labels_size(benchmark, decider, region_fields, size):
    schema = region_fields[size]
    ctx = REGION_CONTEXTS[0][0]
    d = run_pedantic(benchmark, lambda: decider.decide(schema, ctx))
    f = d.fields["region"]
    benchmark.extra_info.update(
        labels=len(schema.fields[0].choices),
        read=f.search.read if f.search else None,
        positions=f.search.positions if f.search else None,
        prompt_tokens=d.prompt_tokens,
    )
    assert f.certified


def test_labels_zones_equal_exhaustive(benchmark, decider):
    schema = compile_schema(zone_schema("Zone"))
    ctxs = [c for c, _ in zone_contexts(2)]
    whole = [decider.decide(schema, c, pruning="off").fields["timezone"] for c in ctxs]
    got = run_pedantic(benchmark, lambda: [decider.decide(schema, c) for c in ctxs])
    for d, w in zip(got, whole):
        f = d.fields["timezone"]
        assert f.certified
        assert f.value == w.value
        lo, hi = f.probability_bounds
        assert lo - 1e-4 <= w.probability <= hi + 1e-4
    benchmark.extra_info.update(zones=len(schema.fields[0].choices), contexts=len(ctxs))
