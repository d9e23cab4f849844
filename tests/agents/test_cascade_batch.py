"""`Cascade.batch` escalates a batch's low-confidence rows together, and
`Cascade(threshold="fitted")` reads thresholds fitted to a target."""

from __future__ import annotations

from typing import Any

import pytest

from pcd_tools.agents import Cascade, DeciderStage
from pcd_tools.answers.calibration import Calibration
from pcd_tools.errors import InvalidArgumentError
from pcd_tools.schema import compile_schema
from tests.conftest import tiny_decider
from tests.schemas import Ticket

pytestmark = pytest.mark.langchain

TEXTS = [
    "The invoice charged us twice and nobody answers the phone.",
    "Production is down for every customer in Europe.",
    "Please update the billing address on my account.",
    "Can you add dark mode to the dashboard?",
    "Our SSO login fails with error 500 since this morning.",
]


class Counting:
    """A Decider that counts its `decide` and `decide_many` calls."""

    def __init__(self, decider: Any):
        self._d = decider
        self.calls: list[tuple[str, int, tuple[str, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._d, name)

    def decide(self, schema: Any, text: str, **kw: Any) -> Any:
        self.calls.append(("decide", 1, tuple(compile_schema(schema).field_names)))
        return self._d.decide(schema, text, **kw)

    def decide_many(self, schema: Any, texts: Any, **kw: Any) -> Any:
        self.calls.append(("decide_many", len(texts), tuple(compile_schema(schema).field_names)))
        return self._d.decide_many(schema, texts, **kw)


@pytest.fixture(scope="module")
def pair():
    return tiny_decider(0), tiny_decider(1)


def _cascade(small, large, **kw):
    # each field's threshold at the median of its first-stage probabilities over TEXTS, so
    # that rows escalate different sets of fields
    ds = small.decide_many(Ticket, TEXTS)
    mid = len(TEXTS) // 2  # halfway between two rows: no row sits on its threshold
    per_field = {
        n: sum(sorted(d.fields[n].probability for d in ds)[mid - 1 : mid + 1]) / 2
        for n in ds[0].fields
    }
    return Cascade(
        Ticket,
        [DeciderStage(small, name="small"), DeciderStage(large, name="large")],
        per_field=per_field,
        **kw,
    )


def test_batch_answers_each_row_as_invoke_does(pair):
    small, large = pair
    casc = _cascade(small, large)
    one = [casc.invoke(t) for t in TEXTS]
    many = casc.batch(TEXTS)
    for a, b in zip(one, many):
        assert a.decided_by == b.decided_by
        assert {n: f.label for n, f in a.fields.items()} == {
            n: f.label for n, f in b.fields.items()
        }
        for n in a.fields:
            pa, pb = a.probabilities[n], b.probabilities[n]
            assert (pa is None) == (pb is None)
            if pa is not None:
                assert pb == pytest.approx(pa, abs=1e-4)
        assert [s.asked for s in a.stages] == [s.asked for s in b.stages]
    assert any(len(r.stages) > 1 for r in many), "the thresholds must escalate some rows"


def test_escalated_rows_reach_the_large_model_in_one_call_per_narrowed_schema(pair):
    small, large = pair
    s, lg = Counting(small), Counting(large)
    casc = _cascade(s, lg)
    s.calls.clear()
    out = casc.batch(TEXTS)
    assert [c[0] for c in s.calls] == ["decide_many"] and s.calls[0][1] == len(TEXTS)
    escalated = {tuple(r.stages[0].escalated) for r in out if r.stages[0].escalated}
    assert escalated, "the thresholds must escalate some rows"
    # one batched call per distinct set of escalated fields, holding all its rows
    assert all(kind == "decide_many" for kind, _, _ in lg.calls)
    assert {names for _, _, names in lg.calls} == escalated
    assert sum(k for _, k, _ in lg.calls) == sum(1 for r in out if r.stages[0].escalated)
    # each row's stage time is its share of the batched call
    for r in out:
        assert r.stages[0].latency_ms > 0


def test_batch_returns_or_raises_a_rows_cascade_error():
    def nobody(req):
        raise RuntimeError("no one is here")

    casc = Cascade(Ticket, [nobody, nobody])
    out = casc.batch(TEXTS[:2], return_exceptions=True)
    assert all(type(o).__name__ == "CascadeError" for o in out)
    with pytest.raises(Exception, match="no stage answered"):
        casc.batch(TEXTS[:2])


def _with_cascade(decider, thresholds):
    fp = compile_schema(Ticket).fingerprint()
    cal = Calibration(decider.model_id, "Ticket", fp, {})
    cal.cascade = {
        "signal": "probability",
        "target": {"max_escalation": 0.3},
        "thresholds": {n: ["probability", t] for n, t in thresholds.items()},
    }
    return decider.with_calibration(cal)


def test_fitted_thresholds_come_from_the_first_stages_calibration(pair):
    small, large = pair
    th = {"priority": 0.41, "requires_escalation": 0.62, "department": 0.27}
    casc = Cascade(Ticket, [_with_cascade(small, th), large], threshold="fitted")
    assert casc.thresholds == {n: ("probability", t) for n, t in th.items()}
    # per_field still overrides one field
    casc2 = Cascade(
        Ticket, [_with_cascade(small, th), large], threshold="fitted", per_field={"priority": 0.9}
    )
    assert casc2.thresholds["priority"] == ("probability", 0.9)
    with pytest.raises(InvalidArgumentError, match="has no calibration"):
        Cascade(Ticket, [small, large], threshold="fitted")
    with pytest.raises(InvalidArgumentError, match=r"no threshold for \['department'\]"):
        Cascade(
            Ticket,
            [_with_cascade(small, {k: v for k, v in th.items() if k != "department"}), large],
            threshold="fitted",
        )


LABELLED = [
    (TEXTS[0], {"priority": "P2_NORMAL", "requires_escalation": False, "department": "BILLING"}),
    (TEXTS[1], {"priority": "P0_CRITICAL", "requires_escalation": True, "department": "TECHNICAL"}),
    (TEXTS[2], {"priority": "P3_LOW", "requires_escalation": False, "department": "BILLING"}),
    (TEXTS[3], {"priority": "P3_LOW", "requires_escalation": False, "department": "ACCOUNT"}),
    (TEXTS[4], {"priority": "P1_HIGH", "requires_escalation": True, "department": "TECHNICAL"}),
]


def test_fit_cascade_from_deciders_predicts_the_real_escalation(pair):
    from pcd_tools.eval.cascade import fit_cascade

    small, large = pair
    fit = fit_cascade(Ticket, small, large, LABELLED, max_escalation=0.4)
    assert fit.calibration["escalation"] <= 0.4
    out = Cascade(Ticket, [small, large], per_field=fit.per_field).batch(TEXTS)
    real = sum(1 for r in out if r.stages[0].escalated) / len(TEXTS)
    assert real == pytest.approx(fit.calibration["escalation"])
    per_field = {
        n: sum(n in r.stages[0].escalated for r in out) / len(TEXTS) for n in fit.per_field
    }
    assert per_field == pytest.approx(fit.calibration["field_escalation"])
    with pytest.raises(InvalidArgumentError, match="labelled"):
        fit_cascade(Ticket, small, large, max_escalation=0.4)
