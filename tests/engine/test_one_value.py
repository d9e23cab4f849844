"""A field with one allowed value is a field like any other: in the prompt and the JSON,
scored in the same pass, its probability 1 by definition (PCD's probabilities are
relative to the allowed values); the Python API's every schema form agrees (README, "One
allowed value"). The other fields still equal one full prompt per candidate."""

from __future__ import annotations

import enum
from typing import Literal

import numpy as np
import pytest
from pydantic import BaseModel, Field

from pcd_tools import StructuredSchema, run_parallel_generation
from pcd_tools.errors import TooFewChoicesError
from pcd_tools.schema import compile_schema
from pcd_tools.schema.json_schema import compile_json_schema
from tests.engine.test_exactness import CONTEXT, _check
from tests.oracle import oracle_log_scores

pytestmark = pytest.mark.engine


class Team(enum.Enum):
    BILLING = "billing_team"


class Narrowed(BaseModel):
    """Route a ticket to one of the teams still open."""

    route: Literal["billing_team"] = Field(description="Team")
    level: int = Field(ge=3, le=3)
    team: Team
    priority: Literal["P0", "P1", "P2"]
    urgent: bool


class Full(BaseModel):
    """Route a ticket to one of the teams still open."""

    priority: Literal["P0", "P1", "P2"]
    urgent: bool


def _one_value(d, name, label):
    f = d.fields[name]
    assert f.label == label
    assert f.probability == 1.0 and f.distribution == {label: 1.0}
    assert f.margin == 1.0 and f.entropy == 0.0 and f.spec.cardinality == 1
    telemetry = d.to_response()["field_telemetry"][name]
    assert telemetry["cardinality"] == 1 and telemetry["confidence"] == 1.0


def test_one_value_fields_are_scored_in_the_same_pass(tiny):
    d = tiny.decide(Narrowed, CONTEXT)
    _one_value(d, "route", "billing_team")
    _one_value(d, "level", 3)
    _one_value(d, "team", "billing_team")
    assert d.value.route == "billing_team" and d.value.level == 3 and d.value.team is Team.BILLING
    assert d.sequential_forward_passes == 2  # the prefill and one pass, as without them
    assert _check(tiny, Narrowed, CONTEXT, fields={"priority", "urgent"}) < 1e-4
    # the model sees them: listed in the system turn, and each one is a question of the pass
    preview = tiny.prompt(Narrowed, CONTEXT)
    assert '"route": Team\n  allowed values: "billing_team"' in preview.text
    assert preview.field_suffixes["route"] == '\n  "route": '
    plan = tiny.engine.plan(compile_schema(Narrowed))
    assert [q.field for q in plan.questions] == ["route", "level", "team", "priority", "urgent"]
    # its log score is the log-probability of its last token after the rest of its text
    text = '\n  "route": "billing_team",'
    z = oracle_log_scores(
        tiny, compile_schema(Narrowed), CONTEXT, "route", texts=[text, text[:-1] + "}"]
    )
    assert d.fields["route"].log_scores == pytest.approx((z[0],), abs=1e-3)


@pytest.mark.parametrize("scoring", ["full", "constrained", "pmi"])
def test_every_scoring_and_orders_give_probability_one(tiny, scoring):
    d = tiny.decide(Narrowed, CONTEXT, scoring=scoring, orders=2)
    _one_value(d, "route", "billing_team")


def test_a_parent_with_one_value_is_written_before_its_child(tiny):
    class Dep(BaseModel):
        route: Literal["billing_team"]
        urgent: bool = Field(json_schema_extra={"depends_on": ["route"]})

    d = tiny.decide(Dep, CONTEXT)
    texts = [f'\n  "route": "billing_team",\n  "urgent": {v},' for v in ("true", "false")]
    z = oracle_log_scores(tiny, compile_schema(Dep), CONTEXT, "urgent", texts=texts)
    np.testing.assert_allclose(d.fields["urgent"].log_scores, z, atol=1e-3, rtol=0)
    assert d.sequential_forward_passes == 3


def test_dict_spec_and_json_schema_forms_agree_with_the_model(tiny):
    dict_form = StructuredSchema(
        {"route": {"type": "enum", "choices": ["billing_team"]}, "urgent": {"type": "boolean"}}
    )
    json_form = compile_json_schema(
        {
            "type": "object",
            "properties": {"route": {"const": "billing_team"}, "urgent": {"type": "boolean"}},
            "required": ["route", "urgent"],
        }
    )
    for schema in (dict_form.schema, json_form):
        assert schema.field("route").labels == ["billing_team"]
        d = tiny.decide(schema, CONTEXT)
        _one_value(d, "route", "billing_team")
    resp = run_parallel_generation(CONTEXT, dict_form, decider=tiny)  # the seed's dict
    assert resp["parsed_json"]["route"] == {"value": "billing_team", "prob": 1.0}


def test_no_value_at_all_is_still_refused():
    with pytest.raises(TooFewChoicesError) as e:
        StructuredSchema({"route": {"type": "enum", "choices": []}})
    assert str(e.value) == (
        "StructuredSchema.route: 0 choice(s) given in choices []; accepted: at least 1 choice "
        "per field."
    )
