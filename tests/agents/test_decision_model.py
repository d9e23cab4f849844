"""PCDDecisionModel: LangChain's BaseDecisionModel on the PCD engine."""

from __future__ import annotations

import asyncio
import math

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.decisions import BaseDecisionModel, Box, Choice, Noul, NoulCriteria, Score
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage

from pcd_tools.agents import PCDDecisionModel
from pcd_tools.errors import UnsupportedFieldError
from tests.agents.helpers import biased_decider, forcing

pytestmark = pytest.mark.langchain


@pytest.fixture(scope="module")
def forced_d():
    # The bias costs every other byte ~40 nats, so among equal-length labels with
    # disjoint letters the one starting with "d" wins: "deep" over "fast".
    return biased_decider(forcing("d"))


def test_is_a_base_decision_model(tiny_agents):
    dm = PCDDecisionModel(decider=tiny_agents)
    assert isinstance(dm, BaseDecisionModel)
    assert dm.model == "tiny-llama-0"
    assert dm._provider == "pcd_tools"


def test_choice_noul_score_answers(forced_d):
    dm = PCDDecisionModel(decider=forced_d)
    resp = dm.invoke(
        {
            "state": HumanMessage("Production is down, please help."),
            "questions": {
                "route": Choice(
                    instructions="Which model should answer?",
                    criteria={"fast": "Simple tasks.", "deep": "Hard tasks."},
                ),
                "urgent": Noul(
                    instructions="Is this urgent?",
                    criteria=NoulCriteria(true="Needs action now", false="Can wait"),
                ),
                "severity": Score(instructions="How severe?", criteria=["low", "mid", "high"]),
            },
        }
    )
    assert list(resp.answers) == ["route", "urgent", "severity"]
    route = resp.choices["route"]
    assert route.choice == "deep"
    assert set(route.probabilities) == {"fast", "deep"}
    assert math.isclose(sum(route.probabilities.values()), 1.0, abs_tol=1e-9)
    assert route.confidence == route.probabilities["deep"]
    noul = resp.nouls["urgent"].noul
    assert 0.0 <= noul <= 1.0
    sev = resp.scores["severity"]
    assert sev.legend == {0: "low", 1: "mid", 2: "high"}
    assert set(sev.probabilities) == {0, 1, 2}
    mean = sum(k * p for k, p in sev.probabilities.items())
    assert math.isclose(sev.score, mean, rel_tol=1e-12)
    var = sum(p * (k - mean) ** 2 for k, p in sev.probabilities.items())
    assert math.isclose(sev.confidence, max(0.0, 1 - var / 1.0), abs_tol=1e-12)
    assert resp.model == "tiny-biased-0"
    assert resp.usage is not None and resp.usage["input_tokens"] > 0


def test_noul_is_probability_of_true(tiny_agents):
    dm = PCDDecisionModel(decider=tiny_agents)
    q = Noul(instructions="Is it urgent?")
    resp = dm.invoke({"state": "hello", "questions": {"urgent": q}})
    d = tiny_agents.decide({"urgent": {"type": "boolean", "description": "Is it urgent?"}}, "hello")
    # same prompt modulo instructions: compare against the model's own boolean distribution
    assert 0.0 <= resp.nouls["urgent"].noul <= 1.0
    assert d.fields["urgent"].distribution[True] + d.fields["urgent"].distribution[False] == (
        pytest.approx(1.0)
    )


def test_a_one_label_choice_is_scored_like_the_python_api_answers_it(tiny_agents):
    # LangChain's Choice accepts one label; it is a field of the same pass, with
    # probability 1 (README, "One allowed value"), as the Python API and servers answer it
    dm = PCDDecisionModel(decider=tiny_agents)
    questions = {
        "only": Choice(instructions="pick", criteria={"a": None}),
        "urgent": Noul(instructions="urgent?"),
    }
    resp = dm.invoke({"state": "x", "questions": questions})
    assert resp.choices["only"].choice == "a"
    assert resp.choices["only"].probabilities == {"a": 1.0}
    assert resp.choices["only"].confidence == 1.0
    schema, names = dm._schema_for(questions)
    assert schema.field(names["only"]).labels == ["a"]
    d = tiny_agents.decide(schema, "x")
    assert d.fields["only"].probability == 1.0
    assert resp.nouls["urgent"].noul == pytest.approx(d.fields["urgent"].distribution[True])
    assert resp.usage is not None and resp.usage["input_tokens"] == d.prompt_tokens
    # alone, it still runs the model: the usage shows the prompt it read
    alone = dm.invoke({"state": "x", "questions": {"only": questions["only"]}})
    assert alone.choices["only"].confidence == 1.0
    assert alone.usage is not None and alone.usage["input_tokens"] > 0


def test_question_ids_that_are_not_identifiers(tiny_agents):
    dm = PCDDecisionModel(decider=tiny_agents)
    resp = dm.invoke(
        {
            "state": "x",
            "questions": {
                "is-urgent?": Noul(instructions="urgent?"),
                "1st choice": Choice(instructions="pick", criteria={"a": None, "b": None}),
            },
        }
    )
    assert list(resp.answers) == ["is-urgent?", "1st choice"]


def test_box_is_rejected_with_a_typed_error(tiny_agents):
    dm = PCDDecisionModel(decider=tiny_agents)
    with pytest.raises(UnsupportedFieldError, match=r"Box.*accepted: Noul, Choice, Score"):
        dm.invoke({"state": "x", "questions": {"where": Box(instructions="find the cat")}})


def test_tracing_metadata(tiny_agents):
    seen = {}

    class Spy(BaseCallbackHandler):
        def on_chain_start(self, serialized, inputs, *, metadata=None, **kw):
            seen.update(metadata or {})

    dm = PCDDecisionModel(decider=tiny_agents, model="my-name")
    dm.invoke(
        {"state": "x", "questions": {"u": Noul(instructions="urgent?")}},
        config={"callbacks": [Spy()]},
    )
    assert seen["ls_provider"] == "pcd_tools"
    assert seen["ls_model_name"] == "my-name"


def test_ainvoke_matches_invoke(tiny_agents):
    dm = PCDDecisionModel(decider=tiny_agents)
    req = {
        "state": "The invoice is wrong",
        "questions": {
            "team": Choice(instructions="team?", criteria={"billing": None, "tech": None})
        },
    }
    a = asyncio.run(dm.ainvoke(req))
    b = dm.invoke(req)
    assert a.choices["team"].choice == b.choices["team"].choice
    assert a.choices["team"].probabilities == pytest.approx(
        b.choices["team"].probabilities, rel=1e-3
    )


@pytest.mark.filterwarnings("ignore::langchain_core._api.beta_decorator.LangChainBetaWarning")
def test_model_router_middleware_picks_a_model(forced_d):
    from langchain.agents import create_agent
    from langchain.agents.middleware import ModelChoice, ModelRouterMiddleware

    fast = GenericFakeChatModel(messages=iter([AIMessage("answer from fast")]))
    deep = GenericFakeChatModel(messages=iter([AIMessage("answer from deep")]))
    router = ModelRouterMiddleware(
        choices={
            "fast": ModelChoice(model=fast, criteria="Simple, well-scoped tasks."),
            "deep": ModelChoice(model=deep, criteria="Complex reasoning."),
        },
        instructions="Choose the least costly model suited to the task.",
        classifier=PCDDecisionModel(decider=forced_d),
    )
    agent = create_agent(fast, middleware=[router])
    out = agent.invoke({"messages": [HumanMessage("Prove the Riemann hypothesis.")]})
    assert out["messages"][-1].content == "answer from deep"
    assert out["model_route"].choice == "deep"
    assert out["model_route"].confidence > 0.99
