"""Routing on a decision: `PCDRouter` (a Runnable) and `route_on` (for LangGraph).

Both decide a schema and pick a destination from `routes` by one field's value; below the
threshold, for a value with no route, or when the decision fails, they pick `default`.
The decision is visible to the caller as one record:

- as a custom callback event `pcd_decision` (in `astream_events`, and to any handler's
  `on_custom_event`), emitted inside the current run;
- in run metadata: `PCDRouter` runs the chosen branch with `metadata["pcd_decision"]`,
  and keeps the last record in `last_decision`;
- in graph state: `route_on(...).node` is a graph node that stores the record under
  `state["pcd_decision"]`, and the edge function then routes from it without rescoring.

**The record.** The routed field's `field`, `value`, `probability` and `distribution`;
`confidence` (the lowest probability over the fields scored); `threshold`, `reason`
(`decided`, `below_threshold`, `no_route` or `error`), `route` (the destination's name)
and `error`; with `orders=k > 1`, the routed field's `flip_rate`; `route_on`'s node adds
`input_sha`. Under `decision` it holds the whole decision as JSON-safe data,
`pcd_tools.answers.payload.decision_payload` (`{"value", "confidence", "fields":
{name: {"value", "probability", "distribution"}}, "action"}`, `action` being `"review"`
below the router's threshold, or below 0.8 without one, as `DecisionTool` does), so a
handler reads the other fields without deciding again::

    state["pcd_decision"]["decision"]["fields"]["urgency"]["value"]
    state["pcd_decision"]["decision"]["value"]          # every field decided, as JSON

When the decision fails (`reason == "error"`), `decision` (and `confidence`) is None.

**Which fields are decided** (`fields=`): `"route"` (the default) decides the routed
field and only what its answer depends on (`Schema.needs`: the parents it
`depends_on`, a `choices_by` parent or child, a union's discriminator or branches, and
every field written before it once some field is generated), under the schema's whole
prompt (`Schema.part`): its probabilities are those of deciding the whole schema, and the
other fields cost nothing, generated ones included. `"all"` decides every field; a list
of field names decides those and the routed field, each with what it needs. The record's
`decision` holds the fields decided.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal

from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import patch_config

from ..answers.payload import decision_payload, shown_distribution
from ..decide.orders import check_orders
from ..decide.worker import call_model, run_on_worker
from ..errors import InvalidArgumentError
from ..schema import Schema, compile_schema
from .structured import to_context
from .threshold import check_threshold

__all__ = ["DECISION_EVENT", "REVIEW_THRESHOLD", "PCDRouter", "route_on"]

logger = logging.getLogger(__name__)

DECISION_EVENT = "pcd_decision"
_REASONS = ("decided", "below_threshold", "no_route", "error")
# The record's `decision["action"]` without a router threshold: `DecisionTool`'s default.
REVIEW_THRESHOLD = 0.8


def decided_schema(schema: Schema, field: str, fields: Any, caller: str) -> Schema:
    """The part of `schema` a router decides for `fields=` (see the module docstring).

    Raises:
        InvalidArgumentError: for a `fields` that is not `"route"`, `"all"` or a list of
            field names, or that names a field the schema does not have.
    """
    if isinstance(fields, str):
        if fields == "all":
            return schema
        if fields == "route":
            return schema.part([field])
        hint = f" (one field: fields=[{fields!r}])" if fields in schema.field_names else ""
        raise InvalidArgumentError(
            f"{caller}(fields=) is {fields!r}{hint}; accepted: 'route' (the routed field and "
            f"what it needs), 'all', or a list of field names of {schema.name}: "
            f"{schema.field_names}."
        )
    if (
        isinstance(fields, Mapping)
        or not isinstance(fields, Collection)
        or not all(isinstance(n, str) for n in fields)
    ):
        raise InvalidArgumentError(
            f"{caller}(fields=) must be 'route', 'all' or a list of field names; got {fields!r}."
        )
    unknown = [n for n in fields if n not in schema.field_names]
    if unknown:
        raise InvalidArgumentError(
            f"{caller}(fields=) names {unknown}, not fields of {schema.name}; accepted: "
            f"'route', 'all', or a list of names from {schema.field_names}."
        )
    return schema.part([field, *fields])


class _Routing:
    """The shared part: decide a field and map its value to a destination."""

    def __init__(
        self,
        decider: Any,
        schema: Any,
        field: str,
        routes: Mapping[Any, Any],
        threshold: float | None,
        default: Any,
        temperature: float,
        orders: int = 1,
        caller: str = "route_on",
        fields: Any = "route",
    ):
        self.orders = check_orders(orders)
        self.decider = decider
        self.schema: Schema = compile_schema(schema)
        try:
            spec = self.schema.field(field)
        except KeyError as exc:
            raise InvalidArgumentError(
                f"field {field!r} is not in {self.schema.name}; fields: {self.schema.field_names}."
            ) from exc
        self.field = field
        # what each decision scores: compiled once, here
        self.decided = decided_schema(self.schema, field, fields, caller)
        self.routes = {self._label(spec, k): v for k, v in routes.items()}
        if not self.routes:
            raise InvalidArgumentError("routes must map at least one value to a destination.")
        if threshold is not None:
            threshold = check_threshold(threshold, f"{caller}(threshold=)")
        self.threshold = threshold
        self.default = default
        self.temperature = temperature

    @staticmethod
    def _label(spec: Any, key: Any) -> Any:
        for c in spec.choices:
            if key == c.label or key is c.value or (key == c.value and key is not None):
                return c.label
        raise InvalidArgumentError(
            f"routes names {key!r}, which is not a value of {spec.name}; accepted: {spec.labels}."
        )

    def decide(self, text: str) -> dict[str, Any]:
        """Decides the schema's `fields=` part for `text` and returns the routing record."""
        try:
            d = call_model(
                self.decider,
                self.decider.decide,
                self.decided,
                text,
                temperature=self.temperature,
                orders=self.orders,
            )
        except Exception as exc:
            if self.default is None:
                raise
            logger.warning("pcd routing failed, using the default route: %s", exc)
            return self._record(
                None, None, {}, "error", self.default, f"{type(exc).__name__}: {exc}"
            )
        f = d.fields[self.field]
        if (
            self.threshold is not None
            and f.probability < self.threshold
            and self.default is not None
        ):
            reason, dest = "below_threshold", self.default
        elif f.label in self.routes:
            reason, dest = "decided", self.routes[f.label]
        elif self.default is not None:
            reason, dest = "no_route", self.default
        else:
            raise InvalidArgumentError(
                f"{self.field}={f.label!r} has no route and no default; routes: {list(self.routes)}."
            )
        rec = self._record(f.label, f.probability, dict(shown_distribution(f)), reason, dest, None)
        if self.orders > 1:
            rec["flip_rate"] = f.flip_rate
        rec["confidence"] = d.confidence
        review = self.threshold if self.threshold is not None else REVIEW_THRESHOLD
        rec["decision"] = decision_payload(d, review)
        return rec

    def _record(
        self,
        value: Any,
        p: float | None,
        dist: dict[Any, float],
        reason: str,
        dest: Any,
        err: str | None,
    ) -> dict[str, Any]:
        rec = {
            "field": self.field,
            "value": value,
            "probability": p,
            "distribution": dist,
            "threshold": self.threshold,
            "reason": reason,
            "route": dest if isinstance(dest, str) else getattr(dest, "name", repr(dest)),
            "error": err,
            "confidence": None,  # set when the decision succeeds
            "decision": None,  # set when the decision succeeds
            "_dest": dest,
        }
        if self.orders > 1:
            rec["flip_rate"] = None  # set when the decision succeeds
        return rec


def public_record(rec: dict[str, Any]) -> dict[str, Any]:
    """The routing record without its private keys (the destination object)."""
    return {k: v for k, v in rec.items() if not k.startswith("_")}


def _emit(rec: dict[str, Any], config: RunnableConfig | None = None) -> None:
    from langchain_core.callbacks.manager import dispatch_custom_event

    with contextlib.suppress(RuntimeError):  # not inside a run: nobody to tell
        dispatch_custom_event(DECISION_EVENT, public_record(rec), config=config)


class PCDRouter(Runnable[Any, Any]):
    """Runs the branch of the value PCD chooses for one field.

    Args:
        decider: The `Decider`.
        schema: The decision schema.
        field: The field to route on.
        routes: Value (label or native value, e.g. an Enum member) -> Runnable or callable.
        threshold: Below this probability, run `default` instead.
        default: Runnable for low confidence, unmapped values and errors (None: raise).
        input_key: For mapping inputs, the key holding the text (else JSON of the mapping).
        temperature: Softmax temperature.
        orders: Average the distribution over this many listing orders
            (`Decider.decide(..., orders=k)`); the record then holds `flip_rate`.
        fields: Which fields each decision scores: `"route"` (the routed field and what
            its answer depends on, under the schema's whole prompt, so with the same
            probabilities as deciding every field), `"all"`, or a list of field names
            (with the routed field, each with what it needs). The record's `decision`
            holds those fields (see the module docstring).

    Raises:
        InvalidArgumentError: for an unknown field or route value, a threshold outside
            [0, 1], a bad `orders`, or a `fields` that is not `"route"`, `"all"` or a
            list of the schema's field names.

    The branch receives the router's input unchanged, with the record (the whole
    decision under its `decision` key) in `metadata["pcd_decision"]` of its config; a
    `pcd_decision` custom event is emitted in the router's run, and `last_decision`
    keeps the last record.
    """

    def __init__(
        self,
        decider: Any,
        schema: Any,
        field: str,
        routes: Mapping[Any, Any],
        threshold: float | None = None,
        default: Any = None,
        *,
        input_key: str = "input",
        temperature: float = 1.0,
        orders: int = 1,
        fields: str | Sequence[str] = "route",
    ):
        from langchain_core.runnables.base import coerce_to_runnable

        self._routing = _Routing(
            decider,
            schema,
            field,
            routes,
            threshold,
            default,
            temperature,
            orders,
            "PCDRouter",
            fields,
        )
        self._routing.routes = {k: coerce_to_runnable(v) for k, v in self._routing.routes.items()}
        if default is not None:
            self._routing.default = coerce_to_runnable(default)
        self.input_key = input_key
        self.last_decision: dict[str, Any] | None = None

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"PCDRouter[{self._routing.schema.name}.{self._routing.field}]"

    def _branch_config(
        self, rec: dict[str, Any], config: RunnableConfig, run_manager: Any
    ) -> RunnableConfig:
        meta = {**(config.get("metadata") or {}), DECISION_EVENT: public_record(rec)}
        return patch_config({**config, "metadata": meta}, callbacks=run_manager.get_child())

    def _route(self, input: Any, run_manager: Any, config: RunnableConfig) -> Any:
        text, _ = to_context(input, input_key=self.input_key)
        rec = self._routing.decide(text)
        self.last_decision = public_record(rec)
        _emit(rec, config)
        return rec["_dest"].invoke(input, self._branch_config(rec, config, run_manager))

    async def _aroute(self, input: Any, run_manager: Any, config: RunnableConfig) -> Any:
        text, _ = to_context(input, input_key=self.input_key)
        rec = await run_on_worker(self._routing.decider, self._routing.decide, text)
        self.last_decision = public_record(rec)
        from langchain_core.callbacks.manager import adispatch_custom_event

        with contextlib.suppress(RuntimeError):
            await adispatch_custom_event(DECISION_EVENT, public_record(rec), config=config)
        return await rec["_dest"].ainvoke(input, self._branch_config(rec, config, run_manager))

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """Decides, emits `pcd_decision`, then invokes the chosen branch with `input`."""
        return self._call_with_config(self._route, input, config, run_type="chain")

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """Async `invoke`; the decision runs on the engine worker."""
        return await self._acall_with_config(self._aroute, input, config, run_type="chain")


def route_on(
    decider: Any,
    schema: Any,
    field: str,
    routes: Mapping[Any, str],
    threshold: float | None = None,
    default: str | None = None,
    input_key: str = "input",
    *,
    state_key: str = DECISION_EVENT,
    temperature: float = 1.0,
    orders: int = 1,
    fields: str | Sequence[str] = "route",
) -> Callable[[Any], Any]:
    """A LangGraph routing function: `builder.add_conditional_edges(src, route_on(...))`.

    Its return annotation is `Literal[<destinations>]`, so LangGraph infers the path map
    and draws exactly these edges.

    Args:
        decider: The `Decider`.
        schema: The decision schema.
        field: The field to route on.
        routes: Value (label or native value) -> node name.
        threshold: Below this probability, go to `default`.
        default: Node for low confidence, unmapped values and errors (None: raise).
        input_key: State key holding the text (str or messages).
        state_key: State key where `.node` stores the decision record.
        temperature: Softmax temperature.
        orders: Average the distribution over this many listing orders
            (`Decider.decide(..., orders=k)`); the record then holds `flip_rate`.
        fields: Which fields each decision scores: `"route"` (the routed field and what
            its answer depends on, under the schema's whole prompt, so with the same
            probabilities as deciding every field), `"all"`, or a list of field names
            (with the routed field, each with what it needs).

    Returns:
        `route(state) -> node name`. Its attribute `.node` is a graph node
        (`state -> {state_key: record}`) that decides and stores the record in state;
        when the state already holds the record for the current input, `route` uses it.
        The record holds the decision of `fields` as JSON under `decision`, so a later
        node reads e.g. `state["pcd_decision"]["decision"]["fields"]["urgency"]["value"]`
        without deciding again (see the module docstring).

    Raises:
        InvalidArgumentError: for an unknown field or route value, a destination that is
            not a str, a threshold outside [0, 1], a bad `orders`, or a `fields` that is
            not `"route"`, `"all"` or a list of the schema's field names.
    """
    r = _Routing(
        decider, schema, field, routes, threshold, default, temperature, orders, "route_on", fields
    )
    dests = list(dict.fromkeys([*r.routes.values(), *([default] if default is not None else [])]))
    for d in dests:
        if not isinstance(d, str):
            raise InvalidArgumentError(
                f"route_on destinations must be node names (str); got {d!r}."
            )

    def text_of(state: Any) -> str:
        value = (
            state.get(input_key) if isinstance(state, Mapping) else getattr(state, input_key, state)
        )
        return to_context(value if value is not None else state)[0]

    def decide(state: Any) -> dict[str, Any]:
        text = text_of(state)
        rec = r.decide(text)
        out = public_record(rec)
        out["input_sha"] = hashlib.sha256(text.encode()).hexdigest()[:16]
        return out

    def route(state: Any) -> Any:
        stored = (
            state.get(state_key) if isinstance(state, Mapping) else getattr(state, state_key, None)
        )
        if isinstance(stored, Mapping) and stored.get("route") in dests:
            sha = hashlib.sha256(text_of(state).encode()).hexdigest()[:16]
            if stored.get("input_sha") == sha:
                return stored["route"]
        rec = decide(state)
        _emit(rec)
        return rec["route"]

    def node(state: Any) -> dict[str, Any]:
        rec = decide(state)
        _emit(rec)
        return {state_key: rec}

    route.__annotations__ = {"state": Any, "return": Literal[tuple(dests)]}
    route.__name__ = f"route_on_{field}"
    node.__name__ = f"decide_{field}"
    route.node = node  # type: ignore[attr-defined]
    route.destinations = dests  # type: ignore[attr-defined]
    return route
