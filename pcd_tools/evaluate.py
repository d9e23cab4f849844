"""The eval harness: PCD against grammar-constrained generation on labelled data.

`evaluate(schema, examples)` scores every example with PCD and, on the same model and the
same items, with the grammar-constrained autoregressive baseline
(`pcd_tools.engine.baseline.constrained_json`), and reports per field and per method:
accuracy, macro-F1, ECE (15 bins) with its noise floor (`metrics.ece_floor`: the ECE a
perfectly calibrated predictor with the same confidences would show on as many items),
Brier, NLL, the risk-coverage curve and its AURC, plus latency (median and p95 per item).

How the baseline is scored: it emits one answer per field and the probability its
sampler gave that answer (`value_probs`). That probability is its confidence; for Brier
and NLL its distribution puts `p` on the answer and spreads `1 - p` evenly over the other
candidates. An invalid or unmatched answer counts as wrong with confidence 0, and its
distribution is uniform.

`pcd eval` (the `add_arguments` / `run` pair) wraps it for a dataset.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .datasets import DatasetError, Split, label_index
from .errors import PcdToolsError
from .metrics import FieldMetrics, field_metrics
from .schema import Schema, compile_schema

if TYPE_CHECKING:
    from .decider import Decider
    from .result import Decision

__all__ = ["EvalError", "EvalReport", "MethodReport", "evaluate", "rescore", "run_pcd"]

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


# --- running the methods --------------------------------------------------------------------


@contextlib.contextmanager
def _progress(total: int, label: str, enabled: bool) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr; yields `advance(k)`."""
    if not enabled:
        yield lambda k: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=False,
    ) as bar:
        task = bar.add_task(label, total=total)
        yield lambda k: bar.advance(task, k)


def run_pcd(
    decider: Decider,
    schema: Any,
    texts: Sequence[str],
    *,
    batch_size: int = 8,
    temperature: float = 1.0,
    progress: bool = False,
    label: str = "PCD",
) -> tuple[list[Decision[Any]], list[float]]:
    """Decides every text in batches.

    Returns:
        The decisions, and per item the wall time of its batch divided by the batch size
        (with `batch_size=1`, the item's own latency).
    """
    out: list[Decision[Any]] = []
    ms: list[float] = []
    with _progress(len(texts), label, progress) as advance:
        for start in range(0, len(texts), batch_size):
            chunk = list(texts[start : start + batch_size])
            t0 = time.perf_counter()
            out.extend(
                decider.decide_many(schema, chunk, temperature=temperature, batch_size=batch_size)
            )
            each = (time.perf_counter() - t0) * 1e3 / len(chunk)
            ms.extend([each] * len(chunk))
            advance(len(chunk))
    return out, ms


def _default_baseline() -> Baseline:
    try:
        from .engine.baseline import constrained_json
    except ImportError as e:  # pragma: no cover - the module ships with the package
        raise EvalError(
            f"the constrained-generation baseline is unavailable ({e}); pass baseline=False "
            "(--no-baseline) to evaluate PCD alone."
        ) from e
    return lambda decider, schema, text: constrained_json(decider, schema, text)


# --- reports --------------------------------------------------------------------------------


def _latency(ms: Sequence[float]) -> dict[str, float]:
    a = np.asarray(ms, dtype=np.float64)
    if not a.size:
        return {"median_ms": math.nan, "p95_ms": math.nan, "mean_ms": math.nan, "total_s": 0.0}
    return {
        "median_ms": float(np.median(a)),
        "p95_ms": float(np.percentile(a, 95)),
        "mean_ms": float(a.mean()),
        "total_s": float(a.sum() / 1e3),
    }


@dataclass
class MethodReport:
    """One method's results on the sample.

    Args:
        method: `"pcd"`, `"pcd_calibrated"` or `"baseline"`.
        fields: Per-field metrics.
        latency: `median_ms`, `p95_ms`, `mean_ms` per item and `total_s`.
        latency_kind: `"per item"` or `"amortized over batches of B"`.
        passes: Mean sequential forward passes per call.
        invalid: Items whose output was not valid, schema-matching JSON (baseline).
        tokens: Mean generated tokens per item (baseline).
    """

    method: str
    fields: dict[str, FieldMetrics]
    latency: dict[str, float]
    latency_kind: str = "per item"
    passes: float = math.nan
    invalid: int = 0
    tokens: float = math.nan
    _arrays: dict[str, dict[str, np.ndarray]] = field(default_factory=dict, repr=False)

    def confidence_correct(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """`(confidence, correct)` arrays of one field, for diagrams and thresholds."""
        a = self._arrays[name]
        return a["confidence"], a["pred"] == a["gold"]

    def to_dict(self, *, curves: bool = False) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return {
            "method": self.method,
            "fields": {n: m.to_dict(curve=curves) for n, m in self.fields.items()},
            "latency": self.latency,
            "latency_kind": self.latency_kind,
            "passes": self.passes,
            "invalid": self.invalid,
            "tokens": self.tokens,
        }


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

    def to_dict(self, *, items: bool = False, curves: bool = False) -> dict[str, Any]:
        """A JSON-serialisable dict; `items`/`curves` add per-item rows and risk curves."""
        d = {
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
        }
        if items:
            d["items"] = self.items
        out: dict[str, Any] = _finite(d)
        return out


# --- the evaluation -------------------------------------------------------------------------


def _pcd_method(
    name: str,
    schema: Schema,
    log_scores: Sequence[Mapping[str, Sequence[float]]],
    labels: Sequence[Mapping[str, Any]],
    probs_of: Callable[[str, np.ndarray], np.ndarray],
    ms: Sequence[float],
    batch_size: int,
    passes: float,
) -> MethodReport:
    """Metrics of PCD from raw log scores (per item, per field) under `probs_of`."""
    fields, arrays = {}, {}
    for spec in schema.fields:
        rows = [(z, lab) for z, lab in zip(log_scores, labels) if spec.name in lab]
        if not rows:
            continue
        z = np.array([zz[spec.name] for zz, _ in rows], dtype=np.float64)
        gold = np.array([label_index(spec, lab[spec.name]) for _, lab in rows])
        probs = probs_of(spec.name, z)
        fields[spec.name] = field_metrics(probs, gold)
        arrays[spec.name] = {
            "confidence": probs.max(axis=1),
            "pred": probs.argmax(axis=1),
            "gold": gold,
        }
    kind = "per item" if batch_size == 1 else f"amortized over batches of {batch_size}"
    return MethodReport(name, fields, _latency(ms), kind, passes, _arrays=arrays)


def _pcd_methods(
    schema: Schema,
    log_scores: Sequence[Mapping[str, Sequence[float]]],
    labels: Sequence[Mapping[str, Any]],
    calibration: Any,
    temperature: float,
    ms: Sequence[float],
    batch_size: int,
    passes: float,
) -> dict[str, MethodReport]:
    """`pcd` (raw, at `temperature`) and, with a calibration, `pcd_calibrated`."""
    from .result import softmax_scores

    def raw(_: str, z: np.ndarray) -> np.ndarray:
        return np.stack([softmax_scores(row, temperature) for row in z])

    out = {"pcd": _pcd_method("pcd", schema, log_scores, labels, raw, ms, batch_size, passes)}
    if calibration is not None:

        def calibrated(name: str, z: np.ndarray) -> np.ndarray:
            out: np.ndarray = calibration.probabilities(name, z, temperature)
            return out

        out["pcd_calibrated"] = _pcd_method(
            "pcd_calibrated", schema, log_scores, labels, calibrated, ms, batch_size, passes
        )
    return out


def _baseline_row(spec: Any, res: Any) -> tuple[np.ndarray, int, float]:
    """(distribution, answer index or -1, confidence) of one baseline answer."""
    k = spec.cardinality
    ok = bool(getattr(res, "is_valid_json", False)) and bool(getattr(res, "schema_match", False))
    values = getattr(res, "values", None) if ok else None
    if not values or spec.name not in values:
        return np.full(k, 1.0 / k), -1, 0.0
    try:
        idx = label_index(spec, values[spec.name])
    except DatasetError:
        return np.full(k, 1.0 / k), -1, 0.0
    vp = getattr(res, "value_probs", None) or {}
    p = float(vp.get(spec.name, 1.0))
    row = np.full(k, (1.0 - p) / (k - 1))
    row[idx] = p
    return row, idx, p


def _baseline_method(
    schema: Schema, results: Sequence[Any], labels: Sequence[Mapping[str, Any]], ms: Sequence[float]
) -> MethodReport:
    fields, arrays = {}, {}
    for spec in schema.fields:
        rows = [(r, lab) for r, lab in zip(results, labels) if spec.name in lab]
        if not rows:
            continue
        parts = [_baseline_row(spec, r) for r, _ in rows]
        probs = np.array([p[0] for p in parts])
        pred = np.array([p[1] for p in parts])
        conf = np.array([p[2] for p in parts])
        gold = np.array([label_index(spec, lab[spec.name]) for _, lab in rows])
        fields[spec.name] = field_metrics(probs, gold, confidence=conf, pred=pred)
        arrays[spec.name] = {"confidence": conf, "pred": pred, "gold": gold}
    invalid = sum(
        not (getattr(r, "is_valid_json", False) and getattr(r, "schema_match", False))
        for r in results
    )
    passes = [getattr(r, "passes", math.nan) for r in results]
    tokens = [getattr(r, "tokens", math.nan) for r in results]
    return MethodReport(
        "baseline",
        fields,
        _latency(ms),
        "per item",
        float(np.mean(passes)) if passes else math.nan,
        invalid,
        float(np.mean(tokens)) if tokens else math.nan,
        _arrays=arrays,
    )


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

    Raises:
        DatasetError: if a label is not one of its field's choices.
    """
    from .decider import default_decider

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
    decisions, pcd_ms = run_pcd(
        d, compiled, texts, batch_size=batch_size, temperature=temperature, progress=progress
    )
    cal = getattr(d, "calibration", None)
    methods = _pcd_methods(
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
        with _progress(len(texts), "constrained baseline", progress) as advance:
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
        methods["baseline"] = _baseline_method(compiled, results, labels, base_ms)
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
    )
    if cal is not None and cal.thresholds:
        _check_thresholds(report, cal.thresholds)
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

    from .calibration import Calibration

    compiled = compile_schema(schema)
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
        cal.check_schema(compiled)
    stored = report.get("methods", {})
    labels = [it["gold"] for it in items]
    pcd = stored.get("pcd", {})
    methods = _pcd_methods(
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
        b = _baseline_method(compiled, results, labels, [])
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
    )
    if cal is not None and cal.thresholds:
        _check_thresholds(out, cal.thresholds)
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


# --- `pcd eval` -----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `pcd eval` (`--model`, `--json` and `--calibration` come from the CLI)."""
    from .calibration import DESIGNS
    from .datasets import add_data_arguments

    add_data_arguments(parser)
    parser.add_argument("--n", type=int, default=300, help="stratified sample size (default 300)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    parser.add_argument("--batch-size", type=int, default=8, help="PCD contexts per pass")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--no-baseline", action="store_true", help="skip constrained generation")
    parser.add_argument(
        "--order-bias",
        type=int,
        default=None,
        metavar="K",
        help="measure the order-flip rate (K >= 2 also averages over K orders)",
    )
    parser.add_argument(
        "--order-bias-n", type=int, default=100, help="items for the order-bias measurement"
    )
    parser.add_argument(
        "--order-design",
        choices=DESIGNS,
        default=DESIGNS[0],
        help="how the K orders are built: evenly spaced rotations (default) or random",
    )
    parser.add_argument("--diagrams", default=None, help="folder for reliability-diagram PNGs")
    parser.add_argument("--out", default=None, help="write the full report (with items) as JSON")
    parser.add_argument(
        "--from-report",
        default=None,
        metavar="REPORT",
        help="recompute a saved report (--out) under --calibration, without the model",
    )


def _check_disjoint(decider: Any, dataset: str, ids: Sequence[str]) -> None:
    cal = getattr(decider, "calibration", None)
    fitted = getattr(cal, "fitted_on", None) or {}
    if fitted.get("dataset") != dataset:
        return
    overlap = set(fitted.get("ids") or ()) & set(ids)
    if overlap:
        raise EvalError(
            f"calibration {getattr(cal, 'path', None)!r} was fitted on {len(overlap)} of the items being "
            f"evaluated (e.g. {sorted(overlap)[:3]}); fit it on a disjoint split "
            "(pcd calibrate --eval-n/--eval-seed matching this run)."
        )


def _print_report(console: Any, report: EvalReport) -> None:
    from rich.table import Table

    table = Table(
        title=f"{report.dataset}: n={report.n}, seed={report.seed}, model={report.model_id}"
    )
    cols = (
        "field",
        "method",
        "acc",
        "macro-F1",
        "ECE",
        "ECE floor",
        "Brier",
        "NLL",
        "AURC",
        "conf",
    )
    for col in cols:
        table.add_column(col, justify="right" if col not in ("field", "method") else "left")
    for name in next(iter(report.methods.values())).fields:
        for mname, m in report.methods.items():
            f = m.fields.get(name)
            if f is None:
                continue
            table.add_row(
                name,
                mname,
                f"{f.accuracy:.3f}",
                f"{f.macro_f1:.3f}",
                f"{f.ece:.3f}",
                f"{f.ece_floor:.3f}",
                f"{f.brier:.3f}",
                f"{f.nll:.3f}",
                f"{f.aurc:.3f}",
                f"{f.mean_confidence:.3f}",
            )
    console.print(table)
    for mname, m in report.methods.items():
        lat = m.latency
        console.print(
            f"{mname}: median {lat['median_ms']:.0f} ms, p95 {lat['p95_ms']:.0f} ms per item "
            f"({m.latency_kind}); passes {m.passes:.1f}; invalid {m.invalid}"
        )
    if report.thresholds:
        console.print(f"thresholds on this sample: {json.dumps(report.thresholds)}")
    if report.order_bias:
        console.print(f"order bias: {json.dumps(report.order_bias)}")
    console.print(f"elapsed {report.elapsed_s:.1f} s")


def run(args: argparse.Namespace) -> int:
    """Runs `pcd eval`."""
    from rich.console import Console

    from .calibration import order_bias
    from .datasets import dataset_from_args
    from .decider import Decider

    t0 = time.perf_counter()
    err = Console(stderr=True)
    ds = dataset_from_args(args)
    if args.from_report:
        from types import SimpleNamespace

        from .calibration import Calibration, read_json

        saved = read_json(args.from_report, "report", EvalError)

        cal = Calibration.load(args.calibration) if args.calibration else None
        ids = [it.get("id") for it in saved.get("items") or []]
        _check_disjoint(SimpleNamespace(calibration=cal), ds.name, ids)
        report = rescore(saved, ds.schema, cal, temperature=args.temperature)
        return _finish(args, ds, report, t0=None)
    split = ds.eval_sample(args.n, args.seed)
    with err.status("Loading model..."):
        decider = Decider.load(args.model, calibration=args.calibration)
    _check_disjoint(decider, ds.name, split.ids)
    report = evaluate(
        ds.schema,
        split,
        decider=decider,
        baseline=not args.no_baseline,
        batch_size=args.batch_size,
        temperature=args.temperature,
        progress=True,
        name=ds.name,
    )
    report.seed = args.seed
    if args.order_bias is not None:
        texts = [t for t, _ in split.examples[: args.order_bias_n]]
        with err.status(f"Measuring order bias on {len(texts)} items..."):
            report.order_bias = order_bias(
                ds.schema,
                texts,
                decider=decider,
                k=args.order_bias,
                seed=args.seed,
                temperature=args.temperature,
                batch_size=args.batch_size,
                design=args.order_design,
            ).to_dict()
    return _finish(args, ds, report, t0)


def _finish(args: argparse.Namespace, ds: Any, report: EvalReport, t0: float | None) -> int:
    """Diagrams, the `--out` file and the printed report of `pcd eval`."""
    from rich.console import Console

    from .calibration import reliability_diagram

    if args.diagrams:
        for name in compile_schema(ds.schema).field_names:
            panels: dict[str, tuple[Any, Any]] = {
                m: report.methods[m].confidence_correct(name)
                for m in ("pcd", "pcd_calibrated", "baseline")
                if m in report.methods and name in report.methods[m].fields
            }
            if panels:
                reliability_diagram(
                    panels,
                    Path(args.diagrams) / f"{ds.name}_{name}.png",
                    title=f"{ds.name}.{name}: evaluation sample n={report.n}, seed {report.seed}",
                )
    if t0 is not None:
        report.elapsed_s = time.perf_counter() - t0
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps(report.to_dict(items=True, curves=True), indent=1, default=str) + "\n"
        )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        _print_report(Console(width=150), report)
    return 0
