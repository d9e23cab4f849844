"""`Cascade(escalate_when="set_size>1")`: escalate exactly the fields whose split conformal
prediction set has more than one answer; the human stage receives the sets."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, Field

from pcd_tools.agents import Cascade, DeciderStage, HumanStage
from pcd_tools.answers.calibration import Calibration
from pcd_tools.answers.conformal import CoverageError, NoConformalScoresError
from pcd_tools.errors import InvalidArgumentError
from pcd_tools.schema import compile_schema
from tests.conftest import tiny_decider
from tests.schemas import Ticket

pytestmark = pytest.mark.langchain

TEXT = "The invoice charged us twice and nobody answers the phone."


def _calibrated(decider, scores):
    """The tiny decider with a calibration whose conformal scores are `scores` per field."""
    schema = compile_schema(Ticket)
    cal = Calibration(
        model_id=decider.model_id,
        schema_name=schema.name,
        schema_fingerprint=schema.fingerprint(),
        temperatures={},
        conformal={
            n: {"score": "lac", "n": len(s), "scores": sorted(s)} for n, s in scores.items()
        },
    )
    return decider.with_calibration(cal)


@pytest.fixture(scope="module")
def small():
    return tiny_decider(0)


class Asker:
    def __init__(self):
        self.requests = []

    def __call__(self, request):
        self.requests.append(request)
        return {n: request.candidates[n][-1] for n in request.fields}


def test_escalates_exactly_the_fields_whose_set_has_more_than_one_answer(small):
    # threshold 1e-6 keeps only answers with p >= 1 - 1e-6: a set of one (the top answer);
    # threshold 0.999999 keeps every answer with p >= 1e-6: the whole field
    tight, loose = [1e-6] * 19, [0.999999] * 19
    d = _calibrated(small, {"priority": loose, "requires_escalation": tight, "department": loose})
    first = d.decide(Ticket, TEXT)
    want = {
        n
        for n in ("priority", "requires_escalation", "department")
        if len(first.fields[n].prediction_set(0.9)) > 1
    }
    assert want == {"priority", "department"}
    human = Asker()
    res = Cascade(
        Ticket, [DeciderStage(d, name="small"), HumanStage(human)], escalate_when="set_size>1"
    ).invoke(TEXT)
    assert res.stages[0].escalated == ["priority", "department"]
    assert res.decided_by == {
        "priority": "human",
        "requires_escalation": "small",
        "department": "human",
    }
    (req,) = human.requests
    assert req.coverage == 0.9
    assert req.prediction_sets == {
        n: first.fields[n].prediction_set(0.9) for n in ("priority", "department")
    }
    payload = HumanStage.payload(req)
    assert payload["fields"]["priority"]["prediction_set"] == req.prediction_sets["priority"]
    assert payload["fields"]["priority"]["coverage"] == 0.9


def test_the_cascade_coverage_decides_the_set(small):
    # 19 scores 0.05 .. 0.95: coverage 0.5 -> q = 0.5 (p >= 0.5), 0.95 -> q = 0.95
    scores = [0.05 * i for i in range(1, 20)]
    d = _calibrated(
        small, {"priority": scores, "requires_escalation": scores, "department": scores}
    )
    dec = d.decide(Ticket, TEXT)
    got = {}
    for cov in (0.5, 0.95):
        want = [
            n
            for n in ("priority", "requires_escalation", "department")
            if len(dec.fields[n].prediction_set(cov)) > 1
        ]
        res = Cascade(
            Ticket,
            [DeciderStage(d, name="small"), HumanStage(Asker())],
            escalate_when="set_size>1",
            coverage=cov,
        ).invoke(TEXT)
        assert res.stages[0].escalated == want
        got[cov] = want
    # the tiny model's tops: P3_LOW 0.91 (P1_HIGH 0.09), True 0.95, ACCOUNT 0.9985: at
    # 0.5 every set is its top answer (p >= 0.5); at 0.95 the runners-up with p >= 0.05 join
    assert got == {0.5: [], 0.95: ["priority", "requires_escalation"]}


def test_a_stage_without_conformal_scores_is_a_typed_error(small):
    c = Cascade(Ticket, [small, HumanStage(Asker())], escalate_when="set_size>1")
    with pytest.raises(NoConformalScoresError, match="pcd calibrate"):
        c.invoke(TEXT)


@pytest.mark.parametrize("bad", [0, 1.0, 90, -0.5, True, "0.9"])
def test_bad_coverage_is_a_typed_error(small, bad):
    with pytest.raises(CoverageError, match=r"Cascade\(coverage=\)"):
        Cascade(Ticket, [small], escalate_when="set_size>1", coverage=bad)
    assert issubclass(CoverageError, InvalidArgumentError)


def test_bad_rules_are_typed_errors(small):
    with pytest.raises(InvalidArgumentError, match="escalate_when='set_size>2'"):
        Cascade(Ticket, [small], escalate_when="set_size>2")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="per_field"):
        Cascade(Ticket, [small], per_field={"priority": 0.5}, escalate_when="set_size>1")

    class Tags(BaseModel):
        tags: list[Literal["a", "b", "c"]] = Field(description="Tags")

    with pytest.raises(InvalidArgumentError, match="multi-label"):
        Cascade(Tags, [small], escalate_when="set_size>1")
