"""Decisions of schemas with generated fields (the hybrid path).

`Decider.decide` / `decide_many` come here when some field is generated
(`Schema.hybrid`). The engine answers the segments in declaration order on each
context's KV cache (`pcd_tools.engine.hybrid`); this module checks the options the path
takes, turns the scored questions into `FieldResult`s exactly as for other schemas
(temperature, fitted calibration, joint tables, union branches) and each generated value
into a `FieldResult` without a probability, and builds the `Decision`s with their
segments and timings.

`decide_many` batches the prefill and each scored segment's pass across contexts, and on
CPU engines with native decode (`engine.fast_decode`) steps every context's generated
field in lockstep, the weights read once per step for all of them; on the MLX path the
contexts decode one after another.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ..answers.joint import answers
from ..answers.result import BatchTiming, Decision, FieldResult
from ..answers.waves import WaveAnswers
from ..errors import GenerationError, GenerationLimitError, InvalidArgumentError
from ..schema import FieldSpec, Schema
from ..schema.spec import value_adapter
from .batches import CallRecord, length_batches
from .methods import RAW_FULL, Method

if TYPE_CHECKING:
    from ..engine.decode.generate import GeneratedValue
    from .options import DecideOptions
    from .state import DecideState

__all__ = [
    "check_hybrid_options",
    "decide_hybrid",
    "generated_result",
    "value_adapter",
]


def check_hybrid_options(
    schema: Schema, *, orders: int, method: Method = RAW_FULL, pruning: str = "auto"
) -> None:
    """Refuses the options a schema with generated fields does not take yet.

    Raises:
        InvalidArgumentError: for `orders > 1`, a label-free correction (PMI, contextual
            calibration: its content-free scores would need the generated text) or
            `pruning="on"`.
    """
    generated = [f.name for f in schema.fields if f.generated]
    what = None
    if orders > 1:
        what = f"orders={orders} (each listing order would generate its own text)"
    elif method.correction.needs_every_score:
        what = (
            f"{method.correction.option} ({method.correction.what} would need the generated text)"
        )
    elif pruning == "on":
        what = "pruning='on' (the scored segments between generated fields are scored whole)"
    if what is not None:
        raise InvalidArgumentError(
            f"{schema.name} has generated fields {generated}: {what} is not supported with "
            "them; accepted: orders=1, scoring='full' or 'constrained', calibration 'none' or "
            "a fitted calibration, pruning 'auto' or 'off'."
        )


def generated_result(spec: FieldSpec, value: GeneratedValue) -> FieldResult:
    """A generated field's `FieldResult`: its JSON value as the label, the validated
    Python value (a date parsed from its ISO string), and how it was decoded.

    Raises:
        GenerationError: if the text does not parse or validate (the grammar and the
            model's constraints disagree, e.g. a pattern that lets a quote through).
    """
    assert spec.generation is not None
    try:
        label = json.loads(value.text)
        native = value_adapter(spec.generation, spec.optional).validate_python(label)
    except (ValueError, ValidationError) as e:
        raise GenerationError(
            f"{spec.name}: the generated value {value.text!r} does not validate as "
            f"{spec.generation.json_schema(spec.optional)} ({e}).",
            field=spec.name,
            partial_text=value.text,
        ) from None
    return FieldResult.from_generated(
        spec,
        native,
        label,
        tokens=len(value.token_ids),
        generation_ms=value.ms,
        mean_logprob=value.mean_logprob,
    )


def decide_hybrid(
    state: DecideState,
    compiled: Schema,
    ctxs: list[str],
    batch_size: int,
    options: DecideOptions,
) -> list[Decision[Any]]:
    """The decisions of a schema with generated fields, in input order. Their scored
    fields are scored whole (`pruning="auto"` or `"off"`).

    Args:
        state: The decider's state (engine, model, fitted calibration, label-free
            default).
        compiled: The compiled schema.
        ctxs: The checked contexts.
        batch_size: Contexts per engine call.
        options: The call's checked options. Generation is greedy (the temperature is
            the scored fields'); `max_new_tokens` limits generated fields that set none.
            Only `orders=1`, scoring `"auto"`, `"full"` or `"constrained"`, calibration
            `"none"` (also as the decider's own) and pruning `"auto"` or `"off"` are
            accepted.

    Raises:
        InvalidArgumentError: for an option the hybrid path does not take.
        GenerationLimitError: with `context_index` the context's index in `ctxs`.
        CalibrationMismatchError: if the decider's calibration does not fit the schema.
    """
    from ..engine.hybrid import run_hybrid

    temperature, mode = options.temperature, options.mode
    method = Method.resolve(
        options.scoring, state.label_free, options.calibration, state.calibration
    )
    check_hybrid_options(compiled, orders=options.orders, method=method, pruning=options.pruning)
    call = CallRecord.start(
        state, compiled, ctxs, temperature=temperature, mode=mode, method=method
    )
    cal = call.calibration
    side = method.constrained_side(compiled)
    eos = state.loaded.eos_ids()
    out: list[Decision[Any] | None] = [None] * len(ctxs)
    for idx in length_batches(ctxs, batch_size):
        t0 = time.perf_counter()
        try:
            hb = run_hybrid(
                state.engine,
                compiled,
                [ctxs[i] for i in idx],
                mode=mode,
                answers=WaveAnswers(compiled, temperature, side, cal),
                choice_order=options.order,
                max_new_tokens=options.max_new_tokens,
                eos=eos,
            )
        except GenerationLimitError as e:
            if e.context_index is not None:
                e.context_index = idx[e.context_index]
            raise
        built = [_fields(compiled, hb, j, temperature, method, cal) for j in range(len(idx))]
        timing = BatchTiming(
            size=len(idx),
            elapsed_ms=(time.perf_counter() - t0) * 1e3,
            prefill_ms=hb.prefill_ms,
            suffix_eval_ms=hb.suffix_eval_ms,
            generate_ms=hb.generate_ms,
            attention_ms=hb.attention_ms,
        )
        for j, i in enumerate(idx):
            fields, joint = built[j]
            out[i] = call.decision(
                compiled,
                fields,
                joint,
                timing,
                passes=hb.sequential_forward_passes,
                prompt_tokens=hb.prompt_tokens[j],
                prefix_cache_hit=hb.prefix_cache_hit,
                segments=hb.segments[j],
            )
    return [d for d in out if d is not None]


def _fields(
    schema: Schema, hb: Any, j: int, temperature: float, method: Method, cal: Any
) -> tuple[dict[str, FieldResult], Any]:
    """Row `j`'s field results in declaration order, and its joint tables, read on the
    sides of `method`."""
    items = hb.scored[j]
    qs = [q for q, _, _ in items]
    side = method.constrained_side(schema)
    flags = [side(q, t) for q, t, _ in items]
    logz = [t.score(e, constrained=c) for (_, t, e), c in zip(items, flags)]
    fields, joint = answers(schema, qs, logz, temperature, cal)
    sides = {q.field: method.field_scoring(c) for q, c in zip(qs, flags)}
    fields = {n: replace(f, scoring=sides.get(n)) for n, f in fields.items()}
    for name, value in hb.generated[j].items():
        fields[name] = generated_result(schema.field(name), value)
    return {f.name: fields[f.name] for f in schema.fields if f.name in fields}, joint
