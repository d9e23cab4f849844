"""The eval harness: PCD against grammar-constrained generation on labelled data.

`evaluate(schema, examples)` scores every example with PCD and, on the same model and the
same items, with the grammar-constrained autoregressive baseline
(`pcd_tools.baselines.generation.constrained_json`), and reports per field and per method:
accuracy, macro-F1, ECE (15 bins) with its noise floor (`metrics.ece_floor`: the ECE a
perfectly calibrated predictor with the same confidences would show on as many items),
Brier, NLL, the risk-coverage curve and its AURC, plus latency (median and p95 per item).
How each method's answers become metrics is in `pcd_tools.eval.scoring`.

With `shots=` (`pcd eval --shots K`, `pcd_tools.eval.shots.draw_shots`) both methods see
the same few-shot examples: PCD as `decide_many(..., examples=)`, the baseline in the same
prompt. `calibration="contextual"` and `scoring="pmi"` run PCD with a label-free
correction.

`rescore` recomputes a saved report under another calibration, without the model.
`pcd eval` (`pcd_tools.cli.eval`) wraps both for a dataset, and
`pcd_tools.eval.report` prints the report.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..answers.calibration import Calibration
from ..errors import PcdToolsError
from ..schema import Schema, compile_schema, with_examples
from .conformal import set_coverage
from .datasets import Split, label_index
from .runner import progress_bar, run_pcd
from .scoring import MethodReport, baseline_method, pcd_methods
from .shots import Shots

if TYPE_CHECKING:
    from ..decide.checks import LabelFree, Scoring
    from ..decide.decider import Decider

__all__ = ["EvalError", "EvalReport", "MethodReport", "evaluate", "rescore"]

Baseline = Callable[[Any, Schema, str], Any]


class EvalError(PcdToolsError, ValueError):
    """An evaluation cannot run as asked."""


def _finite(x: Any) -> Any:
    """NaN and infinities as `None`, recursively, so the output is strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _default_baseline() -> Baseline:
    try:
        from ..baselines.generation import constrained_json
    except ImportError as e:  # pragma: no cover - the module ships with the package
        raise EvalError(
            f"the constrained-generation baseline is unavailable ({e}); pass baseline=False "
            "(--no-baseline) to evaluate PCD alone."
        ) from e
    return lambda decider, schema, text: constrained_json(decider, schema, text)


@dataclass
class EvalReport:
    """Accuracy, calibration and latency of PCD and the baseline on one sample.

    Args:
        dataset: Dataset name.
        schema: Schema name.
        fingerprint: The schema's fingerprint.
        model_id: The model both methods ran on.
        n: Items evaluated.
        seed: Seed of the stratified sample (None when no sampling was done).
        methods: Method name -> `MethodReport`.
        batch_size: PCD batch size.
        calibration_file: Calibration applied to `pcd_calibrated`, if any.
        thresholds: Per field, the calibration's thresholds and the coverage and risk they
            reach on this sample.
        order_bias: An `OrderBiasReport` as a dict, if measured.
        items: Per item: id, text, gold labels and each method's answer and confidence.
        elapsed_s: Wall time of the evaluation.
        shots: The few-shot examples both methods saw (`Shots.to_dict`: k, seed, the
            field stratified on, ids and the examples), or None for zero-shot.
        label_free: The label-free correction of PCD's scores: `none`, `contextual` or
            `pmi`.
        pruning: PCD's pruning: `off` (every candidate scored), `auto` or `on`.
        prediction_sets: When the calibration has conformal scores: per field and coverage
            target (0.8, 0.9, 0.95), the held-out coverage of the prediction sets on this
            sample, their mean size and singleton rate (`pcd_tools.eval.conformal`).
        compute: The matrix arithmetic of PCD's scores (`Decision.compute`); None in a
            report written before it was recorded.
    """

    dataset: str
    schema: str
    fingerprint: str
    model_id: str
    n: int
    seed: int | None
    methods: dict[str, MethodReport]
    batch_size: int = 8
    calibration_file: str | None = None
    thresholds: dict[str, dict[str, Any]] = field(default_factory=dict)
    order_bias: dict[str, Any] | None = None
    items: list[dict[str, Any]] = field(default_factory=list, repr=False)
    elapsed_s: float = 0.0
    shots: dict[str, Any] | None = None
    label_free: str = "none"
    pruning: str = "off"
    prediction_sets: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    compute: str | None = None

    def to_dict(self, *, items: bool = False, curves: bool = False) -> dict[str, Any]:
        """A JSON-serialisable dict; `items`/`curves` add per-item rows and risk curves."""
        d: dict[str, Any] = {
            "dataset": self.dataset,
            "schema": self.schema,
            "fingerprint": self.fingerprint,
            "model_id": self.model_id,
            "n": self.n,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "calibration_file": self.calibration_file,
            "methods": {k: m.to_dict(curves=curves) for k, m in self.methods.items()},
            "thresholds": self.thresholds,
            "order_bias": self.order_bias,
            "elapsed_s": self.elapsed_s,
            "shots": self.shots,
            "label_free": self.label_free,
            "pruning": self.pruning,
            "compute": self.compute,
            **({"prediction_sets": self.prediction_sets} if self.prediction_sets else {}),
        }
        if items:
            d["items"] = self.items
        out: dict[str, Any] = _finite(d)
        return out


# --- the evaluation -------------------------------------------------------------------------


def _as_split(schema: Schema, examples: Any) -> Split:
    if isinstance(examples, Split):
        return examples
    items = [(t, dict(lab)) for t, lab in examples]
    first = schema.fields[0].name
    strata = [json.dumps(lab.get(first), sort_keys=True) for _, lab in items]
    return Split("examples", items, [f"item:{i}" for i in range(len(items))], strata)


def evaluate(
    schema: Any,
    examples: Iterable[tuple[str, Mapping[str, Any]]] | Split,
    *,
    decider: Decider | None = None,
    baseline: bool | Baseline = True,
    n: int | None = None,
    seed: int = 0,
    batch_size: int = 8,
    temperature: float = 1.0,
    progress: bool = False,
    name: str | None = None,
    shots: Shots | None = None,
    calibration: LabelFree | None = None,
    scoring: Scoring = "full",
    pruning: str = "off",
) -> EvalReport:
    """Evaluates PCD (and the constrained-generation baseline) on labelled examples.

    Args:
        schema: The decision schema.
        examples: `(text, {field: label})` pairs with JSON labels, or a `Split`.
        decider: The decider (default: the embedded model). If it carries a calibration,
            the report has both `pcd` (raw) and `pcd_calibrated`.
        baseline: Run the grammar-constrained baseline (`True`), skip it (`False`), or a
            callable `(decider, schema, text) -> GenerationResult`.
        n: Size of a fixed-seed stratified sample (stratified on the first field's label,
            or on the split's strata); `None` evaluates everything.
        seed: Seed of that sample.
        batch_size: PCD contexts per pass.
        temperature: PCD softmax temperature.
        progress: Show progress bars on stderr.
        name: Dataset name for the report.
        shots: Few-shot examples (`pcd_tools.eval.shots.draw_shots`) for both methods;
            they must not be items of the evaluated sample.
        calibration: PCD's label-free calibration (`"contextual"`, `"none"`), or None for
            the decider's.
        scoring: PCD's scoring: `"full"`, `"constrained"` or `"pmi"`.
        pruning: PCD's pruning (`Decider.decide`); `"off"` by default, so that every
            candidate's score is in the report. With `"auto"` or `"on"`, a pruned field's
            unscored candidates count as probability 0.

    Raises:
        DatasetError: if a label is not one of its field's choices.
        EvalError: if a few-shot example is an item of the evaluated sample.
    """
    from ..decide.decider import default_decider
    from ..decide.methods import label_free_of

    t_start = time.perf_counter()
    compiled = compile_schema(schema)
    d = decider or default_decider()
    split = _as_split(compiled, examples)
    if n is not None:
        split = split.sample(n, seed)
    if not len(split):
        raise EvalError("evaluate needs at least one labelled example.")
    texts = [t for t, _ in split.examples]
    labels = [lab for _, lab in split.examples]
    for lab in labels:  # fail before any model time is spent
        for k, v in lab.items():
            label_index(compiled.field(k), v)
    shown = None
    if shots is not None and shots.k:
        seen = set(shots.ids) & set(split.ids)
        if seen:
            raise EvalError(
                f"{len(seen)} few-shot example(s) are items of the evaluated sample (e.g. "
                f"{sorted(seen)[:3]}); draw them from the calibration split "
                "(pcd_tools.eval.shots.draw_shots with the sample's ids)."
            )
        shown = shots.examples
        compiled = with_examples(compiled, shown, "the drawn shots")
    decisions, pcd_ms = run_pcd(
        d,
        compiled,
        texts,
        batch_size=batch_size,
        temperature=temperature,
        progress=progress,
        examples=shown,
        calibration=calibration,
        scoring=scoring,
        pruning=pruning,
    )
    cal = getattr(d, "calibration", None)
    methods = pcd_methods(
        compiled,
        [{n: f.log_scores for n, f in x.fields.items()} for x in decisions],
        labels,
        cal,
        temperature,
        pcd_ms,
        batch_size,
        float(np.mean([x.sequential_forward_passes for x in decisions])),
    )
    results: list[Any] = []
    if baseline:
        fn = _default_baseline() if baseline is True else baseline
        base_ms = []
        with progress_bar(len(texts), "constrained baseline", progress) as advance:
            for text in texts:
                t0 = time.perf_counter()
                try:
                    res = fn(d, compiled, text)
                except PcdToolsError as e:  # e.g. a context too long: a failed answer
                    res = {"error": f"{type(e).__name__}: {e}"}
                wall = getattr(res, "wall_ms", None)
                base_ms.append(
                    float(wall) if wall is not None else (time.perf_counter() - t0) * 1e3
                )
                results.append(res)
                advance(1)
        methods["baseline"] = baseline_method(compiled, results, labels, base_ms)
    report = EvalReport(
        dataset=name or compiled.name,
        schema=compiled.name,
        fingerprint=compiled.fingerprint(),
        model_id=d.model_id,
        n=len(split),
        seed=seed if n is not None else None,
        methods=methods,
        batch_size=batch_size,
        calibration_file=getattr(cal, "path", None) if cal is not None else None,
        shots=shots.to_dict() if shots is not None and shots.k else None,
        label_free=label_free_of(decisions[0].calibration_method, decisions[0].scoring),
        pruning=pruning,
        compute=decisions[0].compute,
    )
    if cal is not None and cal.thresholds:
        _check_thresholds(report, cal.thresholds)
    if cal is not None and cal.conformal:
        report.prediction_sets = set_coverage(
            compiled,
            cal,
            [{n: f.log_scores for n, f in x.fields.items()} for x in decisions],
            labels,
        )
    report.items = _items(compiled, split, decisions, results)
    report.elapsed_s = time.perf_counter() - t_start
    return report


def rescore(
    report: Mapping[str, Any],
    schema: Any,
    calibration: Any = None,
    *,
    temperature: float = 1.0,
) -> EvalReport:
    """Recomputes a saved report's metrics under another calibration, without the model.

    PCD's raw log scores are stored per item (`EvalReport.to_dict(items=True)`, `pcd eval
    --out`), so any calibration fitted for the same model and schema can be applied to them
    afterwards. The baseline's metrics are rebuilt from its stored answers; latencies and
    the order-bias measurement are carried over from the report.

    Args:
        report: A report dict with items, as `pcd eval --out` writes it.
        schema: The schema the report was made with (its fingerprint must match).
        calibration: A `Calibration` (or its path) for `pcd_calibrated`; `None` drops it.
        temperature: PCD softmax temperature.

    Raises:
        EvalError: if the report has no items or was made with another schema or model.
    """
    from types import SimpleNamespace

    compiled = compile_schema(schema)
    shots = report.get("shots") or None
    if shots and shots.get("examples"):
        compiled = with_examples(compiled, shots["examples"], "the report's shots")
    items = report.get("items") or []
    if not items or "pcd_log_scores" not in items[0]:
        raise EvalError("rescore needs a report with items (write it with `pcd eval --out`).")
    if report.get("fingerprint") != compiled.fingerprint():
        raise EvalError(
            f"the report was made with schema fingerprint {report.get('fingerprint')}, not "
            f"{compiled.fingerprint()} ({compiled.name}); evaluate this schema again."
        )
    cal = Calibration.load(calibration) if isinstance(calibration, (str, Path)) else calibration
    if cal is not None:
        cal.check_model(report["model_id"])
        if report.get("compute") is not None:
            cal.check_compute(str(report["compute"]))
        cal.check_schema(compiled)
    stored = report.get("methods", {})
    labels = [it["gold"] for it in items]
    pcd = stored.get("pcd", {})
    methods = pcd_methods(
        compiled,
        [it["pcd_log_scores"] for it in items],
        labels,
        cal,
        temperature,
        [],
        int(report.get("batch_size", 8)),
        float(pcd.get("passes", math.nan)),
    )
    for m in methods.values():
        m.latency = dict(pcd.get("latency") or m.latency)
        m.latency_kind = str(pcd.get("latency_kind", m.latency_kind))
    if "baseline" in stored and all("baseline" in it for it in items):
        results = [
            SimpleNamespace(
                is_valid_json="baseline_text" not in it,
                schema_match="baseline_text" not in it,
                values={n: v for n, (v, _) in it["baseline"].items() if v is not None},
                value_probs={n: p for n, (v, p) in it["baseline"].items() if v is not None},
            )
            for it in items
        ]
        b = baseline_method(compiled, results, labels, [])
        sb = stored["baseline"]
        b.latency, b.latency_kind = dict(sb.get("latency") or {}), sb.get("latency_kind", "")
        b.passes, b.invalid = sb.get("passes", math.nan), sb.get("invalid", b.invalid)
        b.tokens = sb.get("tokens", math.nan)
        methods["baseline"] = b
    out = EvalReport(
        dataset=str(report.get("dataset", compiled.name)),
        schema=compiled.name,
        fingerprint=compiled.fingerprint(),
        model_id=str(report["model_id"]),
        n=len(items),
        seed=report.get("seed"),
        methods=methods,
        batch_size=int(report.get("batch_size", 8)),
        calibration_file=getattr(cal, "path", None) if cal is not None else None,
        order_bias=report.get("order_bias"),
        items=list(items),
        elapsed_s=float(report.get("elapsed_s", 0.0)),
        shots=shots,
        label_free=str(report.get("label_free", "none")),
        compute=report.get("compute"),
    )
    if cal is not None and cal.thresholds:
        _check_thresholds(out, cal.thresholds)
    if cal is not None and cal.conformal:
        out.prediction_sets = set_coverage(
            compiled, cal, [it["pcd_log_scores"] for it in items], labels
        )
    return out


def _check_thresholds(report: EvalReport, thresholds: Mapping[str, Mapping[str, Any]]) -> None:
    """Coverage and risk that the calibration's thresholds reach on this sample."""
    m = report.methods["pcd_calibrated"]
    for name, th in thresholds.items():
        if name not in m.fields:
            continue
        conf, ok = m.confidence_correct(name)
        accept = conf >= float(th["threshold"])
        report.thresholds[name] = {
            **dict(th),
            "eval_coverage": float(accept.mean()),
            "eval_risk": float(1.0 - ok[accept].mean()) if accept.any() else 0.0,
        }


def _items(
    schema: Schema, split: Split, decisions: Sequence[Any], results: Sequence[Any]
) -> list[dict[str, Any]]:
    out = []
    for i, ((text, lab), item_id) in enumerate(zip(split.examples, split.ids)):
        row: dict[str, Any] = {"id": item_id, "text": text, "gold": lab}
        fields = decisions[i].fields
        row["pcd"] = {n: [f.label, round(f.probability, 4)] for n, f in fields.items()}
        row["pcd_log_scores"] = {n: [round(z, 4) for z in f.log_scores] for n, f in fields.items()}
        row["pcd_prompt_tokens"] = int(decisions[i].prompt_tokens)
        row["pcd_ms"] = round(float(getattr(decisions[i], "elapsed_ms", math.nan)), 2)
        if results:
            r = results[i]
            vals = getattr(r, "values", None) or {}
            probs = getattr(r, "value_probs", None) or {}
            row["baseline"] = {
                n: [vals.get(n), round(float(probs.get(n, math.nan)), 4)]
                for n in schema.field_names
            }
            if not getattr(r, "is_valid_json", False):
                row["baseline_text"] = getattr(r, "text", None) or str(r)
        out.append(row)
    return out
