"""`Cascade`: keep confident fields, escalate the others to a bigger model or a human.

Stage 1 (usually a small local `Decider`) decides every field. Each field whose score is
below its threshold, and every field of a stage that failed, goes to the next stage,
which sees only those fields, each narrowed to the top-k candidates so far, most
probable first. A stage is:

- a LangChain chat model, called through its `with_structured_output` with that
  narrowed sub-schema (`ChatModelStage`);
- another `Decider`, e.g. a bigger local model (`DeciderStage`);
- a human, through a callable or LangGraph's `interrupt(..., response_schema=...)`
  (`HumanStage`);
- an OpenAI Decisions API server, e.g. a remote `pcd serve`, through `langchain_openai`'s
  `OpenAIDecisions` (`DecisionsStage`): one `predicate` or `choice` question per field,
  answered with probabilities, so its fields can escalate again.

Answers from stages that report no probability (chat models, humans) are final. `batch`
sends a batch's escalated rows to the next stage together (one `decide_many` per narrowed
sub-schema for a `DeciderStage`). With `escalate_when="set_size>1"` the rule is the calibration's instead of a threshold: a
field escalates exactly when its split-conformal prediction set at `coverage` (default
0.9; `FieldResult.prediction_set`) holds more than one answer, and the next stage's
`EscalationRequest.prediction_sets` (a `HumanStage`'s payload too) carries that set.

A schema with generated fields (`reason: str`, `amount: float`, ...) works too. Only
scored fields escalate: a generated value has no probability to judge it by, so the
first stage that answers it is final (a stage that fails passes it on like any field).
Later stages see the generated values declared before the fields they are asked, as
already decided, the way the hybrid prompt shows a decision its reasoning. A stage that
raises is logged at WARNING on the `pcd_tools.agents.cascade` logger and recorded in
`CascadeResult.errors`; its fields go on to the next stage, or, with
`on_stage_error="raise"`, the exception propagates. `LowConfidenceError` carries a
`Decision`, so LangChain's `.with_fallbacks(..., exceptions_to_handle=(LowConfidenceError,))`
is a one-line cascade. Stages live in `stages`, results in `outcomes`, errors in `errors`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from langchain_core.runnables import Runnable, RunnableConfig
from pydantic import BaseModel, ValidationError

from ..answers.conformal import PredictionSetError, check_coverage
from ..errors import InvalidArgumentError
from ..schema import FieldSpec, compile_schema
from ..schema.spec import value_adapter
from .decisions_stage import DecisionsStage, is_decisions_model
from .errors import CascadeError, LowConfidenceError
from .outcomes import CascadeResult, FieldOutcome, StageRecord
from .outcomes import Row as _Row
from .stages import (
    ChatModelStage,
    DeciderStage,
    EscalationRequest,
    HumanStage,
    named_stage,
    narrowed_model,
)
from .stages import StageAnswer as StageAnswer
from .structured import to_context
from .threshold import check_threshold

__all__ = [
    "Cascade",
    "CascadeError",
    "CascadeResult",
    "ChatModelStage",
    "DeciderStage",
    "DecisionsStage",
    "EscalationRequest",
    "FieldOutcome",
    "HumanStage",
    "LowConfidenceError",
    "StageRecord",
    "narrowed_model",
]

ScoreName = Literal["probability", "margin", "entropy"]
_SCORES = ("probability", "margin", "entropy")
OnStageError = Literal["skip", "raise"]
_ON_STAGE_ERROR = ("skip", "raise")
EscalateWhen = Literal["set_size>1"]
_ESCALATE_WHEN = ("set_size>1",)

logger = logging.getLogger(__name__)


# --- the cascade ------------------------------------------------------------------------------


def as_stage(obj: Any) -> Any:
    """A stage from a `Decider` or model name, chat model, `OpenAIDecisions`, callable, "human"."""
    if hasattr(obj, "answer") and hasattr(obj, "name"):
        return obj
    if hasattr(obj, "decide") and hasattr(obj, "engine"):
        return DeciderStage(obj)
    if is_decisions_model(obj):
        return DecisionsStage(obj)
    if hasattr(obj, "with_structured_output"):
        return ChatModelStage(obj)
    if isinstance(obj, str) or hasattr(obj, "__fspath__"):  # "human" or a model's name
        return named_stage(obj)
    if callable(obj):
        return HumanStage(obj)
    raise InvalidArgumentError(
        f"cannot use {type(obj).__name__} as a cascade stage; accepted: a Decider or a model's "
        "name ('embedded', a path, an id), a LangChain chat model, a langchain_openai "
        "OpenAIDecisions, a callable (a human), 'human' (LangGraph interrupt) or a stage object."
    )


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
        stages: Stages in order (`Decider` or a model's name as `Decider.load` takes it, chat
            model, `OpenAIDecisions`, callable/`"human"`, or stage objects).
        threshold: Default threshold. A field is confident when its probability (or margin)
            is >= threshold, or its entropy in nats is <= threshold. `"fitted"` reads
            per-field thresholds fitted to a target (`pcd calibrate --cascade`,
            `pcd_tools.eval.cascade.fit_cascade`) from the first stage's calibration.
        per_field: Per-field thresholds: a number, or `(score, number)` to change the score.
        score: `"probability"` (default), `"margin"` or `"entropy"`.
        on_stage_error: When a stage raises: `"skip"` (default) logs a warning, records it
            in `CascadeResult.errors` and passes its fields to the next stage; `"raise"`
            logs it and re-raises the stage's exception.
        escalate_when: None (default: the thresholds above), or `"set_size>1"`: a scored
            field escalates exactly when its prediction set at `coverage` has more than
            one answer (split conformal prediction; `threshold`, `per_field` and `score`
            are then not used). Every stage that scores fields (a `Decider`) needs a
            calibration with conformal scores (`pcd calibrate`); the next stage receives
            the sets (`EscalationRequest.prediction_sets`, `HumanStage.payload`).
        coverage: The coverage of those sets, in (0, 1) (default 0.9).

    Raises:
        InvalidArgumentError: for no stages, an unknown score, `on_stage_error` or
            `escalate_when`, a field not in the schema, a threshold on a generated field,
            a threshold out of range (a probability or margin outside [0, 1], a negative
            entropy), `per_field` with `escalate_when`, or `escalate_when="set_size>1"`
            on a schema with a multi-label or `choices_by` field (no prediction set).
        CoverageError: (an `InvalidArgumentError`) for a coverage outside (0, 1).
        NoConformalScoresError: at run time, when a stage's decision has no conformal
            scores for a field it must judge (`FieldResult.prediction_set`).
    """

    def __init__(
        self,
        schema: Any,
        stages: Sequence[Any],
        threshold: float | Literal["fitted"] = 0.8,
        per_field: Mapping[str, float | tuple[str, float]] | None = None,
        *,
        score: ScoreName = "probability",
        on_stage_error: OnStageError = "skip",
        escalate_when: EscalateWhen | None = None,
        coverage: float = 0.9,
    ):
        if on_stage_error not in _ON_STAGE_ERROR:
            raise InvalidArgumentError(
                f"on_stage_error={on_stage_error!r} is not accepted; expected one of "
                f"{list(_ON_STAGE_ERROR)}."
            )
        self.on_stage_error = on_stage_error
        self.schema = compile_schema(schema)
        self.generated = [f.name for f in self.schema.fields if f.generated]
        self.as_model = isinstance(schema, type) and issubclass(schema, BaseModel)
        if not stages:
            raise InvalidArgumentError("a Cascade needs at least one stage.")
        self.stages = [as_stage(s) for s in stages]
        seen: dict[str, int] = {}
        self.stage_names = []
        for s in self.stages:
            seen[s.name] = seen.get(s.name, 0) + 1
            self.stage_names.append(s.name if seen[s.name] == 1 else f"{s.name}#{seen[s.name]}")
        if score not in _SCORES:
            raise InvalidArgumentError(f"unknown score {score!r}; accepted: {list(_SCORES)}.")
        fitted = self._fitted(threshold)
        t0 = 0.0 if fitted else check_threshold(threshold, "Cascade(threshold=)", score=score)
        self.thresholds = {n: (score, t0) for n in self.schema.field_names}
        self.thresholds.update(fitted)  # type: ignore[arg-type]
        for n, rule in (per_field or {}).items():
            if n in self.generated:
                raise InvalidArgumentError(
                    f"per_field names {n!r}, a generated field of {self.schema.name}: it has "
                    "no probability to hold to a threshold and never escalates; accepted: "
                    f"the scored fields {[m for m in self.thresholds if m not in self.generated]}."
                )
            if n not in self.thresholds:
                raise InvalidArgumentError(
                    f"per_field names {n!r}, which is not a field of {self.schema.name}; "
                    f"fields: {self.schema.field_names}."
                )
            sc, t = rule if isinstance(rule, tuple) else (score, rule)
            if sc not in _SCORES:
                raise InvalidArgumentError(f"unknown score {sc!r}; accepted: {list(_SCORES)}.")
            arg = f"Cascade(per_field={{{n!r}: {rule!r}}})"
            self.thresholds[n] = (sc, check_threshold(t, arg, score=sc))  # type: ignore[assignment]
        if fitted:
            scored = [n for n in self.schema.field_names if n not in self.generated]
            uncovered = [n for n in scored if n not in fitted and n not in (per_field or {})]
            if uncovered:
                raise InvalidArgumentError(
                    f"Cascade(threshold='fitted'): the fitted cascade has no threshold for "
                    f"{uncovered} of {self.schema.name} (multi-label and `choices_by` fields "
                    "are not fitted); give them per_field thresholds."
                )
        self.escalate_when = self._check_rule(escalate_when, per_field)
        self.coverage = check_coverage(coverage, "Cascade(coverage=)")

    def _fitted(self, threshold: Any) -> dict[str, tuple[str, float]]:
        """`threshold="fitted"`: the per-field thresholds fitted to a target and stored in
        the first stage's calibration (`pcd calibrate --cascade`, `CascadeFit.attach`)."""
        if threshold != "fitted":
            return {}
        decider = getattr(self.stages[0], "decider", None)
        cal = getattr(decider, "calibration", None)
        entry = getattr(cal, "cascade", None)
        if not entry:
            where = (
                "its first stage is not a Decider"
                if decider is None
                else "its first stage's Decider has no calibration"
                if cal is None
                else f"calibration {getattr(cal, 'path', None)!r} has no fitted cascade"
            )
            raise InvalidArgumentError(
                f"Cascade(threshold='fitted') reads per-field thresholds fitted to a target "
                f"from the first stage's calibration, but {where}; fit them with `pcd "
                "calibrate --cascade LARGE` (or `fit_cascade(...).attach(cal).save(path)`) and "
                "load the Decider with calibration=that file, or pass a number."
            )
        out: dict[str, tuple[str, float]] = {}
        for n, (sc, t) in dict(entry["thresholds"]).items():
            if n not in self.schema.field_names:
                raise InvalidArgumentError(
                    f"the fitted cascade in {getattr(cal, 'path', None)!r} names {n!r}, which "
                    f"is not a field of {self.schema.name}; fields: {self.schema.field_names}."
                )
            out[n] = (sc, check_threshold(t, f"fitted threshold of {n!r}", score=sc))
        return out

    def _check_rule(self, rule: Any, per_field: Any) -> EscalateWhen | None:
        if rule is None:
            return None
        if rule not in _ESCALATE_WHEN:
            raise InvalidArgumentError(
                f"Cascade(escalate_when={rule!r}) is not accepted; expected None (thresholds) "
                f"or one of {list(_ESCALATE_WHEN)}."
            )
        if per_field:
            raise InvalidArgumentError(
                f"Cascade(escalate_when={rule!r}) judges every field by its prediction set, "
                "so per_field thresholds would not be used; pass one or the other."
            )
        no_set = [
            f.name for f in self.schema.fields if f.kind == "multilabel" or f.choices_by is not None
        ]
        if no_set:
            raise InvalidArgumentError(
                f"Cascade(escalate_when={rule!r}) needs a prediction set for every scored field, "
                f"but {no_set} of {self.schema.name} are multi-label or scored jointly "
                "(`choices_by`), which have none; use a threshold cascade for this schema."
            )
        return rule

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"Cascade[{self.schema.name}]"

    def confident(self, name: str, result: Any) -> bool:
        """Whether a `FieldResult` meets its field's threshold (under
        `escalate_when="set_size>1"`: whether its prediction set is a single answer)."""
        if self.escalate_when is not None:
            return len(result.prediction_set(self.coverage)) <= 1
        sc, t = self.thresholds[name]
        if sc == "entropy":
            return bool(result.entropy <= t)
        return bool(getattr(result, sc) >= t)

    def invoke(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> CascadeResult:
        """Runs the cascade on a string, messages or a mapping (see `to_context`)."""
        return self._call_with_config(self._run, input, config, run_type="chain")

    def _parents(self, spec: FieldSpec) -> list[str]:
        """The fields whose answers `spec` is decided after or conditioned on."""
        out = list(spec.depends_on)
        if spec.choices_by is not None:
            out.append(spec.choices_by[0])
        if spec.branch is not None:
            out.append(spec.branch[0])
        return list(dict.fromkeys(out))

    def _allowed(self, spec: FieldSpec, accepted: Mapping[str, FieldOutcome]) -> list[Any]:
        """The field's labels, only those allowed with an accepted `choices_by` parent."""
        if spec.choices_by is not None and spec.choices_by[0] in accepted:
            parent, table = spec.choices_by
            pi = next(
                i
                for i, c in enumerate(self.schema.field(parent).choices)
                if c.label == accepted[parent].label
            )
            return [spec.choices[i].label for i in table[pi]]
        return list(spec.labels)

    def _request(
        self,
        text: str,
        names: list[str],
        stage: Any,
        prev: dict[str, Any],
        accepted: Mapping[str, FieldOutcome],
        sets: Mapping[str, list[Any]],
    ) -> EscalationRequest:
        k = getattr(stage, "top_k", None)
        cands: dict[str, list[Any]] = {}
        ranked: dict[str, list[tuple[Any, float | None]]] = {}
        previous: dict[str, dict[Any, float]] = {}
        fixed: dict[str, Any] = {}
        last = max(self.schema.field_names.index(n) for n in names)
        for g in self.generated:  # generated text declared before what is asked
            if g in accepted and g not in names and self.schema.field_names.index(g) < last:
                fixed[g] = accepted[g].label
        for n in names:
            spec: FieldSpec = self.schema.field(n)
            if spec.generated:
                cands[n], ranked[n] = [], []
                continue
            for p in self._parents(spec):
                if p in accepted and p not in names:
                    fixed[p] = accepted[p].label
            allowed = self._allowed(spec, {p: accepted[p] for p in fixed})
            dist = prev.get(n)
            if dist is None:  # never scored: declaration order, no probabilities
                cands[n] = allowed
                ranked[n] = [(c, None) for c in cands[n]]
                continue
            previous[n] = dict(dist)
            # a candidate a narrowed stage did not see has probability 0 under it
            scored = [(c, float(dist.get(c, 0.0))) for c in allowed]
            order = sorted(range(len(scored)), key=lambda i: (-scored[i][1], i))
            ranked[n] = [scored[i] for i in order[:k]]
            cands[n] = [c for c, _ in ranked[n]]
        return EscalationRequest(
            text,
            self.schema,
            names,
            cands,
            narrowed_model(self.schema, names, cands, fixed),
            previous,
            ranked,
            fixed,
            {n: list(sets[n]) for n in names if n in sets},
            self.coverage if self.escalate_when is not None else None,
        )

    def _outcome(self, n: str, label: Any, stage: str, prob: float | None) -> FieldOutcome | None:
        """The accepted answer of field `n`, or None when `label` is not one of its values
        (a multi-label field's label is a list of its labels)."""
        spec = self.schema.field(n)
        if spec.generation is not None:  # any value its annotation validates
            try:
                native = value_adapter(spec.generation, spec.optional).validate_python(label)
            except ValidationError:
                return None
            return FieldOutcome(n, native, label, stage, None)
        by_label = {_key(c.label): c for c in spec.choices}
        if spec.kind == "multilabel":
            if not isinstance(label, (list, tuple)) or any(_key(x) not in by_label for x in label):
                return None
            chosen = [by_label[_key(x)] for x in label]
            return FieldOutcome(
                n, [c.value for c in chosen], [c.label for c in chosen], stage, prob
            )
        c = by_label.get(_key(label))
        return None if c is None else FieldOutcome(n, c.value, c.label, stage, prob)

    def _prediction_set(self, n: str, res: Any, sname: str) -> list[Any]:
        """The field's prediction set at the cascade's coverage; the error names the stage."""
        try:
            return list(res.prediction_set(self.coverage))
        except PredictionSetError as exc:
            if hasattr(exc, "add_note"):  # Python >= 3.11
                exc.add_note(
                    f"raised by {self.name} (escalate_when={self.escalate_when!r}) judging "
                    f"field {n!r} of stage {sname!r}"
                )
            raise

    def _not_taken(self, n: str, outcome: Mapping[str, FieldOutcome]) -> bool:
        """Whether `n` belongs to a union branch that the accepted discriminator ruled out."""
        branch = self.schema.field(n).branch
        if branch is None or branch[0] not in outcome:
            return False
        kind, index = branch
        return outcome[kind].label != self.schema.field(kind).choices[index].label

    def _stage_failed(
        self, index: int, stage: Any, sname: str, fields: list[str], exc: Exception
    ) -> None:
        where = f"{self.name} stages[{index}] {sname!r} ({getattr(stage, 'kind', '?')})"
        last = index == len(self.stages) - 1
        then = (
            "re-raising (on_stage_error='raise')"
            if self.on_stage_error == "raise"
            else "no stage left to answer them"
            if last
            else "passing them to the next stage"
        )
        logger.warning(
            "%s failed on %s with %s: %s; %s.", where, fields, type(exc).__name__, exc, then
        )
        if self.on_stage_error == "raise" and hasattr(exc, "add_note"):  # Python >= 3.11
            exc.add_note(f"raised by {where} on fields {fields}")

    def _run(self, input: Any) -> CascadeResult:
        out = self._run_rows([input], batched=False)[0]
        if isinstance(out, Exception):
            raise out
        return out

    def batch(
        self,
        inputs: list[Any],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[CascadeResult]:
        """Runs the cascade on many inputs, each stage once for all of them.

        The rows that escalate go to the next stage together: a `DeciderStage` answers them
        with one `decide_many` per narrowed sub-schema (rows that escalated the same fields
        share one); other stages are asked row by row. A row's `StageRecord.latency_ms` is
        its share of the stage's batched wall time.

        Args:
            inputs: Strings, messages or mappings (see `to_context`).
            config: LangChain config(s).
            return_exceptions: Return a row's exception (e.g. `CascadeError`) in its place
                instead of raising the first one.
        """
        return self._batch_with_config(
            lambda xs: self._run_rows(xs, batched=True),
            inputs,
            config,
            return_exceptions=return_exceptions,
            run_type="chain",
        )

    def _run_rows(self, inputs: list[Any], *, batched: bool) -> list[CascadeResult | Exception]:
        t_start = time.perf_counter()
        rows = [_Row(to_context(x)[0], list(self.schema.field_names)) for x in inputs]
        bubble = _bubble_up()
        for i, (stage, sname) in enumerate(zip(self.stages, self.stage_names)):
            active = [r for r in rows if r.pending]
            if not active:
                break
            reqs = [
                self._request(
                    r.text,
                    r.pending,
                    stage,
                    r.dists,
                    {k: v for k, v in r.outcome.items() if k not in r.pending},
                    r.sets,
                )
                for r in active
            ]
            many = getattr(stage, "answer_many", None) if batched and len(active) > 1 else None
            t0 = time.perf_counter()
            got: list[tuple[Any, Exception | None]] = []
            if many is not None:
                try:
                    got = [(a, None) for a in many(reqs)]
                except bubble:
                    raise
                except Exception as failed:  # every row of the failed call escalates
                    asked = sorted({n for r in active for n in r.pending})
                    self._stage_failed(i, stage, sname, asked, failed)
                    if self.on_stage_error == "raise":
                        raise
                    got = [(None, failed)] * len(active)
                shares = [(time.perf_counter() - t0) * 1e3 / len(active)] * len(active)
            else:
                shares = []
                for r, req in zip(active, reqs):
                    t1 = time.perf_counter()
                    try:
                        got.append((stage.answer(req), None))
                    except bubble:
                        raise
                    except Exception as exc:  # any failure escalates the stage's fields
                        self._stage_failed(i, stage, sname, r.pending, exc)
                        if self.on_stage_error == "raise":
                            raise
                        got.append((None, exc))
                    shares.append((time.perf_counter() - t1) * 1e3)
            for r, req, (ans, err), ms in zip(active, reqs, got, shares):
                self._absorb(r, stage, sname, req, ans, err, ms)
        elapsed = (time.perf_counter() - t_start) * 1e3
        return [self._finish(r, elapsed) for r in rows]

    def _absorb(
        self,
        row: _Row,
        stage: Any,
        sname: str,
        req: EscalationRequest,
        ans: Any,
        failure: Exception | None,
        ms: float,
    ) -> None:
        """Takes one row's answer from a stage: accepts the confident fields and leaves
        the others pending for the next stage."""
        error = f"{type(failure).__name__}: {failure}" if failure is not None else None
        answered: list[str] = []
        still: list[str] = []
        for n in row.pending:
            label = ans.labels.get(n, _MISSING) if ans is not None else _MISSING
            prob = ans.probabilities.get(n) if ans is not None else None
            got = None if label is _MISSING else self._outcome(n, label, sname, prob)
            offered = {_key(c) for c in req.candidates[n]}
            picked = got.label if got is not None and isinstance(got.label, list) else [label]
            if n in self.generated and got is not None:
                answered.append(n)  # final: nothing to judge it by
                row.outcome[n] = got
                continue
            if got is None or any(_key(x) not in offered for x in picked):
                still.append(n)
                continue
            answered.append(n)
            row.outcome[n] = got
            res = ans.results.get(n) if ans is not None else None
            if res is not None:
                row.dists[n] = dict(res.distribution)
                row.sets.pop(n, None)
                if self.escalate_when is not None:
                    row.sets[n] = self._prediction_set(n, res, sname)
                    if len(row.sets[n]) > 1:
                        still.append(n)
                elif not self.confident(n, res):
                    still.append(n)
        # a union branch the accepted discriminator ruled out needs no better answer
        settled = {k: v for k, v in row.outcome.items() if k not in still}
        still = [n for n in still if not (n in row.outcome and self._not_taken(n, settled))]
        if ans is not None and ans.decision is not None and row.first is None and not row.records:
            row.first = ans.decision
        row.records.append(
            StageRecord(
                sname,
                getattr(stage, "kind", type(stage).__name__),
                list(row.pending),
                req.candidates,
                answered,
                still,
                ms,
                error,
                failure,
            )
        )
        row.pending = still

    def _finish(self, row: _Row, elapsed_ms: float) -> CascadeResult | Exception:
        missing = [n for n in self.schema.field_names if n not in row.outcome]
        if missing:
            errs = "; ".join(f"{r.name}: {r.error}" for r in row.records if r.error)
            return CascadeError(
                f"no stage answered {missing} of {self.schema.name}; stage errors: {errs or 'none'}."
            )
        native = {n: row.outcome[n].value for n in self.schema.field_names}
        return CascadeResult(
            value=self.schema.build(native),
            fields={n: row.outcome[n] for n in self.schema.field_names},
            stages=row.records,
            unresolved=row.pending,
            decision=row.first,
            elapsed_ms=elapsed_ms,
        )


_MISSING = object()


def _key(label: Any) -> Any:
    """A hashable key of a label that tells `True` from `1` (JSON does)."""
    return (type(label).__name__, label) if isinstance(label, bool) else label
