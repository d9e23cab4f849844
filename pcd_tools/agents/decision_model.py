"""`PCDDecisionModel`: LangChain's `BaseDecisionModel` answered by one PCD pass.

Every question of a request becomes one field of a single schema, so all questions are
answered together in one prefill and one packed pass:

| question | field                                    | answer                                  |
|----------|------------------------------------------|-----------------------------------------|
| `Noul`   | boolean; criteria describe true / false  | `NoulAnswer.noul` = P(true)             |
| `Choice` | enum of the labels; criteria describe each | `ChoiceAnswer`: top label, distribution |
| `Score`  | enum of levels 0..K-1; criteria describe each | `ScoreAnswer`: expected level          |

**How confidence is derived.** Probabilities are the PCD softmax over the field's
candidates (full-vocabulary log-probabilities of each candidate's tokens, divided by the
temperature, and by the per-field temperature of a calibration when the decider has one).

- `ChoiceAnswer.confidence` is the probability of the selected label (top-1 probability).
- `ScoreAnswer.confidence` is `1 - Var[level] / ((K - 1) / 2) ** 2`: 1 when all mass is on
  one level, 0 when it is split evenly between the two extreme levels. It rewards mass
  that is concentrated near the expected level, which top-1 probability does not.
- `NoulAnswer` has no confidence field; `noul` itself is P(yes).

**A `Choice` with one label** (LangChain allows it) is answered like the Python API and the
servers answer a field with one allowed value: it is a field of the same pass, and its
probability and confidence are 1 because the probabilities are relative to the labels.
"""

from __future__ import annotations

import json
import keyword
import re
from collections import OrderedDict
from typing import Any

from langchain_core.decisions import (
    BaseDecisionModel,
    Box,
    Choice,
    ChoiceAnswer,
    ClassifierResponse,
    Noul,
    NoulAnswer,
    Question,
    Score,
    ScoreAnswer,
    State,
)
from pydantic import ConfigDict, Field, model_validator

from ..decide.orders import check_orders
from ..decide.worker import call_model, run_on_worker
from ..errors import InvalidArgumentError, UnsupportedFieldError
from ..schema import Schema, StructuredSchema
from .structured import to_context

__all__ = ["PCDDecisionModel"]

_INSTRUCTIONS = "Answer each question about the user's message."


def _content_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def _field_name(qid: str, taken: set[str]) -> str:
    name = re.sub(r"\W", "_", qid).strip("_") or "question"
    if name[0].isdigit() or keyword.iskeyword(name):
        name = f"q_{name}"
    base, i = name, 2
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def _field_spec(qid: str, q: Any) -> dict[str, Any]:
    desc = _content_text(q.instructions)
    if isinstance(q, Noul):
        spec: dict[str, Any] = {"type": "boolean", "description": desc}
        crit = q.criteria
        descs: dict[Any, str] = {}
        if crit is not None and crit.true is not None:
            descs[True] = _content_text(crit.true)
        if crit is not None and crit.false is not None:
            descs[False] = _content_text(crit.false)
        if descs:
            spec["choice_descriptions"] = descs
        return spec
    if isinstance(q, Choice):
        labels = list(q.criteria)
        descs = {k: _content_text(v) for k, v in q.criteria.items() if v is not None}
        return {
            "type": "enum",
            "choices": labels,
            "description": desc,
            "choice_descriptions": descs,
        }
    if isinstance(q, Score):
        levels = list(range(len(q.criteria)))
        descs = {i: _content_text(v) for i, v in enumerate(q.criteria) if v is not None}
        return {
            "type": "enum",
            "choices": levels,
            "description": desc,
            "choice_descriptions": descs,
        }
    kind = "Box" if isinstance(q, Box) else type(q).__name__
    raise UnsupportedFieldError(
        f"question {qid!r} is a {kind} question, which PCD cannot answer (it needs an image "
        "model that outputs coordinates); accepted: Noul, Choice, Score.",
        field=qid,
    )


class PCDDecisionModel(BaseDecisionModel):
    """A LangChain decision model that answers every question in one PCD pass.

    Use it wherever LangChain takes a `BaseDecisionModel`, e.g. as the `classifier` of
    `langchain.agents.middleware.ModelRouterMiddleware`.

    Args:
        decider: The `Decider` that scores. Default: load `model` (or the embedded model).
        model: Model name reported as `ls_model_name`; defaults to `decider.model_id`.
        temperature: Softmax temperature (> 0).
        instructions: Task instructions placed before the questions in the system turn.
        orders: Average every answer's distribution over this many listing orders of the
            labels or levels (`Decider.decide(..., orders=k)`), against position bias.

    Raises:
        InvalidArgumentError: for a bad `orders`.

    Example:
        `PCDDecisionModel(decider=decider).invoke({"state": "Prod is down",
        "questions": {"urgent": Noul(instructions="Is it urgent?")}}).nouls["urgent"].noul`
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    decider: Any = Field(default=None, exclude=True)
    model: str = ""
    temperature: float = 1.0
    instructions: str = _INSTRUCTIONS
    orders: int = 1

    def __init__(self, **data: Any):
        # before pydantic, which would coerce 2.0 to 2 and wrap the error
        if "orders" in data:
            check_orders(data["orders"])
        super().__init__(**data)

    @model_validator(mode="before")
    @classmethod
    def _load_decider(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("decider") is None:
            from ..decide.decider import Decider, default_decider

            data["decider"] = (
                Decider.load(data["model"]) if data.get("model") else default_decider()
            )
        if not data.get("model"):
            data["model"] = data["decider"].model_id
        return data

    def model_post_init(self, context: Any, /) -> None:
        self._schemas: OrderedDict[str, tuple[Schema, dict[str, str]]] = OrderedDict()

    @property
    def _provider(self) -> str:
        return "pcd_tools"

    @property
    def _llm_type(self) -> str:
        return "pcd_decision_model"

    def _schema_for(self, questions: dict[str, Question]) -> tuple[Schema, dict[str, str]]:
        """Compiles (and caches) the schema of a question set; returns it with id -> field."""
        key = json.dumps(
            {k: q.model_dump(mode="json") for k, q in questions.items()}, sort_keys=True
        )
        hit = self._schemas.get(key)
        if hit is not None:
            self._schemas.move_to_end(key)
            return hit
        taken: set[str] = set()
        names = {qid: _field_name(qid, taken) for qid in questions}
        specs = {names[qid]: _field_spec(qid, q) for qid, q in questions.items()}
        schema = StructuredSchema(specs, name="Questions", instructions=self.instructions).schema
        self._schemas[key] = (schema, names)
        while len(self._schemas) > 32:
            self._schemas.popitem(last=False)
        return schema, names

    def _classify(self, state: State, questions: dict[str, Question]) -> ClassifierResponse:
        if not questions:
            raise InvalidArgumentError("a classifier request needs at least one question.")
        context, system = to_context(state)
        if system:
            context = f"{system}\n\n{context}" if context else system
        schema, names = self._schema_for(questions)
        decision = call_model(
            self.decider,
            self.decider.decide,
            schema,
            context,
            temperature=self.temperature,
            orders=self.orders,
        )
        answers = {qid: _answer(q, decision.fields[names[qid]]) for qid, q in questions.items()}
        usage: Any = {"input_tokens": decision.prompt_tokens, "output_tokens": 0}
        return ClassifierResponse(model=self.model, answers=answers, usage=usage)

    async def _aclassify(self, state: State, questions: dict[str, Question]) -> ClassifierResponse:
        return await run_on_worker(self.decider, self._classify, state, questions)


def _answer(q: Any, f: Any) -> Any:
    if isinstance(q, Noul):
        return NoulAnswer(type="noul", noul=min(1.0, max(0.0, f.distribution[True])))
    if isinstance(q, Choice):
        probs = {str(k): float(v) for k, v in f.distribution.items()}
        return ChoiceAnswer(
            type="choice", choice=str(f.label), probabilities=probs, confidence=f.probability
        )
    probs_i = {int(k): float(v) for k, v in f.distribution.items()}
    k = len(probs_i)
    mean = sum(i * p for i, p in probs_i.items())
    var = sum(p * (i - mean) ** 2 for i, p in probs_i.items())
    conf = 1.0 - var / (((k - 1) / 2) ** 2)
    return ScoreAnswer(
        type="score",
        score=mean,
        legend=dict(enumerate(q.criteria)),
        probabilities=probs_i,
        confidence=min(1.0, max(0.0, conf)),
    )
