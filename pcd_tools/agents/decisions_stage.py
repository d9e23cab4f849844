"""`DecisionsStage`: a cascade stage answered by an OpenAI Decisions API server.

`langchain_openai.decisions.OpenAIDecisions` pointed at a remote `pcd serve` (or any
server of `POST /v1/decisions`) answers the escalated fields with probabilities, so the
cascade can judge its answers against the thresholds and escalate again:

    from langchain_openai.decisions import OpenAIDecisions
    remote = OpenAIDecisions(model="pcd", base_url="http://gpu-box:8000/v1", api_key="...")
    cascade = Cascade(Ticket, stages=[decider, remote, "human"], threshold=0.8)

Each asked field becomes one question of one request over the context:

| field | question |
|---|---|
| `bool` with both candidates | `predicate` (P(true)) |
| `Literal`, `Enum`, `bool`, `int` range, `Optional[...]` | `choice` over its candidates |

A choice value is sent as the label when it is a string or a boolean, and as its JSON
text otherwise (`3`, `null`). Candidates are listed in the schema's declaration order,
not the previous stage's ranking, so that ranking does not reach the prompt. A question's
instructions are the schema's instructions, then the field's name and description, then
the answers already decided that it depends on.

What the API cannot ask stays unanswered and goes on to the next stage (the cascade's
`StageRecord.escalated` lists it): a generated field (no candidates to score), a
multi-label field (no question type for it), and a question the server refused. A field
left with one allowed candidate (a `choices_by` child under its decided parent) is not
sent, because the API requires 2 to 255 choices; it is answered with probability 1, as
every PCD entry point answers a single allowed value.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from ..answers.result import FieldResult
from ..errors import InvalidArgumentError
from ..schema import FieldSpec, Schema, compile_schema
from .stages import EscalationRequest, StageAnswer, _check_top_k

__all__ = ["DecisionsStage", "is_decisions_model"]


def is_decisions_model(obj: Any) -> bool:
    """Whether `obj` is a `langchain_openai.decisions.OpenAIDecisions` (without importing
    `langchain_openai` when it is not loaded)."""
    import sys

    mod = sys.modules.get("langchain_openai.decisions.base")
    return mod is not None and isinstance(obj, mod.OpenAIDecisions)


class DecisionsStage:
    """Asks an `OpenAIDecisions` runnable (e.g. pointed at a remote `pcd serve`).

    Args:
        decisions: A `langchain_openai.decisions.OpenAIDecisions`.
        name: Stage name in results; default `"decisions:<model>"`.
        top_k: Candidates kept per field (default all; at least 2).

    Raises:
        InvalidArgumentError: for something other than an `OpenAIDecisions`, or a bad
            `top_k`.
    """

    kind = "openai_decisions"

    def __init__(self, decisions: Any, *, name: str | None = None, top_k: int | None = None):
        if not is_decisions_model(decisions):
            raise InvalidArgumentError(
                f"DecisionsStage needs a langchain_openai.decisions.OpenAIDecisions; got "
                f"{type(decisions).__name__}."
            )
        self.decisions = decisions
        self.name = name or f"decisions:{decisions.model}"
        self.top_k = _check_top_k(top_k)

    def questions(self, request: EscalationRequest) -> dict[str, Any]:
        """The `OpenAIDecisions` questions for `request`'s askable fields, by field name."""
        from langchain_openai.decisions import Choice, Predicate

        out: dict[str, Any] = {}
        for n in request.fields:
            spec = request.schema.field(n)
            cands = _declared(spec, request.candidates[n])
            if spec.generated or spec.kind == "multilabel" or len(cands) < 2:
                continue
            text = _instructions(request.schema, spec, request)
            if spec.kind == "boolean" and {_k(c.label) for c in cands} == {_k(True), _k(False)}:
                out[n] = Predicate(instructions=text)
                continue
            wire = _wire_values(spec, cands)
            out[n] = Choice(
                instructions=text,
                choices={w: c.description for w, c in zip(wire, cands)},
            )
        return out

    def answer(self, request: EscalationRequest) -> StageAnswer:
        """Sends one request with a question per askable field; reads the probabilities.

        The probabilities are over the candidates the stage saw (those of `request`).
        """
        narrowed = compile_schema(request.model)
        questions = self.questions(request)
        labels: dict[str, Any] = {}
        probabilities: dict[str, float | None] = {}
        results: dict[str, Any] = {}
        response = None
        if questions:
            response = self.decisions.invoke({"input": request.text, "questions": questions})
        for n in request.fields:
            spec = request.schema.field(n)
            nspec = narrowed.field(n)
            if spec.generated or spec.kind == "multilabel":
                continue
            if n not in questions:  # one allowed candidate: probability 1
                cands = _declared(spec, request.candidates[n])
                if len(cands) != 1:
                    continue
                probs = {_k(cands[0].label): 1.0}
            else:
                got = _probabilities(response, n, spec, request)
                if got is None:  # refused or missing: the next stage answers it
                    continue
                probs = got
            p = np.array([probs.get(_k(c.label), 0.0) for c in nspec.choices], dtype=np.float64)
            logs = [math.log(q) if q > 0 else -math.inf for q in p]
            res = FieldResult.from_probs(nspec, p, logs)
            labels[n] = res.label
            probabilities[n] = res.probability
            results[n] = res
        return StageAnswer(labels=labels, probabilities=probabilities, results=results)


def _k(label: Any) -> Any:
    """A hashable key that tells `True` from `1`."""
    return (type(label).__name__, label) if isinstance(label, bool) else label


def _declared(spec: FieldSpec, candidates: list[Any]) -> list[Any]:
    """The field's choices among `candidates`, in declaration order."""
    keep = {_k(c) for c in candidates}
    return [c for c in spec.choices if _k(c.label) in keep]


def _wire_values(spec: FieldSpec, cands: list[Any]) -> list[str | bool]:
    """Each candidate's Decisions choice value: its label when a string or a boolean,
    else its JSON text; distinct, or an error naming the clash."""
    wire = [c.label if isinstance(c.label, (str, bool)) else c.literal for c in cands]
    seen: dict[Any, Any] = {}
    for w, c in zip(wire, cands):
        if _k(w) in seen:
            raise InvalidArgumentError(
                f"field {spec.name!r}: candidates {seen[_k(w)]!r} and {c.label!r} are both "
                f"sent as the Decisions choice value {json.dumps(w)}; accepted: candidates "
                "whose string or boolean labels and other values' JSON texts all differ."
            )
        seen[_k(w)] = c.label
    return wire


def _instructions(schema: Schema, spec: FieldSpec, request: EscalationRequest) -> str:
    parts = [schema.instructions] if schema.instructions else []
    parts.append(f"{spec.name}: {spec.description}" if spec.description else spec.name)
    if request.fixed:
        given = ", ".join(
            f"{k} = {json.dumps(v, ensure_ascii=False)}" for k, v in request.fixed.items()
        )
        parts.append(f"Already decided: {given}.")
    return "\n\n".join(parts)


def _probabilities(
    response: Any, n: str, spec: FieldSpec, request: EscalationRequest
) -> dict[Any, float] | None:
    """Field `n`'s candidate probabilities from the response (None: refused or absent)."""
    if n in response.predicates:
        p = float(response.predicates[n].probability)
        return {_k(True): p, _k(False): 1.0 - p}
    if n not in response.choices:
        return None
    cands = _declared(spec, request.candidates[n])
    by_wire = {_k(w): c.label for w, c in zip(_wire_values(spec, cands), cands)}
    out: dict[Any, float] = {}
    for value, p in response.choices[n].probabilities.items():
        label = by_wire.get(_k(value))
        if label is None and _k(value) not in by_wire:
            raise InvalidArgumentError(
                f"the Decisions server answered field {n!r} with the value {value!r}, which "
                f"was not one of the choices sent: {list(by_wire)}."
            )
        out[_k(label)] = float(p)
    return out
