"""`Cascade`: keep confident fields, escalate the others to a bigger model or a human.

Stage 1 (usually a small local `Decider`) decides every field. Each field whose score is
below its threshold, and every field of a stage that failed, goes to the next stage,
which sees only those fields, each narrowed to the top-k candidates so far. A stage is:

- a LangChain chat model, called through its `with_structured_output` with that
  narrowed sub-schema (`ChatModelStage`);
- another `Decider`, e.g. a bigger local model (`DeciderStage`);
- a human, through a callable or LangGraph's `interrupt(..., response_schema=...)`
  (`HumanStage`).

Answers from stages that report no probability (chat models, humans) are accepted as
final. `LowConfidenceError` carries a `Decision` so that LangChain's stock
`.with_fallbacks(..., exceptions_to_handle=(LowConfidenceError,))` is a one-line cascade.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.runnables import Runnable, RunnableConfig
from pydantic import BaseModel, ConfigDict, create_model
from pydantic import Field as PydField

from ..errors import InvalidArgumentError, PcdToolsError
from ..prompt import render_system
from ..schema import FieldSpec, Schema, compile_schema
from ._worker import call_model
from .structured import to_context

__all__ = [
    "Cascade",
    "CascadeError",
    "CascadeResult",
    "ChatModelStage",
    "DeciderStage",
    "EscalationRequest",
    "FieldOutcome",
    "HumanStage",
    "LowConfidenceError",
    "StageRecord",
    "narrowed_model",
]

ScoreName = Literal["probability", "margin", "entropy"]
_SCORES = ("probability", "margin", "entropy")


class LowConfidenceError(PcdToolsError, RuntimeError):
    """A decision's confidence is below the caller's threshold (raised only on opt-in).

    Args:
        decision: The `Decision`, kept whole so a fallback can use it.
        threshold: The threshold it missed, if known.

    Attributes:
        decision: The `Decision`.
        fields: Names of the fields below the threshold.
    """

    def __init__(self, decision: Any, *, threshold: float | None = None):
        self.decision = decision
        self.threshold = threshold
        self.fields = decision.low_confidence(threshold) if threshold is not None else []
        where = f" below {threshold}" if threshold is not None else ""
        super().__init__(
            f"decision confidence {decision.confidence:.4f}{where}; low-confidence fields: "
            f"{self.fields or 'n/a'}"
        )


class CascadeError(PcdToolsError, RuntimeError):
    """No stage produced an answer for some field (every stage failed on it)."""


# --- narrowed sub-schemas ---------------------------------------------------------------------


def narrowed_model(
    schema: Schema, names: Sequence[str], keep: Mapping[str, Sequence[Any]] | None = None
) -> type[BaseModel]:
    """A Pydantic model with only `names`, each `Literal` narrowed to the labels in `keep`.

    It keeps the instructions (as the docstring), the field and choice descriptions, so
    a chat model's `with_structured_output` sees the same task, only smaller.

    Args:
        schema: The full compiled schema.
        names: Fields to include, in order.
        keep: Per-field JSON labels to keep (declaration order is preserved); default all.
    """
    fields: dict[str, Any] = {}
    for name in names:
        spec = schema.field(name)
        wanted = list(keep[name]) if keep and name in keep else spec.labels
        kept = [c for c in spec.choices if c.label in wanted]
        labels = [c.label for c in kept if c.label is not None]
        tp: Any
        if spec.kind == "boolean" and set(labels) == {True, False}:
            tp = bool
        else:
            tp = Literal[tuple(labels)]
        if any(c.label is None for c in kept):
            tp = tp | None
        descs: dict[str, Any] = {
            (c.literal if isinstance(c.label, bool) else str(c.label)): c.description
            for c in kept
            if c.description and c.label is not None
        }
        extra: dict[str, Any] | None = {"choice_descriptions": descs} if descs else None
        fields[name] = (tp, PydField(description=spec.description or None, json_schema_extra=extra))
    model_name = schema.name if schema.name.isidentifier() else "Decision"
    return create_model(
        model_name,
        __config__=ConfigDict(extra="forbid"),
        __doc__=schema.instructions or None,
        **fields,
    )


# --- stages -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EscalationRequest:
    """What a stage is asked to decide.

    Args:
        text: The context being decided.
        schema: The full compiled schema.
        fields: The fields this stage must answer.
        candidates: Per field, the labels it may choose from (top-k so far, or all).
        model: A Pydantic model of just those fields, `Literal`s narrowed to `candidates`.
        previous: Per field, the distribution of the latest stage that had one, if any.
    """

    text: str
    schema: Schema
    fields: list[str]
    candidates: dict[str, list[Any]]
    model: type[BaseModel]
    previous: dict[str, dict[Any, float]]


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
    """

    kind = "decider"

    def __init__(
        self,
        decider: Any,
        *,
        name: str | None = None,
        top_k: int | None = None,
        temperature: float = 1.0,
    ):
        self.decider = decider
        self.name = name or str(getattr(decider, "model_id", "decider"))
        self.top_k = _check_top_k(top_k)
        self.temperature = temperature

    def answer(self, request: EscalationRequest) -> StageAnswer:
        """Scores the requested fields; probabilities are over the candidates it saw."""
        full = request.fields == request.schema.field_names and all(
            request.candidates[n] == request.schema.field(n).labels for n in request.fields
        )
        target = request.schema if full else compile_schema(request.model)
        d = call_model(
            self.decider, self.decider.decide, target, request.text, temperature=self.temperature
        )
        return StageAnswer(
            labels={n: d.fields[n].label for n in request.fields},
            probabilities={n: d.fields[n].probability for n in request.fields},
            results={n: d.fields[n] for n in request.fields},
            decision=d,
        )


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
        """The JSON-serialisable question shown to the person (the interrupt value)."""
        return {
            "question": f"Please decide {', '.join(request.fields)} for this text.",
            "text": request.text,
            "fields": {
                n: {
                    "description": request.schema.field(n).description,
                    "choices": request.candidates[n],
                    "model_probabilities": request.previous.get(n, {}),
                }
                for n in request.fields
            },
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


def as_stage(obj: Any) -> Any:
    """Wraps a `Decider`, a chat model, a callable or `"human"` into a stage."""
    if hasattr(obj, "answer") and hasattr(obj, "name"):
        return obj
    if hasattr(obj, "decide") and hasattr(obj, "engine"):
        return DeciderStage(obj)
    if hasattr(obj, "with_structured_output"):
        return ChatModelStage(obj)
    if obj in ("human", "interrupt"):
        return HumanStage()
    if callable(obj):
        return HumanStage(obj)
    raise InvalidArgumentError(
        f"cannot use {type(obj).__name__} as a cascade stage; accepted: a Decider, a LangChain "
        "chat model, a callable (a human), 'human' (LangGraph interrupt) or a stage object."
    )


# --- results ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldOutcome:
    """The final answer for one field.

    Args:
        name: Field name.
        value: Native value (`bool`, `Enum` member, `str`, `int` or `None`).
        label: JSON value.
        stage: Name of the stage that decided it.
        probability: That stage's probability, or None for stages without one.
    """

    name: str
    value: Any
    label: Any
    stage: str
    probability: float | None


@dataclass(frozen=True)
class StageRecord:
    """What one stage did.

    Args:
        name: Stage name.
        kind: `"decider"`, `"chat_model"`, `"human"` or a custom stage's kind.
        asked: Fields the stage was asked to decide.
        candidates: Labels offered per field.
        answered: Fields it answered.
        escalated: Fields passed on to the next stage (below threshold, missing or failed).
        latency_ms: Wall time of the stage.
        error: `"ExceptionType: message"` if the stage failed (its fields escalate).
    """

    name: str
    kind: str
    asked: list[str]
    candidates: dict[str, list[Any]]
    answered: list[str]
    escalated: list[str]
    latency_ms: float
    error: str | None = None


@dataclass(frozen=True)
class CascadeResult:
    """A cascade's answer.

    Args:
        value: An instance of the schema's model.
        fields: Per-field `FieldOutcome`.
        stages: One `StageRecord` per stage that ran, in order.
        unresolved: Fields still below threshold after the last stage (answer kept).
        decision: The first stage's `Decision`, if it was a `Decider` and succeeded.
        elapsed_ms: Wall time of the whole cascade.
    """

    value: Any
    fields: dict[str, FieldOutcome]
    stages: list[StageRecord]
    unresolved: list[str]
    decision: Any
    elapsed_ms: float

    @property
    def decided_by(self) -> dict[str, str]:
        """Field name -> name of the stage that decided it."""
        return {n: f.stage for n, f in self.fields.items()}

    @property
    def probabilities(self) -> dict[str, float | None]:
        """Field name -> probability from the deciding stage (None if it had none)."""
        return {n: f.probability for n, f in self.fields.items()}

    @property
    def latency_ms(self) -> dict[str, float]:
        """Stage name -> wall time."""
        return {s.name: s.latency_ms for s in self.stages}


# --- the cascade ------------------------------------------------------------------------------


def _bubble_up() -> tuple[type[BaseException], ...]:
    try:
        from langgraph.errors import GraphBubbleUp
    except ImportError:  # pragma: no cover - langgraph is part of the extra
        return ()
    return (GraphBubbleUp,)


class Cascade(Runnable[Any, CascadeResult]):
    """Decide with the first stage; escalate low-confidence fields stage by stage.

    Args:
        schema: The decision schema.
        stages: Stages in order (`Decider`, chat model, callable/`"human"`, or stage objects).
        threshold: Default threshold. A field is confident when its probability (or margin)
            is >= threshold, or its entropy in nats is <= threshold.
        per_field: Per-field thresholds: a number, or `(score, number)` to change the score.
        score: `"probability"` (default), `"margin"` or `"entropy"`.

    Raises:
        InvalidArgumentError: for no stages, an unknown score or a field not in the schema.
    """

    def __init__(
        self,
        schema: Any,
        stages: Sequence[Any],
        threshold: float = 0.8,
        per_field: Mapping[str, float | tuple[str, float]] | None = None,
        *,
        score: ScoreName = "probability",
    ):
        self.schema = compile_schema(schema)
        self.as_model = isinstance(schema, type) and issubclass(schema, BaseModel)
        if not stages:
            raise InvalidArgumentError("a Cascade needs at least one stage.")
        self.stages = [as_stage(s) for s in stages]
        seen: dict[str, int] = {}
        self.stage_names = []
        for s in self.stages:
            seen[s.name] = seen.get(s.name, 0) + 1
            self.stage_names.append(s.name if seen[s.name] == 1 else f"{s.name}#{seen[s.name]}")
        self.thresholds = {n: (score, float(threshold)) for n in self.schema.field_names}
        for n, rule in (per_field or {}).items():
            if n not in self.thresholds:
                raise InvalidArgumentError(
                    f"per_field names {n!r}, which is not a field of {self.schema.name}; "
                    f"fields: {self.schema.field_names}."
                )
            sc, t = rule if isinstance(rule, tuple) else (score, rule)
            self.thresholds[n] = (sc, float(t))  # type: ignore[assignment]
        for sc, _ in self.thresholds.values():
            if sc not in _SCORES:
                raise InvalidArgumentError(f"unknown score {sc!r}; accepted: {list(_SCORES)}.")

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"Cascade[{self.schema.name}]"

    def confident(self, name: str, result: Any) -> bool:
        """Whether a `FieldResult` meets its field's threshold."""
        sc, t = self.thresholds[name]
        if sc == "entropy":
            return bool(result.entropy <= t)
        return bool(getattr(result, sc) >= t)

    def invoke(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> CascadeResult:
        """Runs the cascade on a string, messages or a mapping (see `to_context`)."""
        return self._call_with_config(self._run, input, config, run_type="chain")

    def _request(
        self, text: str, names: list[str], stage: Any, prev: dict[str, Any]
    ) -> EscalationRequest:
        k = getattr(stage, "top_k", None)
        cands: dict[str, list[Any]] = {}
        previous: dict[str, dict[Any, float]] = {}
        for n in names:
            spec: FieldSpec = self.schema.field(n)
            dist = prev.get(n)
            if dist is not None:
                previous[n] = dict(dist)
            if k is None or dist is None or k >= spec.cardinality:
                cands[n] = spec.labels
            else:
                top = sorted(
                    range(spec.cardinality), key=lambda i: (-dist.get(spec.labels[i], 0.0), i)
                )[:k]
                cands[n] = [spec.labels[i] for i in sorted(top)]
        return EscalationRequest(
            text, self.schema, names, cands, narrowed_model(self.schema, names, cands), previous
        )

    def _run(self, input: Any) -> CascadeResult:
        t_start = time.perf_counter()
        text, _ = to_context(input)
        pending = list(self.schema.field_names)
        outcome: dict[str, FieldOutcome] = {}
        dists: dict[str, dict[Any, float]] = {}
        records: list[StageRecord] = []
        first: Any = None
        bubble = _bubble_up()
        for stage, sname in zip(self.stages, self.stage_names):
            if not pending:
                break
            req = self._request(text, pending, stage, dists)
            t0 = time.perf_counter()
            error = None
            try:
                ans = stage.answer(req)
            except bubble:
                raise
            except Exception as exc:  # any failure escalates the stage's fields
                ans, error = None, f"{type(exc).__name__}: {exc}"
            ms = (time.perf_counter() - t0) * 1e3
            answered: list[str] = []
            still: list[str] = []
            for n in pending:
                label = ans.labels.get(n, _MISSING) if ans is not None else _MISSING
                if label is _MISSING or label not in req.candidates[n]:
                    still.append(n)
                    continue
                answered.append(n)
                choice = next(c for c in self.schema.field(n).choices if c.label == label)
                prob = ans.probabilities.get(n) if ans is not None else None
                outcome[n] = FieldOutcome(n, choice.value, label, sname, prob)
                res = ans.results.get(n) if ans is not None else None
                if res is not None:
                    dists[n] = dict(res.distribution)
                    if not self.confident(n, res):
                        still.append(n)
            if ans is not None and ans.decision is not None and first is None and not records:
                first = ans.decision
            records.append(
                StageRecord(
                    sname,
                    getattr(stage, "kind", type(stage).__name__),
                    list(pending),
                    req.candidates,
                    answered,
                    still,
                    ms,
                    error,
                )
            )
            pending = still
        missing = [n for n in self.schema.field_names if n not in outcome]
        if missing:
            errs = "; ".join(f"{r.name}: {r.error}" for r in records if r.error)
            raise CascadeError(
                f"no stage answered {missing} of {self.schema.name}; stage errors: {errs or 'none'}."
            )
        native = {n: outcome[n].value for n in self.schema.field_names}
        value = self.schema.build(native)
        return CascadeResult(
            value=value,
            fields={n: outcome[n] for n in self.schema.field_names},
            stages=records,
            unresolved=pending,
            decision=first,
            elapsed_ms=(time.perf_counter() - t_start) * 1e3,
        )


_MISSING = object()
