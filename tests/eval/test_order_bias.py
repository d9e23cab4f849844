"""Order bias: the listing orders, the flip rate, and averaging over orders."""

from __future__ import annotations

import numpy as np
import pytest

from pcd_tools.answers.calibration import CalibrationError
from pcd_tools.eval.order_bias import decide_orderings, order_bias
from pcd_tools.schema import compile_schema
from tests.eval.helpers import SCHEMA, TEXTS


@pytest.mark.unit
def test_rotation_orders_spread_every_value_over_the_list():
    from pcd_tools.eval.order_bias import _orderings

    schema = compile_schema(
        {
            "intent": {"type": "enum", "choices": [f"c{i}" for i in range(77)]},
            "ok": {"type": "boolean"},
        }
    )
    for first in ("identity", "reverse"):
        orders = _orderings(schema, 4, 0, first, "rotations")
        assert len(orders) == 4
        lists = [o["intent"] for o in orders]
        assert all(sorted(x) == list(range(77)) for x in lists)  # each is a permutation
        assert len({tuple(x) for x in lists}) == 4
        mean_pos = np.mean([[x.index(c) for c in range(77)] for x in lists], axis=0)
        assert np.abs(mean_pos - 38).max() <= 10  # no value stays at the top or bottom
    fwd = {tuple(o["intent"]) for o in _orderings(schema, 4, 0, "identity", "rotations")}
    rev = {tuple(o["intent"]) for o in _orderings(schema, 4, 0, "reverse", "rotations")}
    assert not fwd & rev  # the averaged flip rate compares disjoint sets of orders
    # a boolean's two rotations are its two orders, whichever listing they start from
    assert [o["ok"] for o in _orderings(schema, 2, 0, "identity", "rotations")] == [[0, 1], [1, 0]]
    assert [o["ok"] for o in _orderings(schema, 2, 0, "reverse", "rotations")] == [[1, 0], [0, 1]]
    four = [o["ok"] for o in _orderings(schema, 4, 0, "identity", "rotations")]
    assert sorted(four) == [[0, 1], [0, 1], [1, 0], [1, 0]]  # balanced for any k
    rnd = _orderings(schema, 3, 5, "identity", "random")
    assert rnd[0]["intent"] == list(range(77)) and rnd == _orderings(
        schema, 3, 5, "identity", "random"
    )
    with pytest.raises(CalibrationError, match="unknown order design"):
        _orderings(schema, 2, 0, "identity", "latin")


@pytest.mark.engine
def test_order_bias_and_averaging(tiny):
    rep = order_bias(SCHEMA, TEXTS[:3], decider=tiny, k=3, seed=0, batch_size=3)
    assert rep.n == 3 and rep.k == 3
    assert set(rep.flip_rate) == {"mood", "urgent"}
    assert all(0.0 <= v <= 1.0 for v in rep.flip_rate.values())
    assert set(rep.flip_rate_averaged) == {"mood", "urgent"}
    # each order costs its own prefill and field pass (more when its prefix is not cached)
    assert rep.passes_per_call["averaged"] >= 3 * 2
    assert rep.passes_per_call["averaged"] > 2 * rep.passes_per_call["single"]
    avg = decide_orderings(tiny, SCHEMA, TEXTS[:2], k=2, seed=0)
    one = tiny.decide_many(SCHEMA, TEXTS[:2])
    rev = tiny.decide_many(SCHEMA, TEXTS[:2], choice_order={"mood": [2, 1, 0], "urgent": [1, 0]})
    for i in range(2):
        for name in ("mood", "urgent"):
            p = avg[i].fields[name].distribution
            assert sum(p.values()) == pytest.approx(1.0)
        assert avg[i].sequential_forward_passes >= 2 * one[i].sequential_forward_passes
    # with explicit orders, the average is exactly the mean of the two runs
    both = decide_orderings(
        tiny, SCHEMA, TEXTS[:2], orderings=[{}, {"mood": [2, 1, 0], "urgent": [1, 0]}]
    )
    for i in range(2):
        for c in ("calm", "angry", "sad"):
            mean = (
                one[i].fields["mood"].distribution[c] + rev[i].fields["mood"].distribution[c]
            ) / 2
            assert both[i].fields["mood"].distribution[c] == pytest.approx(mean, abs=1e-12)
