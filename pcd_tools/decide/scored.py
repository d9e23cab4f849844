"""One listing order's decisions: the engine's scored batches turned into `Decision`s.

`Decider.decide_many` calls `decide_in_order` once per listing order. It batches the
contexts by length, runs the engine (with the waves of dependent fields), applies the
label-free correction (`pcd_tools.decide.contextual`), then the decider's fitted calibration,
and builds each `Decision` with its share of the call's times.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..answers.bounds import PartialScores, SearchReport
from ..answers.joint import answers
from ..answers.ranked import RankedGoal
from ..answers.result import BatchTiming, Decision
from ..answers.waves import WaveAnswers, has_waves
from ..engine.passes.prune import Pruning
from ..prompt import PromptPreview, field_suffix
from ..schema import Schema, compile_schema, with_examples
from ..schema.generated import segments
from .batches import CallRecord, length_batches
from .checks import check_context

if TYPE_CHECKING:
    from ..engine.scorer import PassMode, ScoredBatch
    from .contextual import Correction
    from .methods import Method
    from .options import DecideOptions
    from .state import DecideState

__all__ = ["decide_in_order", "prompt_preview"]


def decide_in_order(
    state: DecideState,
    compiled: Schema,
    ctxs: list[str],
    batch_size: int,
    options: DecideOptions,
    order: Mapping[str, Sequence[int]] | None,
    method: Method,
    pruning: str = "off",
) -> list[Decision[Any]]:
    """The decisions of `ctxs` under one listing order, in input order.

    Args:
        state: The decider's state (engine, fitted calibration, content-free scores).
        compiled: The compiled schema, with its examples.
        ctxs: The checked contexts.
        batch_size: Contexts per engine call.
        options: The call's checked options (its temperature and pass mode are read here).
        order: The listing order of the prompt, or None for the declared one.
        method: The call's resolved scoring and label-free correction (under side
            `"auto"`, a field that pruning reads in part is scored constrained and every
            other field full, and each `FieldResult.scoring` says which).
        pruning: `"auto"`, `"on"` or `"off"` (`pcd_tools.engine.passes.prune.pruning_for`).

    Raises:
        CalibrationMismatchError: if the decider's calibration was fitted for another
            schema or on top of another label-free correction.
        InvalidArgumentError: for `pruning="on"` with contextual calibration or a pass
            mode other than packed.
    """
    plan_order = dict(order) if order is not None else None
    temperature, mode = options.temperature, options.mode
    call = CallRecord.start(
        state, compiled, ctxs, temperature=temperature, mode=mode, method=method
    )
    cal = call.calibration
    pruner = _pruning(state, compiled, pruning, method, mode, temperature, cal)
    side = method.constrained_side(compiled)
    out: list[Decision[Any] | None] = [None] * len(ctxs)
    for idx in length_batches(ctxs, batch_size):
        t0 = time.perf_counter()
        corr = method.correction_for(state.content_free, compiled, plan_order)
        if corr is not None:
            corr.prepare(state.engine.plan(compiled, plan_order).questions)
        follow_up = (
            WaveAnswers(compiled, temperature, side, cal, corr).next_questions
            if has_waves(compiled)
            else None
        )
        batch = state.engine.score(
            compiled,
            [ctxs[i] for i in idx],
            mode=mode,
            choice_order=plan_order,
            follow_up=follow_up,
            pruning=pruner,
        )
        logz = [
            _log_scores(state, compiled, batch, j, method, plan_order, corr, pruner)
            for j in range(len(idx))
        ]
        timing = BatchTiming(
            size=len(idx),
            elapsed_ms=(time.perf_counter() - t0) * 1e3,
            prefill_ms=batch.prefill_ms,
            suffix_eval_ms=batch.suffix_eval_ms,
            content_free_ms=corr.ms if corr is not None else 0.0,
            attention_ms=batch.attention_ms,
        )
        for j, i in enumerate(idx):
            asked, z, sides = logz[j]
            fields, joint = answers(compiled, asked, z, temperature, cal)
            fields = {n: replace(f, scoring=sides.get(n)) for n, f in fields.items()}
            out[i] = call.decision(
                compiled,
                fields,
                joint,
                timing,
                passes=batch.sequential_forward_passes,
                prompt_tokens=batch.prompt_tokens[j],
                prefix_cache_hit=batch.prefix_cache_hit,
            )
    return [d for d in out if d is not None]


def _log_scores(
    state: DecideState,
    schema: Schema,
    batch: ScoredBatch,
    i: int,
    method: Method,
    order: dict[str, Sequence[int]] | None,
    correction: Correction | None,
    pruning: Pruning | None = None,
) -> tuple[list[Any], list[Any], dict[str, str]]:
    """Row `i`'s questions and their candidate log scores, corrected if asked (a pruned
    question's are `PartialScores`, also when its search scored every candidate), and
    the scoring each field's scores used."""
    plan = state.engine.plan(schema, order)
    asked = batch.questions[i] if batch.questions else plan.questions
    tries = batch.tries[i] if batch.tries else plan.tries
    side = method.constrained_side(schema)
    flags = [side(q, trie) for q, trie in zip(asked, tries)]
    logz: list[Any] = [
        trie.scores(edge, constrained=c) for trie, edge, c in zip(tries, batch.edge_logp[i], flags)
    ]
    sides = {q.field: method.field_scoring(c) for q, c in zip(asked, flags)}
    if correction is not None:
        logz = correction(asked, logz)
    if pruning is not None:
        logz = [
            _with_search(z, pruning.report(e), pruning.select(q, trie))
            for q, trie, z, e in zip(asked, tries, logz, batch.edge_logp[i])
        ]
    return list(asked), logz, sides


def _with_search(z: Any, search: SearchReport | None, selected: bool) -> Any:
    """A pruned question's scores as `PartialScores` carrying its search's report (also
    when the search scored every candidate); any other question's as they are."""
    if isinstance(z, np.ndarray):
        return PartialScores.whole(z, search) if selected else z
    return replace(z, search=search) if isinstance(z, PartialScores) else z


def _pruning(
    state: DecideState,
    schema: Schema,
    pruning: str,
    method: Method,
    mode: PassMode | None,
    temperature: float,
    cal: Any,
) -> Pruning | None:
    """The request's pruning: none with a label-free correction (it needs every score)
    or off the packed pass; fields with fitted biases are scored whole under `"auto"`;
    a ranked multi-label field's search settles its chosen labels (`RankedGoal`)."""
    biased = frozenset(cal.biases) if cal is not None and pruning == "auto" else frozenset()
    got = method.pruning(schema, pruning, mode=mode or state.engine.default_mode, whole=biased)
    ranked = {
        f.name: RankedGoal.of(f, temperature, cal) for f in schema.fields if f.reading == "ranked"
    }
    return replace(got, ranked=ranked) if got is not None and ranked else got


def prompt_preview(
    state: DecideState,
    schema: Any,
    context: str,
    choice_order: Mapping[str, Sequence[int]] | None,
    examples: Sequence[Any] | None,
) -> PromptPreview:
    """`Decider.prompt`: the prompt's text and token counts, from the engine's own ids."""
    compiled = compile_schema(schema)
    if examples is not None:
        compiled = with_examples(compiled, examples)
    ctx = check_context(context, allow_empty=True)
    order: dict[str, Sequence[int]] | None = (
        {n: list(o) for n, o in choice_order.items()} if choice_order else None
    )
    plan = state.engine.plan(compiled, order)
    ctx_ids = state.engine.encode_ids(ctx)
    state.engine.check_length(plan, ctx_ids)
    ids = [*plan.head_ids, *ctx_ids, *plan.tail_ids]
    return PromptPreview(
        text=state.loaded.tokenizer.decode(ids),
        token_ids=tuple(ids),
        schema_tokens=len(plan.head_ids),
        context_tokens=len(ctx_ids),
        answer_start_tokens=len(plan.tail_ids),
        field_suffixes={f.name: field_suffix(f) for f in compiled.fields},
        examples=len(compiled.examples),
        segments=tuple(segments(compiled)),
    )
