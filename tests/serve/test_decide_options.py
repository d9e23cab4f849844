"""`/v1/decide` options (`orders`, `allow_empty`) and empty contexts on both endpoints."""

from __future__ import annotations

import httpx
import pytest

from pcd_tools import StructuredSchema
from pcd_tools.serve.app import create_app

pytestmark = pytest.mark.serve

SCHEMA = {
    "priority": {"type": "enum", "choices": ["P0", "P1", "P2", "P3"], "description": "Urgency"},
    "escalate": {"type": "boolean", "description": "Page on-call?"},
}
QUESTIONS = {"billing": {"type": "noul", "instructions": "Is this about billing?"}}
TEXT = "Checkout is down for all EU customers."


@pytest.fixture(scope="module")
def url(tiny, live):
    with live(create_app(tiny)) as base:
        yield base


def _decide(url, **body):
    return httpx.post(url + "/v1/decide", json={"schema": SCHEMA, **body})


def _error(r, status=422):
    assert r.status_code == status, r.text
    return r.json()["error"]


def test_orders_are_averaged_like_the_library(url, tiny):
    r = _decide(url, context=TEXT, orders=2)
    assert r.status_code == 200, r.text
    got = r.json()
    want = tiny.decide(StructuredSchema(SCHEMA), TEXT, orders=2)
    one = tiny.decide(StructuredSchema(SCHEMA), TEXT)
    assert got["orders"] == 2
    assert got["flip_rate"] == want.flip_rate
    for name, f in want.fields.items():
        top = {c["choice"]: c["probability"] for c in got["field_telemetry"][name]["top_choices"]}
        for label, p in f.distribution.items():
            assert top[label] == pytest.approx(p, abs=1e-5)
    # averaging changed the answer's distribution, so the comparison above is not vacuous
    assert abs(want.fields["priority"].probability - one.fields["priority"].probability) > 1e-3
    plain = _decide(url, context=TEXT).json()
    assert plain["orders"] == 1 and plain["flip_rate"] is None
    assert plain["batch"]["size"] >= 1


@pytest.mark.parametrize("bad", [0, -3, 1.5, "2", True, None])
def test_bad_orders_is_422_naming_orders(url, bad):
    err = _error(_decide(url, context=TEXT, orders=bad))
    assert err["field"] == "orders"
    assert "orders must be an int >= 1" in err["message"]


def test_orders_over_the_server_limit_is_422(url):
    from pcd_tools.serve.native import MAX_ORDERS

    err = _error(_decide(url, context=TEXT, orders=MAX_ORDERS + 1))
    assert err["field"] == "orders"
    assert f"limit of {MAX_ORDERS}" in err["message"]
    assert _decide(url, context=TEXT, orders=MAX_ORDERS).status_code == 200


def test_unknown_key_lists_the_new_options(url):
    err = _error(_decide(url, context=TEXT, order=2))
    assert "'allow_empty'" in err["message"] and "'orders'" in err["message"]


@pytest.mark.parametrize("context", ["", "   \n\t "])
def test_empty_context_is_422_naming_context(url, context):
    err = _error(_decide(url, context=context))
    assert err["field"] == "context"
    assert "empty or only whitespace" in err["message"] and "allow_empty" in err["message"]


@pytest.mark.parametrize("context", ["", "   "])
def test_allow_empty_decides_anyway(url, tiny, context):
    r = _decide(url, context=context, allow_empty=True)
    assert r.status_code == 200, r.text
    want = tiny.decide(StructuredSchema(SCHEMA), context, allow_empty=True)
    got = r.json()["parsed_json"]
    assert {k: v["value"] for k, v in got.items()} == {n: f.label for n, f in want.fields.items()}


def test_allow_empty_must_be_a_boolean(url):
    err = _error(_decide(url, context=TEXT, allow_empty="yes"))
    assert err["field"] == "allow_empty"


@pytest.mark.parametrize("state", ["", "  \n ", [], ["", ""]])
def test_empty_systemone_state_is_422_naming_state(url, state):
    r = httpx.post(url + "/v1/systemone", json={"state": state, "questions": QUESTIONS})
    err = _error(r)
    assert err["field"] == "state"
    assert "empty or only whitespace" in err["message"]


CODES = {"code": {"type": "enum", "choices": [f"{a}{b}x" for a in "0123456789" for b in "abcdef"]}}


def test_pruning_is_passed_through_and_reported(url, tiny):
    r = httpx.post(url + "/v1/decide", json={"schema": CODES, "context": TEXT, "pruning": "on"})
    assert r.status_code == 200, r.text
    got = r.json()["field_telemetry"]["code"]
    # the server's default scoring is the Python API's ("auto")
    want = tiny.decide(StructuredSchema(CODES), TEXT, pruning="on").fields["code"]
    assert got["certified"] is want.certified is True
    assert got["probability_bounds"] == pytest.approx(list(want.probability_bounds), abs=1e-5)
    off = httpx.post(url + "/v1/decide", json={"schema": CODES, "context": TEXT, "pruning": "off"})
    assert "certified" not in off.json()["field_telemetry"]["code"]


@pytest.mark.parametrize(
    ("extra", "says"),
    [({"pruning": "yes"}, "accepted: 'auto'"), ({"pruning": "on", "orders": 2}, "orders=2")],
)
def test_bad_pruning_is_422_naming_pruning(url, extra, says):
    err = _error(_decide(url, context=TEXT, **extra))
    assert err["field"] == "pruning" and says in err["message"]


def test_auto_scoring_is_accepted_and_matches_the_python_api(url, tiny):
    r = httpx.post(url + "/v1/decide", json={"schema": CODES, "context": TEXT, "scoring": "auto"})
    assert r.status_code == 200, r.text
    got = r.json()["field_telemetry"]["code"]
    want = tiny.decide(StructuredSchema(CODES), TEXT).fields["code"]  # the API's default
    assert want.scoring == "constrained"
    top = {c["choice"]: c["probability"] for c in got["top_choices"]}
    assert top and all(top[k] == pytest.approx(want.distribution[k], abs=1e-5) for k in top)
    body = {"schema": CODES, "context": TEXT, "scoring": "full"}
    full = httpx.post(url + "/v1/decide", json=body).json()
    other = {c["choice"]: c["probability"] for c in full["field_telemetry"]["code"]["top_choices"]}
    assert max(abs(other[k] - top[k]) for k in top if k in other) > 1e-3  # "full" differs


def test_a_request_without_scoring_scores_as_the_python_apis_auto(url, tiny):
    # issue 52: the server's default scoring was "full" where `decide`'s is "auto"
    r = httpx.post(url + "/v1/decide", json={"schema": CODES, "context": TEXT})
    assert r.status_code == 200, r.text
    got = r.json()["field_telemetry"]["code"]
    want = tiny.decide(StructuredSchema(CODES), TEXT, scoring="auto").fields["code"]
    assert want.scoring == "constrained"  # "auto" differs from "full" on this field
    top = {c["choice"]: c["probability"] for c in got["top_choices"]}
    assert top and all(top[k] == pytest.approx(want.distribution[k], abs=1e-5) for k in top)
