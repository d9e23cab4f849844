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
from .checks import resolve_scoring

if TYPE_CHECKING:
    from ..engine.engine import PassMode
    from ..engine.generate import GeneratedValue
    from .checks import LabelFree, Scoring
    from .decider import Decider

__all__ = [
    "check_hybrid_options",
    "check_max_new_tokens",
    "decide_hybrid",
    "generated_result",
    "value_adapter",
]


def check_max_new_tokens(value: Any) -> int | None:
    """A request's `max_new_tokens`: None (each field's own, else 256) or an int >= 1.

    Raises:
        InvalidArgumentError: for anything else.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(
            f"max_new_tokens must be an int >= 1 or None; got {value!r}. It limits the tokens "
            "of each generated field that sets no max_new_tokens of its own."
        )
    return value


def check_hybrid_options(
    schema: Schema, *, orders: int, scoring: str, method: str, pruning: str = "auto"
) -> None:
    """Refuses the options a schema with generated fields does not take yet.

    Raises:
        InvalidArgumentError: for `orders > 1`, `scoring="pmi"`, contextual calibration or
            `pruning="on"`.
    """
    generated = [f.name for f in schema.fields if f.generated]
    what = None
    if orders > 1:
        what = f"orders={orders} (each listing order would generate its own text)"
    elif scoring == "pmi":
        what = "scoring='pmi' (its empty-context scores would need the generated text)"
    elif method == "contextual":
        what = "contextual calibration (its content-free scores would need the generated text)"
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
    decider: Decider,
    compiled: Schema,
    ctxs: list[str],
    batch_size: int,
    max_new_tokens: int | None,
    *,
    temperature: float,
    scoring: Scoring,
    mode: PassMode | None,
    choice_order: dict[str, Any] | None,
    orders: int,
    allow_empty: bool,
    calibration: LabelFree | None,
    pruning: str = "auto",
) -> list[Decision[Any]]:
    """The decisions of a schema with generated fields, in input order. Their scored
    fields are scored whole (`pruning="auto"` or `"off"`).

    Args:
        decider: The decider (engine, fitted calibration, label-free default).
        compiled: The compiled schema.
        ctxs: The checked contexts.
        batch_size: Contexts per engine call.
        max_new_tokens: The token limit of generated fields that set none.
        temperature: The scored fields' softmax temperature (generation is greedy).
        scoring: `"auto"`, `"full"` or `"constrained"` (`Decider.decide`).
        mode: The scored passes' layout, or None for the engine's default.
        choice_order: The listing order of the prompt, or None for the declared one.
        orders: Listing orders asked for (only 1 is accepted).
        allow_empty: Checked by the caller (the contexts are already checked).
        calibration: The call's label-free calibration (only `"none"` is accepted,
            also as the decider's own).
        pruning: `"auto"` or `"off"`; `"on"` is refused.

    Raises:
        InvalidArgumentError: for an option the hybrid path does not take.
        GenerationLimitError: with `context_index` the context's index in `ctxs`.
        CalibrationMismatchError: if the decider's calibration does not fit the schema.
    """
    from ..engine.hybrid import run_hybrid
    from .contextual import label_free, resolve_method
    from .scored import constrained_side

    scoring = resolve_scoring(scoring, decider.calibration)
    method = resolve_method(decider.label_free, calibration, scoring)
    check_hybrid_options(compiled, orders=orders, scoring=scoring, method=method, pruning=pruning)
    cal = decider.calibration
    if cal is not None and ctxs:
        cal.check_schema(compiled)
        cal.check_label_free(label_free(method, scoring))
    side = constrained_side(scoring, compiled)
    eos = decider.loaded.eos_ids()
    by_len = sorted(range(len(ctxs)), key=lambda i: len(ctxs[i]))
    out: list[Decision[Any] | None] = [None] * len(ctxs)
    for start in range(0, len(ctxs), batch_size):
        idx = by_len[start : start + batch_size]
        t0 = time.perf_counter()
        try:
            hb = run_hybrid(
                decider.engine,
                compiled,
                [ctxs[i] for i in idx],
                mode=mode,
                answers=WaveAnswers(compiled, temperature, scoring, cal, constrained_for=side),
                choice_order=choice_order,
                max_new_tokens=max_new_tokens,
                eos=eos,
            )
        except GenerationLimitError as e:
            if e.context_index is not None:
                e.context_index = idx[e.context_index]
            raise
        built = [_fields(compiled, hb, j, temperature, side, cal) for j in range(len(idx))]
        n = len(idx)
        timing = BatchTiming(
            size=n,
            elapsed_ms=(time.perf_counter() - t0) * 1e3,
            prefill_ms=hb.prefill_ms,
            suffix_eval_ms=hb.suffix_eval_ms,
            generate_ms=hb.generate_ms,
        )
        for j, i in enumerate(idx):
            fields, joint = built[j]
            out[i] = Decision(
                value=compiled.build({name: f.value for name, f in fields.items()}),
                fields=fields,
                prefill_ms=timing.prefill_ms / n,
                suffix_eval_ms=timing.suffix_eval_ms / n,
                elapsed_ms=timing.elapsed_ms / n,
                sequential_forward_passes=hb.sequential_forward_passes,
                prompt_tokens=hb.prompt_tokens[j],
                prefix_cache_hit=hb.prefix_cache_hit,
                model_id=decider.model_id,
                device=decider.device,
                temperature=temperature,
                scoring=scoring,
                mode=mode or decider.engine.default_mode,
                calibrated=cal is not None,
                calibration_file=getattr(cal, "path", None) if cal is not None else None,
                batch=timing,
                joint=joint,
                calibration_method=method,
                generate_ms=timing.generate_ms / n,
                segments=tuple(hb.segments[j]),
                examples=len(compiled.examples),
            )
    return [d for d in out if d is not None]


def _fields(
    schema: Schema, hb: Any, j: int, temperature: float, side: Any, cal: Any
) -> tuple[dict[str, FieldResult], Any]:
    """Row `j`'s field results in declaration order, and its joint tables; `side` says
    whether a question's scores are constrained (`deciding.constrained_side`)."""
    items = hb.scored[j]
    qs = [q for q, _, _ in items]
    flags = [side(q, t) for q, t, _ in items]
    logz = [t.score(e, constrained=c) for (_, t, e), c in zip(items, flags)]
    fields, joint = answers(schema, qs, logz, temperature, cal)
    sides = {q.field: "constrained" if c else "full" for q, c in zip(qs, flags)}
    fields = {n: replace(f, scoring=sides.get(n)) for n, f in fields.items()}
    for name, value in hb.generated[j].items():
        fields[name] = generated_result(schema.field(name), value)
    return {f.name: fields[f.name] for f in schema.fields if f.name in fields}, joint
