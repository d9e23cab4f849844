"""Per-field cascade thresholds fitted to a target on labelled items (`fit_cascade`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from ..schema import compile_schema
from .cascade_data import (
    SIGNALS,
    CrossFitted,
    ModelRun,
    Pair,
    common_ids,
    confidence,
    evaluate_policy,
    pair_runs,
    to_threshold,
    uniform,
)
from .crossfit import cross_fit, fitted_calibration

__all__ = ["TARGETS", "CascadeFit", "fit_cascade", "fit_pair"]

TARGETS: tuple[str, ...] = ("max_escalation", "max_accuracy_loss")


@dataclass
class CascadeFit:
    """Per-field thresholds fitted to a target on a calibration split.

    Args:
        thresholds: Field -> `(signal, threshold)`, as `Cascade(per_field=...)` takes it.
        signal: The gate signal.
        target: `"max_escalation"` or `"max_accuracy_loss"`.
        value: The target's value.
        source: Where the gate's probabilities came from (`raw`, `fitted`, `contextual`).
        calibration: The metrics on the calibration split (`evaluate_policy`) with the
            small-only and large-only accuracies.
        reached: Whether the target was met on the calibration split.
        large_model: The large model's id.
        n: Calibration items.
        folds: When the gate's calibration was cross-fitted on the same items, its
            folds (the thresholds were fitted on out-of-fold confidences); else None.
        small_calibration: The small model's calibration fitted on every item, when
            `fit_cascade(calibration="fit")` fitted one (not stored by `to_dict`; `attach`
            stores the fit in it).
    """

    thresholds: dict[str, tuple[str, float]]
    signal: str
    target: str
    value: float
    source: str = "raw"
    calibration: dict[str, Any] = field(default_factory=dict)
    reached: bool = True
    large_model: str = ""
    n: int = 0
    folds: int | None = None
    small_calibration: Any = field(default=None, repr=False, compare=False)

    @property
    def per_field(self) -> dict[str, tuple[str, float]]:
        """The thresholds as `Cascade(per_field=...)` takes them."""
        return dict(self.thresholds)

    def to_dict(self) -> dict[str, Any]:
        """The JSON stored in a calibration file's `cascade` entry."""
        return {
            "signal": self.signal,
            "target": {self.target: self.value},
            "source": self.source,
            "thresholds": {f: [s, round(t, 6)] for f, (s, t) in self.thresholds.items()},
            "large_model": self.large_model,
            "n": self.n,
            "cross_fitted_folds": self.folds,
            "reached": self.reached,
            "calibration": self.calibration,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CascadeFit:
        """Reads `to_dict`'s JSON back (a calibration file's `cascade` entry)."""
        ((target, value),) = dict(d["target"]).items()
        return cls(
            thresholds={f: (str(s), float(t)) for f, (s, t) in dict(d["thresholds"]).items()},
            signal=str(d["signal"]),
            target=str(target),
            value=float(value),
            source=str(d.get("source", "raw")),
            calibration=dict(d.get("calibration") or {}),
            reached=bool(d.get("reached", True)),
            large_model=str(d.get("large_model", "")),
            n=int(d.get("n", 0)),
            folds=None if d.get("cross_fitted_folds") is None else int(d["cross_fitted_folds"]),
        )

    def attach(self, calibration: Any = None) -> Any:
        """Stores the fit in `calibration` (its `cascade` entry) and returns it; save it
        with `calibration.save(path)`.

        Args:
            calibration: The small model's calibration; None for `small_calibration`,
                the one `fit_cascade(calibration="fit")` fitted.

        Raises:
            InvalidArgumentError: for None when the fit fitted no calibration.
        """
        if calibration is None:
            calibration = self.small_calibration
        if calibration is None:
            raise InvalidArgumentError(
                "attach() needs the small model's calibration to store the fit in: pass "
                "one, or fit with fit_cascade(..., calibration='fit'), which fits it."
            )
        calibration.cascade = self.to_dict()
        return calibration


def _check_target(
    max_escalation: float | None, max_accuracy_loss: float | None
) -> tuple[str, float]:
    given = [
        (k, v)
        for k, v in (("max_escalation", max_escalation), ("max_accuracy_loss", max_accuracy_loss))
        if v is not None
    ]
    if len(given) != 1:
        raise InvalidArgumentError(
            "fit_cascade needs exactly one target: max_escalation=RATE (the best accuracy "
            "with at most that fraction of items escalated) or max_accuracy_loss=POINTS "
            f"(the least escalation within that accuracy of large-only); got {dict(given)}."
        )
    k, v = given[0]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= float(v) <= 1.0:
        raise InvalidArgumentError(f"{k} must be a number in [0, 1] (a fraction); got {v!r}.")
    return k, float(v)


def _greedy_path(
    pair: Pair, signal: str, lookahead: int = 25
) -> list[tuple[float, float, dict[str, int]]]:
    """Escalation steps from none to all: each step escalates the next least-confident
    items of the field with the best accuracy gain per newly escalated item.

    Returns `(item escalation rate, accuracy, {field: items escalated})` per step."""
    n, nf = pair.n, len(pair.fields)
    order, cuts, gain = {}, {}, {}
    acc = 0.0  # small-only: the mean over fields of each field's accuracy
    for f in pair.fields:
        c = confidence(pair.small[f], signal)
        o = np.argsort(c, kind="stable")
        denom = max(int((pair.gold[f] >= 0).sum()), 1) * nf
        s_ok = _correct(pair, f, np.zeros(n, dtype=bool))
        l_ok = _correct(pair, f, np.ones(n, dtype=bool))
        acc += float(s_ok.sum()) / denom
        order[f] = o
        gain[f] = (l_ok[o].astype(float) - s_ok[o].astype(float)) / denom
        cs = c[o]
        # a cut may only fall between different confidences (ties escalate together)
        cuts[f] = [0] + [k for k in range(1, n) if cs[k - 1] < cs[k]] + [n]
    pos = dict.fromkeys(pair.fields, 0)  # index into cuts[f]
    used = np.zeros(n, dtype=np.int64)  # fields escalating each item
    esc = 0
    path = [(0.0, acc, {f: 0 for f in pair.fields})]
    while any(pos[f] < len(cuts[f]) - 1 for f in pair.fields):
        best: tuple[float, int, float, str, int] | None = None
        for f in pair.fields:
            k0 = cuts[f][pos[f]]
            for j in range(pos[f] + 1, min(pos[f] + 1 + lookahead, len(cuts[f]))):
                k1 = cuts[f][j]
                items = order[f][k0:k1]
                new = int(np.count_nonzero(used[items] == 0))
                d = float(gain[f][k0:k1].sum())
                ratio = d / new if new else (math.inf if d >= 0 else -math.inf)
                key = (ratio, -new, d, f, j)
                if best is None or key[:3] > best[:3]:
                    best = key
        assert best is not None
        f, j = best[3], best[4]
        while pos[f] < j:  # every cut on the way is a policy too
            items = order[f][cuts[f][pos[f]] : cuts[f][pos[f] + 1]]
            acc += float(gain[f][cuts[f][pos[f]] : cuts[f][pos[f] + 1]].sum())
            esc += int(np.count_nonzero(used[items] == 0))
            used[items] += 1
            pos[f] += 1
            path.append((esc / n, acc, {g: cuts[g][pos[g]] for g in pair.fields}))
    return path


def _item_scores(pair: Pair, counts: Mapping[str, int], signal: str) -> np.ndarray:
    """Per item, the mean correctness over its labelled fields when each field escalates
    its `counts[field]` least confident items."""
    total = np.zeros(pair.n)
    seen = np.zeros(pair.n)
    for f in pair.fields:
        order = np.argsort(confidence(pair.small[f], signal), kind="stable")
        esc = np.zeros(pair.n, dtype=bool)
        esc[order[: counts[f]]] = True
        total += _correct(pair, f, esc)
        seen += pair.gold[f] >= 0
    return np.divide(total, seen, out=np.zeros(pair.n), where=seen > 0)


def _correct(pair: Pair, field: str, escalated: np.ndarray) -> np.ndarray:
    """Per item, whether the kept answer of `field` is its gold label (False unlabelled)."""
    g = pair.gold[field]
    return (pair.final(field, escalated).argmax(axis=1) == g) & (g >= 0)


def _cut_between(conf_sorted: np.ndarray, k: int) -> float:
    """A confidence cut escalating exactly the `k` least confident items."""
    if k <= 0:
        return -math.inf
    if k >= len(conf_sorted):
        return math.inf
    return float((conf_sorted[k - 1] + conf_sorted[k]) / 2.0)


def fit_pair(
    pair: Pair,
    *,
    max_escalation: float | None = None,
    max_accuracy_loss: float | None = None,
    signal: str = "probability",
    source: str = "raw",
    large_model: str = "",
    confidence_level: float | None = None,
) -> CascadeFit:
    """`fit_cascade` on already paired arrays."""
    target, value = _check_target(max_escalation, max_accuracy_loss)
    if signal not in SIGNALS:
        raise InvalidArgumentError(f"unknown signal {signal!r}; accepted: {list(SIGNALS)}.")
    if confidence_level is not None and not 0.5 <= confidence_level < 1.0:
        raise InvalidArgumentError(
            f"confidence_level must lie in [0.5, 1) or be None; got {confidence_level!r}."
        )
    path = _greedy_path(pair, signal)
    large_acc = path[-1][1]
    if target == "max_escalation":
        z = 0.0 if confidence_level is None else statistics.NormalDist().inv_cdf(confidence_level)
        # with a level: the rate's one-sided upper bound (normal, binomial variance) within it
        ok = [p for p in path if p[0] + z * math.sqrt(p[0] * (1 - p[0]) / pair.n) <= value + 1e-12]
        chosen = max(ok, key=lambda p: (round(p[1], 12), -p[0]))
    elif confidence_level is None:
        ok = [p for p in path if p[1] >= large_acc - value - 1e-12]
        chosen = min(ok, key=lambda p: (p[0], -p[1]))
    else:  # the first step whose lower bound on the paired loss is within the target
        z = statistics.NormalDist().inv_cdf(confidence_level)
        large_items = _item_scores(pair, {f: pair.n for f in pair.fields}, signal)
        chosen = path[-1]
        for p in path:
            d = _item_scores(pair, p[2], signal) - large_items
            sd = float(d.std(ddof=1)) if pair.n > 1 else 0.0
            if float(d.mean()) - z * sd / math.sqrt(pair.n) >= -value - 1e-12:
                chosen = p
                break
    counts = chosen[2]
    thresholds = {}
    for f in pair.fields:
        cs = np.sort(confidence(pair.small[f], signal))
        cut = _cut_between(cs, counts[f])
        thresholds[f] = (signal, to_threshold(signal, cut, pair.small[f].shape[1]))
    got = evaluate_policy(pair, thresholds)
    small_only = evaluate_policy(pair, uniform(pair, signal, -math.inf))
    got["small_accuracy"] = small_only["accuracy"]
    got["large_accuracy"] = large_acc
    got["confidence_level"] = confidence_level
    reached = (
        got["escalation"] <= value + 1e-12
        if target == "max_escalation"
        else got["accuracy"] >= large_acc - value - 1e-12
    )
    return CascadeFit(
        thresholds=thresholds,
        signal=signal,
        target=target,
        value=value,
        source=source,
        calibration=got,
        reached=reached,
        large_model=large_model,
        n=pair.n,
    )


def _as_run(schema: Any, x: Any, labelled: Any, what: str) -> ModelRun:
    """A stage's results: as given, from a report, or by deciding `labelled` with it."""
    if isinstance(x, ModelRun):
        return x
    if hasattr(x, "decide_many"):
        if not labelled:
            raise InvalidArgumentError(
                f"fit_cascade got a Decider as the {what} stage but no labelled items to decide; "
                "pass labelled=[(text, {field: label}), ...] (kept apart from evaluation items)."
            )
        texts = [t for t, _ in labelled]
        labels = [dict(lab) for _, lab in labelled]
        # all candidates scored, so escalation only chooses between two answers
        ds = x.decide_many(schema, texts, scoring="full", pruning="off")
        return ModelRun.from_decisions(schema, ds, labels)
    if isinstance(x, Mapping):
        return ModelRun.from_report(x, where=what)
    raise InvalidArgumentError(
        f"fit_cascade: the {what} stage is a {type(x).__name__}; accepted: a Decider (with "
        "labelled=), a ModelRun or a `pcd eval --out` report dict."
    )


def fit_cascade(
    schema: Any,
    small: Any,
    large: Any,
    labelled: Sequence[tuple[str, Mapping[str, Any]]] | None = None,
    *,
    max_escalation: float | None = None,
    max_accuracy_loss: float | None = None,
    signal: str = "probability",
    calibration: Any = None,
    confidence_level: float | None = None,
    folds: int = 5,
) -> CascadeFit:
    """Per-field thresholds for a small→large cascade, fitted on labelled items.

    Give exactly one target. Escalating a field's least confident answers first, it
    walks from "never escalate" to "always escalate", at each step escalating more of
    the field with the best accuracy gain per newly escalated item, and keeps the step
    that meets the target.

    Args:
        schema: The decision schema both models were evaluated with.
        small: The first stage: a `Decider` (then `labelled` is decided with it, under
            its calibration if it has one), or its results on the calibration items (a
            `ModelRun` or a `pcd eval --out` report).
        large: The second stage, likewise (a `Decider`, or its results on the same items).
        labelled: `(text, {field: label})` pairs, when a stage is a `Decider`; keep them
            apart from the items you evaluate on.
        max_escalation: The best accuracy with at most this fraction of items escalated.
        max_accuracy_loss: The least escalation with accuracy within this much (a
            fraction: 0.01 is one point) of the large model alone.
        signal: `"probability"`, `"margin"` or `"entropy"`.
        calibration: The small model's calibration, when its decider will apply one (the
            thresholds are then on calibrated confidences, as `Cascade` sees them):
            - `"fit"`: fit its `auto` calibration on these items too, and fit the
              thresholds on cross-fitted confidences (`folds` folds, each item scored by a
              calibration fitted without it); `fit.small_calibration` is the calibration
              fitted on every item, and `fit.attach()` stores the thresholds in it;
            - a `Calibration` fitted on other items (one fitted on these same items is
              surer here than on new items, so the thresholds escalate too little: use
              `"fit"`, or a `CrossFitted` one);
            - a `CrossFitted` one (`cross_fit`), for a calibration fitted with other
              options;
            - None: raw confidences, or the `Decider` stage's own calibration.
        confidence_level: None (default) holds the target on these items (the point
            estimate). A level such as 0.9 holds it to a one-sided normal confidence
            bound instead. For `max_accuracy_loss`: the least escalation whose lower
            bound on the paired accuracy difference against large-only is within it. On
            the shared sets that escalated far more (sst2 0.5B → 1.5B: 68.5% against
            50.5%) and met the target on held-out items no more often (5 of 9 pairs
            each; EVAL.md, "Cascades"). For `max_escalation`: the best accuracy whose
            upper bound on the escalation rate (binomial variance over these items) is
            within the budget, for a budget that must hold on new items.
        folds: The folds of `calibration="fit"`, from 2 to the number of items.

    Returns:
        The `CascadeFit`; `fit.per_field` goes to `Cascade(per_field=...)`, and
        `fit.attach(calibration).save(path)` stores it for `Cascade(threshold="fitted")`.

    Raises:
        InvalidArgumentError: for no target or both, a target outside [0, 1], an
            unknown signal, or a `calibration` or `folds` not accepted.
        CascadeEvalError: for runs that cannot be paired.
    """
    _check_target(max_escalation, max_accuracy_loss)  # before any model runs
    if isinstance(calibration, str) and calibration != "fit":
        raise InvalidArgumentError(
            f"calibration must be 'fit', a Calibration, a CrossFitted one or None; got "
            f"{calibration!r}."
        )
    if calibration is None and hasattr(small, "decide_many"):
        calibration = getattr(small, "calibration", None)
    s, lg = (_as_run(schema, x, labelled, what) for x, what in ((small, "small"), (large, "large")))
    full = None
    if isinstance(calibration, str):
        compiled = compile_schema(schema)
        s = s.subset(common_ids(s, lg))
        full = fitted_calibration(compiled, s)
        calibration = cross_fit(compiled, s, full, folds=folds)
    pair = pair_runs(schema, s, lg, small_calibration=calibration)
    fit = fit_pair(
        pair,
        max_escalation=max_escalation,
        max_accuracy_loss=max_accuracy_loss,
        signal=signal,
        source="fitted"
        if calibration is not None
        else s.label_free
        if s.label_free != "none"
        else "raw",
        large_model=lg.model_id,
        confidence_level=confidence_level,
    )
    if isinstance(calibration, CrossFitted):
        fit.folds = calibration.folds
    fit.small_calibration = full
    return fit
