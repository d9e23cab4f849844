"""Cascade stages: what a stage is asked (`EscalationRequest`) and the built-in stages.

A stage answers an `EscalationRequest` with a `StageAnswer`:

- `DeciderStage`: another `Decider`, e.g. a bigger local model (with probabilities);
- `ChatModelStage`: a LangChain chat model through `with_structured_output` of the
  narrowed sub-schema (`narrowed_model`);
- `HumanStage`: a person, through a callable or LangGraph's `interrupt`;
- `DecisionsStage` (in `decisions_stage`): an OpenAI Decisions API server, e.g. a remote
  `pcd serve`, through `langchain_openai`'s `OpenAIDecisions` (with probabilities).

`pcd_tools.agents.cascade.as_stage` wraps a `Decider`, a chat model, an `OpenAIDecisions`,
a callable or `"human"` into one of these.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, create_model
from pydantic import Field as PydField

from ..decide.orders import check_orders
from ..decide.worker import call_model
from ..errors import InvalidArgumentError
from ..prompt import render_system
from ..schema import Schema, compile_schema
from ..schema.spec import python_type

__all__ = [
    "ChatModelStage",
    "DeciderStage",
    "EscalationRequest",
    "HumanStage",
    "StageAnswer",
    "named_stage",
    "narrowed_model",
]


# --- narrowed sub-schemas ---------------------------------------------------------------------


def narrowed_model(
    schema: Schema,
    names: Sequence[str],
    keep: Mapping[str, Sequence[Any]] | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> type[BaseModel]:
    """A Pydantic model with only `names`, each `Literal` narrowed to the labels in `keep`
    (a generated field keeps its annotation: `str` with its lengths, `float`, ...).

    It keeps the instructions (as the docstring), the field and choice descriptions, so
    a chat model's `with_structured_output` sees the same task, only smaller. A
    multi-label field stays a list of its (kept) labels, with its length limits.

    Args:
        schema: The full compiled schema.
        names: Fields to include, in order.
        keep: Per-field JSON labels to keep, in the order the `Literal` lists them (a
            cascade passes them most probable first); default all, in declaration order.
        fixed: Answers already decided that these fields depend on (`{field: label}`);
            they are written into the instructions, so the stage decides given them.
    """
    fields: dict[str, Any] = {}
    for name in names:
        spec = schema.field(name)
        if spec.generation is not None:  # a generated field keeps its kind and constraints
            fields[name] = (
                python_type(spec.generation, spec.optional),
                PydField(description=spec.description or None),
            )
            continue
        wanted = list(keep[name]) if keep and name in keep else spec.labels
        by_label = {c.label: c for c in spec.choices}
        kept = [by_label[w] for w in wanted if w in by_label]
        labels = [c.label for c in kept if c.label is not None]
        tp: Any
        if spec.kind == "boolean" and set(labels) == {True, False}:
            tp = bool
        else:
            tp = Literal[tuple(labels)]
        limits: dict[str, int | None] = {}
        if spec.kind == "multilabel":
            limits = {"min_length": spec.min_labels or None, "max_length": spec.max_labels}
            tp = list[tp]
        if any(c.label is None for c in kept):
            tp = tp | None
        descs: dict[str, Any] = {
            (c.literal if isinstance(c.label, bool) else str(c.label)): c.description
            for c in kept
            if c.description and c.label is not None
        }
        extra: dict[str, Any] | None = {"choice_descriptions": descs} if descs else None
        if spec.reading == "ranked":  # kept ranked, whatever the kept labels' count
            extra = {**(extra or {}), "reading": "ranked", "threshold": spec.threshold}
        desc = spec.description or ""
        if spec.branch is not None:
            kind, index = spec.branch
            when = schema.field(kind).choices[index].literal
            desc = f"{desc} (only when {kind!r} is {when})".strip()
        fields[name] = (
            tp,
            PydField(
                description=desc or None,
                json_schema_extra=extra,
                min_length=limits.get("min_length"),
                max_length=limits.get("max_length"),
            ),
        )
    doc = schema.instructions or ""
    if fixed:
        given = ", ".join(f"{k} = {json.dumps(v, ensure_ascii=False)}" for k, v in fixed.items())
        doc = f"{doc}\n\nAlready decided (do not change): {given}.".strip()
    model_name = schema.name if schema.name.isidentifier() else "Decision"
    return create_model(
        model_name,
        __config__=ConfigDict(extra="forbid"),
        __doc__=doc or None,
        **fields,
    )


# --- stages -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EscalationRequest:
    """What a stage is asked to decide.

    Candidates are ranked: most probable first under the latest stage that gave the field
    a distribution (ties, and fields no stage has scored yet, in declaration order). So
    `request.candidates[name][0]` is the model's best guess.

    Args:
        text: The context being decided.
        schema: The full compiled schema.
        fields: The fields this stage must answer.
        candidates: Per field, the labels it may choose from (top-k so far, or all), ranked.
        model: A Pydantic model of just those fields, `Literal`s narrowed to `candidates`
            and listed in the same ranked order.
        previous: Per field, the distribution of the latest stage that had one, if any.
        ranked: Per field, `(label, probability)` for each candidate in `candidates` order;
            the probability is from `previous`, or None where no stage has scored the field.
        fixed: Answers already accepted that the requested fields depend on (their
            `depends_on` and `choices_by` parents, a union branch's discriminator), as
            `{field: label}`; `model`'s instructions state them, and a `choices_by`
            child's candidates are only those allowed with its parent's answer.
        prediction_sets: Under `Cascade(escalate_when="set_size>1")`: per field, the
            previous stage's split-conformal prediction set at `coverage` (labels, most
            probable first; `FieldResult.prediction_set`); empty otherwise.
        coverage: The coverage of those sets, or None.
    """

    text: str
    schema: Schema
    fields: list[str]
    candidates: dict[str, list[Any]]
    model: type[BaseModel]
    previous: dict[str, dict[Any, float]]
    ranked: dict[str, list[tuple[Any, float | None]]] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)
    prediction_sets: dict[str, list[Any]] = field(default_factory=dict)
    coverage: float | None = None


@dataclass
class StageAnswer:
    """A stage's labels, and probabilities where the stage has them (None otherwise)."""

    labels: dict[str, Any]
    probabilities: dict[str, float | None]
    results: dict[str, Any] = field(default_factory=dict)
    decision: Any = None


def _labels_of(parsed: Any) -> dict[str, Any]:
    if isinstance(parsed, BaseModel):
        return parsed.model_dump(mode="json")
    if isinstance(parsed, Mapping):
        inner = parsed.get("parsed") if "parsed" in parsed and "raw" in parsed else parsed
        if isinstance(inner, BaseModel):
            return inner.model_dump(mode="json")
        return dict(inner or {})
    raise InvalidArgumentError(
        f"a stage answered with {type(parsed).__name__}; accepted: a Pydantic model "
        "instance or a mapping of field name -> value."
    )


class DeciderStage:
    """Decides the escalated fields with another `Decider` (e.g. a bigger local model).

    Args:
        decider: The `Decider`.
        name: Stage name in results; default the decider's `model_id`.
        top_k: Narrow each field to its top-k candidates so far; default keep all.
        temperature: Softmax temperature.
        orders: Average each field's distribution over this many listing orders of the
            candidates it sees (`Decider.decide(..., orders=k)`).

    Raises:
        InvalidArgumentError: for a bad `top_k` or `orders`.
    """

    kind = "decider"

    def __init__(
        self,
        decider: Any,
        *,
        name: str | None = None,
        top_k: int | None = None,
        temperature: float = 1.0,
        orders: int = 1,
    ):
        self.decider = decider
        self.name = name or str(getattr(decider, "model_id", "decider"))
        self.top_k = _check_top_k(top_k)
        self.temperature = temperature
        self.orders = check_orders(orders)

    def _target(self, request: EscalationRequest) -> tuple[Any, dict[str, list[Any]] | None]:
        """A key shared by requests that narrow to the same sub-schema, and the labels each
        field keeps (None: the whole schema, every field with all its candidates)."""
        schema = request.schema
        full = request.fields == schema.field_names and all(
            len(request.candidates[n]) == schema.field(n).cardinality for n in request.fields
        )
        if full and not request.fixed:
            return None, None
        # Declaration order, not the ranked one: the previous stage's ranking must not
        # reach this model's prompt (position bias).
        keep = {
            n: [x for x in schema.field(n).labels if x in request.candidates[n]]
            for n in request.fields
        }
        key = (
            tuple(request.fields),
            tuple((n, json.dumps(keep[n])) for n in request.fields),
            json.dumps(request.fixed, sort_keys=True, default=str),
        )
        return key, keep

    def _compile(self, request: EscalationRequest, keep: dict[str, list[Any]] | None) -> Any:
        if keep is None:
            return request.schema
        return compile_schema(narrowed_model(request.schema, request.fields, keep, request.fixed))

    def _answer(self, request: EscalationRequest, d: Any) -> StageAnswer:
        return StageAnswer(
            labels={n: d.fields[n].label for n in request.fields},
            probabilities={n: d.fields[n].probability for n in request.fields},
            results={n: d.fields[n] for n in request.fields},
            decision=d,
        )

    def answer(self, request: EscalationRequest) -> StageAnswer:
        """Scores the requested fields; probabilities are over the candidates it saw."""
        _, keep = self._target(request)
        d = call_model(
            self.decider,
            self.decider.decide,
            self._compile(request, keep),
            request.text,
            temperature=self.temperature,
            orders=self.orders,
        )
        return self._answer(request, d)

    def answer_many(self, requests: Sequence[EscalationRequest]) -> list[StageAnswer]:
        """Answers several rows' requests: one `decide_many` per distinct narrowed
        sub-schema (rows that escalated the same fields, with the same candidates and
        parents, share one batched call)."""
        groups: dict[Any, list[int]] = {}
        targets: dict[Any, Any] = {}
        for i, req in enumerate(requests):
            key, keep = self._target(req)
            groups.setdefault(key, []).append(i)
            if key not in targets:
                targets[key] = self._compile(req, keep)
        out: list[StageAnswer | None] = [None] * len(requests)
        for key, idx in groups.items():
            ds = call_model(
                self.decider,
                self.decider.decide_many,
                targets[key],
                [requests[i].text for i in idx],
                temperature=self.temperature,
                orders=self.orders,
            )
            for i, d in zip(idx, ds):
                out[i] = self._answer(requests[i], d)
        return [a for a in out if a is not None]


class ChatModelStage:
    """Asks a LangChain chat model, through `with_structured_output(narrowed model)`.

    Args:
        model: Any chat model with `with_structured_output` (a `BaseChatModel`).
        name: Stage name; default the model's `model_name` / `model` or class name.
        top_k: Candidates kept per field (default 3; at least 2).
        method: Passed to `with_structured_output` when given.
    """

    kind = "chat_model"

    def __init__(
        self,
        model: Any,
        *,
        name: str | None = None,
        top_k: int | None = 3,
        method: str | None = None,
    ):
        self.model = model
        self.name = name or str(
            getattr(model, "model_name", None)
            or getattr(model, "model", None)
            or type(model).__name__
        )
        self.top_k = _check_top_k(top_k)
        self.method = method

    def answer(self, request: EscalationRequest) -> StageAnswer:
        """Sends the system prompt of the narrowed schema and the text; parses the reply."""
        from langchain_core.messages import HumanMessage, SystemMessage

        kw = {"method": self.method} if self.method else {}
        runnable = self.model.with_structured_output(request.model, **kw)
        system = render_system(compile_schema(request.model))
        out = runnable.invoke([SystemMessage(system), HumanMessage(request.text)])
        labels = _labels_of(out)
        return StageAnswer(labels=labels, probabilities=dict.fromkeys(labels))


class HumanStage:
    """Asks a person: a callable, or LangGraph's `interrupt` inside a graph node.

    Args:
        ask: `ask(request: EscalationRequest) -> model instance | mapping`. Default: call
            `langgraph.types.interrupt(payload, response_schema=request.model)`; resume the
            graph with `Command(resume={field: value, ...})`.
        name: Stage name (default `"human"`).
        top_k: Candidates offered per field (default all).
    """

    kind = "human"

    def __init__(
        self,
        ask: Callable[[EscalationRequest], Any] | None = None,
        *,
        name: str = "human",
        top_k: int | None = None,
    ):
        self.ask = ask
        self.name = name
        self.top_k = _check_top_k(top_k)

    @staticmethod
    def payload(request: EscalationRequest) -> dict[str, Any]:
        """The JSON-serialisable question shown to the person (the interrupt value).

        Under `Cascade(escalate_when="set_size>1")` each field also has its
        `prediction_set` (the answers the calibration keeps plausible at `coverage`, most
        probable first) and that `coverage`."""
        return {
            "question": f"Please decide {', '.join(request.fields)} for this text.",
            "text": request.text,
            "fields": {
                n: {
                    "description": request.schema.field(n).description,
                    "choices": request.candidates[n],  # most probable first
                    "model_probabilities": request.previous.get(n, {}),
                    **(
                        {
                            "prediction_set": request.prediction_sets[n],
                            "coverage": request.coverage,
                        }
                        if n in request.prediction_sets
                        else {}
                    ),
                }
                for n in request.fields
            },
            "already_decided": dict(request.fixed),
        }

    def answer(self, request: EscalationRequest) -> StageAnswer:
        """Returns the person's labels (no probabilities)."""
        if self.ask is not None:
            out = self.ask(request)
        else:
            from langgraph.types import interrupt

            out = interrupt(self.payload(request), response_schema=request.model)
        labels = _labels_of(out)
        return StageAnswer(labels=labels, probabilities=dict.fromkeys(labels))


def _check_top_k(k: int | None) -> int | None:
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 2):
        raise InvalidArgumentError(f"top_k must be an int >= 2 or None; got {k!r}.")
    return k


def named_stage(name: Any) -> Any:
    """The stage a string or path names: `"human"` / `"interrupt"` a `HumanStage` (LangGraph
    interrupt), anything else a model, named as `Decider.load` names one (`"embedded"`, a
    `.gguf` path, an MLX directory or a Hugging Face id;
    `pcd_tools.engine.load.sources.model_source`), loaded as a `DeciderStage`."""
    if name in ("human", "interrupt"):
        return HumanStage()
    from ..decide.decider import Decider

    return DeciderStage(Decider.load(name))
