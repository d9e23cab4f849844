"""Both models' per-item results paired as arrays, gate signals, and the metrics of a
threshold policy (`pcd_tools.eval.cascade` has the overview)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..answers.softmax import softmax
from ..errors import InvalidArgumentError, PcdToolsError
from ..schema import Schema, compile_schema
from .datasets import label_index
from .metrics import auroc, ece, macro_f1

__all__ = [
    "SIGNALS",
    "CascadeEvalError",
    "CrossFitted",
    "ModelRun",
    "common_ids",
    "confidence",
    "curve_area",
    "evaluate_policy",
    "gated_fields",
    "pair_runs",
    "separation",
    "sweep",
    "to_threshold",
    "uniform",
]

Signal = Literal["probability", "margin", "entropy"]
SIGNALS: tuple[str, ...] = ("probability", "margin", "entropy")


class CascadeEvalError(PcdToolsError, ValueError):
    """Results that cannot be paired into a cascade (other schema, no common items, ...)."""


# --- one model's results ----------------------------------------------------------------------


@dataclass(frozen=True)
class ModelRun:
    """One model's per-item results on labelled items.

    Args:
        model_id: The model.
        fingerprint: The schema fingerprint the scores were made with.
        ids: Item ids.
        gold: Per item, field -> gold JSON label.
        log_scores: Per item, field -> raw candidate log scores (declared order).
        prompt_tokens: Per item, the tokens of its prompt (the prefill).
        ms: Per item, its wall time (its share of the batch that scored it).
        label_free: The label-free correction in the log scores (`none`, `contextual`).
        compute: The matrix arithmetic the scores were computed with (`Decision.compute`);
            None when the source does not say.
    """

    model_id: str
    fingerprint: str
    ids: list[str]
    gold: list[dict[str, Any]]
    log_scores: list[dict[str, list[float]]]
    prompt_tokens: np.ndarray
    ms: np.ndarray
    label_free: str = "none"
    compute: str | None = None

    @classmethod
    def from_report(cls, report: Mapping[str, Any], *, where: str = "report") -> ModelRun:
        """From a `pcd eval --out` report (`EvalReport.to_dict(items=True)`).

        Raises:
            CascadeEvalError: for a report without per-item log scores.
        """
        items = report.get("items") or []
        if not items or "pcd_log_scores" not in items[0]:
            raise CascadeEvalError(
                f"{where} has no per-item PCD log scores; write it with `pcd eval --out FILE`."
            )
        nan = float("nan")
        return cls(
            model_id=str(report.get("model_id")),
            fingerprint=str(report.get("fingerprint")),
            ids=[str(it["id"]) for it in items],
            gold=[dict(it["gold"]) for it in items],
            log_scores=[dict(it["pcd_log_scores"]) for it in items],
            prompt_tokens=np.array([it.get("pcd_prompt_tokens", nan) for it in items], float),
            ms=np.array([it.get("pcd_ms", nan) for it in items], float),
            label_free=str(report.get("label_free") or "none"),
            compute=report.get("compute"),
        )

    @classmethod
    def from_decisions(
        cls,
        schema: Any,
        decisions: Sequence[Any],
        labels: Sequence[Mapping[str, Any]],
        ids: Sequence[str] | None = None,
    ) -> ModelRun:
        """From `Decider.decide_many` decisions and the items' gold labels."""
        if len(decisions) != len(labels):
            raise CascadeEvalError(
                f"got {len(decisions)} decisions for {len(labels)} labelled items."
            )
        compiled = compile_schema(schema)
        first = decisions[0] if decisions else None
        return cls(
            model_id=str(getattr(first, "model_id", "?")),
            fingerprint=compiled.fingerprint(),
            ids=list(ids) if ids is not None else [f"item:{i}" for i in range(len(labels))],
            gold=[dict(g) for g in labels],
            log_scores=[{n: list(f.log_scores) for n, f in d.fields.items()} for d in decisions],
            prompt_tokens=np.array([d.prompt_tokens for d in decisions], float),
            ms=np.array([d.elapsed_ms for d in decisions], float),
            label_free=str(getattr(first, "calibration_method", "none") or "none"),
            compute=getattr(first, "compute", None),
        )

    def subset(self, ids: Sequence[str]) -> ModelRun:
        """The items `ids`, in that order."""
        at = {i: k for k, i in enumerate(self.ids)}
        idx = [at[i] for i in ids]
        return ModelRun(
            self.model_id,
            self.fingerprint,
            list(ids),
            [self.gold[k] for k in idx],
            [self.log_scores[k] for k in idx],
            self.prompt_tokens[idx],
            self.ms[idx],
            self.label_free,
            self.compute,
        )


# --- the arrays a policy is measured on -------------------------------------------------------


@dataclass(frozen=True)
class Pair:
    """Both models' distributions per field on the same items, and the items' costs."""

    fields: list[str]
    small: dict[str, np.ndarray]  # field -> (n, K) probabilities of the kept answers
    large: dict[str, np.ndarray]
    gold: dict[str, np.ndarray]  # field -> (n,) index, -1 where the item has no label
    small_ms: np.ndarray
    large_ms: np.ndarray
    large_tokens: np.ndarray

    @property
    def n(self) -> int:
        return len(self.small_ms)

    def final(self, field: str, escalated: np.ndarray) -> np.ndarray:
        """Field `field`'s kept distribution per item: the large model's where
        `escalated`, the small model's elsewhere."""
        return np.where(escalated[:, None], self.large[field], self.small[field])


def common_ids(*runs: ModelRun) -> list[str]:
    """The ids every run has, in the first run's order."""
    shared = set(runs[0].ids).intersection(*(r.ids for r in runs[1:]))
    return [i for i in runs[0].ids if i in shared]


def gated_fields(schema: Schema) -> list[str]:
    """The fields a threshold cascade judges: scored single-choice fields."""
    return [
        f.name
        for f in schema.fields
        if not f.generated and f.kind != "multilabel" and f.choices_by is None
    ]


@dataclass(frozen=True)
class CrossFitted:
    """Out-of-fold calibration (`crossfit.cross_fit`): each item's probabilities come
    from a calibration fitted on the other folds, never on the item itself.

    Args:
        by_id: Item id -> the calibration fitted without that item's fold.
        folds: The number of folds.
    """

    by_id: Mapping[str, Any]
    folds: int

    def for_item(self, item_id: str) -> Any:
        """The calibration fitted without `item_id`.

        Raises:
            CascadeEvalError: for an item that was not among the cross-fitted items.
        """
        try:
            return self.by_id[item_id]
        except KeyError:
            raise CascadeEvalError(
                f"item {item_id!r} was not among the {len(self.by_id)} cross-fitted items; "
                "cross-fit the calibration on the items the cascade is fitted on."
            ) from None


def _probs(
    run: ModelRun, name: str, calibration: Any = None, temperature: float = 1.0
) -> np.ndarray:
    z = np.array([row[name] for row in run.log_scores], dtype=np.float64)
    if isinstance(calibration, CrossFitted):
        return np.stack(
            [
                calibration.for_item(i).probabilities(name, r, temperature)
                for i, r in zip(run.ids, z)
            ]
        )
    if calibration is not None:
        return np.stack([calibration.probabilities(name, r, temperature) for r in z])
    return softmax(z, temperature)


def _narrow(small: np.ndarray, large: np.ndarray, k: int | None) -> np.ndarray:
    """The large model's distribution renormalised over the small model's top k."""
    if k is None or k >= small.shape[1]:
        return large
    keep = np.zeros_like(large, dtype=bool)
    top = np.argsort(-small, axis=1, kind="stable")[:, :k]
    np.put_along_axis(keep, top, True, axis=1)
    out = np.where(keep, large, 0.0)
    return out / out.sum(axis=1, keepdims=True)


def pair_runs(
    schema: Any,
    small: ModelRun,
    large: ModelRun,
    *,
    small_calibration: Any = None,
    gate: ModelRun | None = None,
    large_calibration: Any = None,
    top_k: int | None = None,
) -> Pair:
    """Both runs on their common items, as arrays (the small model's answers under
    `small_calibration`, a `Calibration` or a `CrossFitted` one, or from `gate`'s log
    scores, e.g. a contextual run; the large model's under `large_calibration`).

    Raises:
        CascadeEvalError: for runs of another schema or without common items.
    """
    compiled = compile_schema(schema)
    fp = compiled.fingerprint()
    runs = [("small", small), ("large", large)] + ([("gate", gate)] if gate else [])
    for what, run in runs:
        if run.fingerprint not in (fp, "None"):
            raise CascadeEvalError(
                f"the {what} run ({run.model_id}) was made with schema fingerprint "
                f"{run.fingerprint}, but {compiled.name}'s is {fp}; evaluate both models "
                "on the same schema."
            )
    common = common_ids(small, large, *([gate] if gate is not None else []))
    if not common:
        raise CascadeEvalError(
            f"the small ({small.model_id}) and large ({large.model_id}) runs share no item "
            "ids; evaluate both on the same sample (`pcd eval --n N --seed S`)."
        )
    s, lg = small.subset(common), large.subset(common)
    g = gate.subset(common) if gate is not None else s
    names = gated_fields(compiled)
    out_s, out_l, gold = {}, {}, {}
    for n in names:
        spec = compiled.field(n)
        out_s[n] = _probs(g, n, small_calibration if gate is None else None)
        out_l[n] = _narrow(out_s[n], _probs(lg, n, large_calibration), top_k)
        gold[n] = np.array(
            [label_index(spec, lab[n]) if lab.get(n) is not None else -1 for lab in s.gold],
            dtype=np.int64,
        )
    tokens = lg.prompt_tokens if np.isfinite(lg.prompt_tokens).all() else np.ones(len(common))
    return Pair(names, out_s, out_l, gold, s.ms, lg.ms, tokens)


# --- signals and policies ---------------------------------------------------------------------


def confidence(probs: np.ndarray, signal: str) -> np.ndarray:
    """Per item, the gate's confidence (higher is surer): max probability, the margin of
    the top two, or minus the entropy in nats."""
    if signal == "probability":
        return probs.max(axis=1)
    if signal == "margin":
        top = -np.sort(-probs, axis=1)
        return top[:, 0] - (top[:, 1] if probs.shape[1] > 1 else 0.0)
    if signal == "entropy":
        p = np.clip(probs, 1e-300, 1.0)
        return (probs * np.log(p)).sum(axis=1)
    raise InvalidArgumentError(f"unknown signal {signal!r}; accepted: {list(SIGNALS)}.")


def to_threshold(signal: str, cut: float, k: int) -> float:
    """A `Cascade` threshold (probability/margin: confident at or above it; entropy in
    nats: confident at or below it) from a confidence cut (escalate below it)."""
    if signal == "entropy":  # escalate when the entropy is above the threshold
        if cut == -math.inf:  # never: above the largest entropy k answers can have
            return math.log(k) + 1e-9
        return 0.0 if cut == math.inf else float(-cut)
    if cut == -math.inf:
        return 0.0
    return 1.0 if cut == math.inf else float(min(max(cut, 0.0), 1.0))


def _escalated(conf: np.ndarray, signal: str, threshold: float) -> np.ndarray:
    if signal == "entropy":
        return -conf > threshold
    return conf < threshold


def evaluate_policy(pair: Pair, thresholds: Mapping[str, tuple[str, float]]) -> dict[str, Any]:
    """The metrics of per-field thresholds `{field: (signal, threshold)}` on `pair`.

    Returns:
        `{"escalation": item rate, "field_escalation": {field: rate}, "mean_field_escalation",
        "accuracy": mean over fields, "fields": {field: {accuracy, macro_f1, ece}}, "ece"
        (all fields' final answers pooled), "large_tokens": fraction of large-only,
        "est_time": (small on all + large on escalated) / large-only}`.
    """
    n = pair.n
    any_esc = np.zeros(n, dtype=bool)
    per: dict[str, dict[str, float]] = {}
    rates: dict[str, float] = {}
    confs, oks = [], []
    for f in pair.fields:
        sig, t = thresholds[f]
        esc = _escalated(confidence(pair.small[f], sig), sig, t)
        any_esc |= esc
        final = pair.final(f, esc)
        pred, conf = final.argmax(axis=1), final.max(axis=1)
        g = pair.gold[f]
        has = g >= 0
        ok = pred[has] == g[has]
        rates[f] = float(esc.mean())
        per[f] = {
            "accuracy": float(ok.mean()) if has.any() else math.nan,
            "macro_f1": macro_f1(g[has].tolist(), pred[has].tolist()) if has.any() else math.nan,
            "ece": ece(conf[has], ok) if has.any() else math.nan,
        }
        confs.append(conf[has])
        oks.append(ok)
    tok = pair.large_tokens
    ms_large = float(np.nansum(pair.large_ms))
    return {
        "escalation": float(any_esc.mean()),
        "field_escalation": rates,
        "mean_field_escalation": float(np.mean(list(rates.values()))),
        "accuracy": float(np.nanmean([p["accuracy"] for p in per.values()])),
        "macro_f1": float(np.nanmean([p["macro_f1"] for p in per.values()])),
        "ece": ece(np.concatenate(confs), np.concatenate(oks)),
        "fields": per,
        "large_tokens": float(tok[any_esc].sum() / tok.sum()) if tok.sum() else math.nan,
        "est_time": (
            float((np.nansum(pair.small_ms) + np.nansum(pair.large_ms[any_esc])) / ms_large)
            if ms_large > 0
            else math.nan
        ),
    }


def uniform(pair: Pair, signal: str, cut: float) -> dict[str, tuple[str, float]]:
    return {f: (signal, to_threshold(signal, cut, pair.small[f].shape[1])) for f in pair.fields}


def sweep(pair: Pair, signal: str = "probability", points: int = 21) -> list[dict[str, Any]]:
    """One threshold for every field, swept so that the field escalation rate runs from 0
    to 1 in `points` steps (quantiles of the pooled confidence); one row per threshold
    (`evaluate_policy` plus `"threshold"`), sorted by escalation."""
    pooled = np.concatenate([confidence(pair.small[f], signal) for f in pair.fields])
    cuts = [-math.inf, *np.quantile(pooled, np.linspace(0, 1, points)[1:-1]).tolist(), math.inf]
    rows = []
    for cut in cuts:
        th = uniform(pair, signal, cut)
        row = evaluate_policy(pair, th)
        row["threshold"] = th[pair.fields[0]][1]
        rows.append(row)
    rows.sort(key=lambda r: (r["escalation"], r["large_tokens"]))
    return rows


def separation(pair: Pair, signal: str = "probability") -> float:
    """How well the gate's confidence separates the small model's right answers from its
    wrong ones: the AUROC (`metrics.auroc`) per field, averaged over the fields where
    the small model is both right and wrong (NaN when none is). 0.5 is a gate that
    cannot tell them apart."""
    vals = []
    for f in pair.fields:
        lab = pair.gold[f] >= 0
        right = pair.small[f].argmax(axis=1) == pair.gold[f]
        a = auroc(confidence(pair.small[f], signal)[lab], right[lab])
        if not math.isnan(a):
            vals.append(a)
    return float(np.mean(vals)) if vals else float("nan")


def curve_area(rows: Sequence[Mapping[str, Any]]) -> float:
    """Area under accuracy against the large model's token fraction (0 to 1): one number
    per gate for comparing cost-accuracy curves (higher is better)."""
    pts = sorted(
        {(0.0, rows[0]["accuracy"]), (1.0, rows[-1]["accuracy"])}
        | {(float(r["large_tokens"]), float(r["accuracy"])) for r in rows}
    )
    xs, ys = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    # the best accuracy reachable at each cost (a gate can always stop escalating)
    ys = np.maximum.accumulate(ys)
    return float(np.sum((xs[1:] - xs[:-1]) * (ys[1:] + ys[:-1]) / 2.0))
