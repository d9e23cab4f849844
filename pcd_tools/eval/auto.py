"""`method="auto"`: per field, the calibration that cross-validation says helps, or none.

**Candidates** (`CANDIDATES`), for one field (or one label of a multi-label field):

- `identity`: no change, the raw scores `z` (T = 1, no bias);
- `temperature`: `softmax(z / T)`;
- `temperature_bias`: `softmax(z / T + b)`, one bias per allowed value (`fitting.fit_biased`);
- when the content-free scores of the same prompt are given (`offsets`): `contextual`
  and `pmi`, the label-free corrections `softmax(z - o)` with `o` the content-free
  offset (`pcd_tools.decide.contextual`), and `contextual_temperature` / `pmi_temperature`,
  `softmax((z - o) / T)`.

A label-free correction is a fixed per-value offset, so a chosen one is stored as the
field's biases (`b = -o / T`): the `Calibration` applies it per field on the raw scores,
and a decider needs no label-free setting for it. That is what lets the choice be made
per field rather than per schema. It holds for the fields scored as one question (and
each label of a multi-label field); fields scored jointly with a parent (`choices_by`) or
in a later wave (`depends_on`) have offsets that depend on earlier answers and are
offered the first three candidates only.

**Criterion.** Every candidate is fitted `CV_FOLDS` times, each time without one fold
of the calibration items, and predicts the fold it did not see; the pooled out-of-fold
answers give its cross-validated (CV) accuracy, ECE of the top-label confidence, top-label
NLL and NLL. The *error* is the CV ECE in excess of what a perfectly calibrated predictor
with the same confidences would show: `max(0, ECE - q90)`, where `q90` is the 90%
quantile of that predictor's ECE on as many items (`metrics.ece_null_quantile`; its mean
is the ECE floor). An ECE below it cannot be told from perfect calibration on this
sample, so it counts as zero.

**Choice.** A candidate must not lower the CV accuracy below `identity`'s (a calibration
that never hurts must not lose answers) and must have a strictly lower error than
`identity`: a tie keeps the scores unchanged. Among the candidates left, those with the
lowest error are compared on CV NLL (which rewards right answers as well as honest
confidence), and the simplest (the order of `CANDIDATES`) whose NLL is within one
standard error of the lowest wins: the one-standard-error rule, so that a candidate with
more parameters must earn its place. Below `2 * CV_FOLDS` labelled items nothing is
cross-validated and the field is left unchanged.

The file records, per field, the choice, the CV figures of every candidate and the
reason (`Calibration.metrics[field]`: `method`, `cv`, `why`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..answers.softmax import softmax
from .fitting import CV_FOLDS, fit_biased, fit_temperature, folds
from .metrics import ECE_BINS, _null_eces, ece, nll

__all__ = ["CANDIDATES", "LABEL_FREE_METHODS", "NULL_QUANTILE", "choose", "fit_candidate"]

# In order of simplicity: the one-standard-error rule prefers the earlier one.
CANDIDATES = (
    "identity",
    "temperature",
    "contextual",
    "pmi",
    "contextual_temperature",
    "pmi_temperature",
    "temperature_bias",
)
# The label-free corrections whose offsets `choose` can be given.
LABEL_FREE_METHODS = ("contextual", "pmi")
NULL_QUANTILE = 0.9


def fit_candidate(
    name: str, z: np.ndarray, g: np.ndarray, offset: Any, objective: str, sd: float | None
) -> tuple[float, np.ndarray | None]:
    """A candidate's `(T, b)` fitted on `(z, g)`; `softmax(z / T + b)` applies it.

    Args:
        name: One of `CANDIDATES`.
        z: `(n, K)` raw candidate log scores.
        g: `(n,)` index of the correct candidate.
        offset: The `(K,)` content-free offset of a label-free candidate (else unused).
        objective: The temperature's loss.
        sd: `temperature_bias`'s prior width (None: chosen by cross-validation).
    """
    if name == "identity":
        return 1.0, None
    if name == "temperature":
        return fit_temperature(z, g, objective=objective), None
    if name == "temperature_bias":
        t, b, _ = fit_biased(z, g, objective, prior_sd=sd)
        return t, b
    o = np.asarray(offset, dtype=np.float64)
    o = o - o.mean()  # softmax ignores a shift; the biases are kept with mean zero
    if name in LABEL_FREE_METHODS:
        return 1.0, -o
    t = fit_temperature(z - o, g, objective=objective)
    return t, -o / t


def _cv_stats(probs: np.ndarray, g: np.ndarray) -> dict[str, Any]:
    """The figures of one candidate's pooled out-of-fold distributions."""
    conf = probs.max(axis=1)
    ok = probs.argmax(axis=1) == g
    p = conf.clip(1e-12, 1 - 1e-12)
    null = _null_eces(conf.clip(0.0, 1.0), ECE_BINS, 2000, 0)  # as metrics.ece_floor draws
    q90 = float(np.quantile(null, NULL_QUANTILE))
    e = ece(conf, ok)
    return {
        "error": round(max(0.0, e - q90), 6),
        "ece": round(e, 6),
        "ece_floor": round(float(null.mean()), 6),
        "ece_q90": round(q90, 6),
        "accuracy": round(float(ok.mean()), 6),
        "correct": int(ok.sum()),
        "top_label_nll": round(float(-np.where(ok, np.log(p), np.log1p(-p)).mean()), 6),
        "nll": round(nll(probs, g), 6),
    }


def _out_of_fold(
    name: str, z: np.ndarray, g: np.ndarray, offset: Any, objective: str, sd: float
) -> np.ndarray:
    if name in ("identity", *LABEL_FREE_METHODS):  # nothing is fitted
        t, b = fit_candidate(name, z, g, offset, objective, sd)
        return softmax(z, t, b)
    out = np.empty_like(z)
    everything = np.arange(len(g))
    for test in folds(len(g)):
        train = np.setdiff1d(everything, test)
        t, b = fit_candidate(name, z[train], g[train], offset, objective, sd)
        out[test] = softmax(z[test], t, b)
    return out


def _simplest_within_one_se(tied: list[str], losses: Mapping[str, np.ndarray]) -> str:
    """Among candidates tied on the error, the simplest whose CV NLL is within one
    standard error (of its per-item difference) of the lowest."""
    best = min(tied, key=lambda k: float(losses[k].mean()))
    for k in sorted(tied, key=CANDIDATES.index):
        d = losses[k] - losses[best]
        se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0
        if float(d.mean()) <= se:
            return k
    return best


def _why(choice: str, cv: Mapping[str, Mapping[str, Any]], refused: list[str]) -> str:
    ident = cv["identity"]
    if choice == "identity":
        best = min(
            (n for n in cv if n != "identity" and n not in refused),
            key=lambda n: cv[n]["error"],
            default=None,
        )
        what = f"no candidate beat it (best: {best}, error {cv[best]['error']:.4f})" if best else ""
        if ident["error"] == 0.0:
            what = (
                f"its CV ECE {ident['ece']:.4f} is within what a calibrated predictor shows "
                f"on {ident['n']} items (90% quantile {ident['ece_q90']:.4f}); " + what
            )
        else:
            what = f"its CV error is {ident['error']:.4f}; " + what
        return "no change: " + what.rstrip("; ")
    c = cv[choice]
    return (
        f"{choice}: CV error {c['error']:.4f} (ECE {c['ece']:.4f}, 90% quantile "
        f"{c['ece_q90']:.4f}) below no change's {ident['error']:.4f} (ECE {ident['ece']:.4f}); "
        f"CV accuracy {c['accuracy']:.3f} vs {ident['accuracy']:.3f}"
    )


def choose(
    z: np.ndarray,
    g: np.ndarray,
    *,
    objective: str = "top_label_nll",
    offsets: Mapping[str, Any] | None = None,
) -> tuple[float, np.ndarray | None, dict[str, Any]]:
    """The calibration `auto` chooses for one field: `(T, biases or None, how)`.

    Args:
        z: `(n, K)` raw candidate log scores.
        g: `(n,)` index of the correct candidate.
        objective: The loss the candidates' temperatures minimise (`"nll"` or
            `"top_label_nll"`; see `fitting.fit_temperature`).
        offsets: Label-free method (`"contextual"`, `"pmi"`) -> the `(K,)` content-free
            offset subtracted from `z`; the methods present become candidates.

    Returns:
        The chosen temperature and biases (fitted on all items), and `how`: `method`
        (the candidate), `cv` (per candidate: error, ECE, ECE floor, its 90% quantile,
        accuracy, correct answers, top-label NLL and NLL, all cross-validated), `why`, and
        for `temperature_bias` its prior's width.
    """
    offs = {k: v for k, v in (offsets or {}).items() if k in LABEL_FREE_METHODS}
    names = [
        n
        for n in CANDIDATES
        if n.split("_")[0] not in LABEL_FREE_METHODS or n.split("_")[0] in offs
    ]
    n = len(g)
    if n < 2 * CV_FOLDS:
        why = f"no change: {n} labelled items, too few to cross-validate (need {2 * CV_FOLDS})"
        return 1.0, None, {"method": "identity", "cv": {}, "why": why}
    _, _, biased = fit_biased(z, g, "nll")  # the prior's width, once, by CV NLL
    sd = float(biased["bias_prior_sd"])
    cv: dict[str, dict[str, Any]] = {}
    losses: dict[str, np.ndarray] = {}
    for name in names:
        probs = _out_of_fold(name, z, g, offs.get(name.split("_")[0]), objective, sd)
        cv[name] = {"n": n, **_cv_stats(probs, g)}
        losses[name] = -np.log(np.clip(probs[np.arange(n), g], 1e-12, 1.0))
    ident = cv["identity"]
    refused = [k for k in names if cv[k]["correct"] < ident["correct"]]
    left = [k for k in names if k != "identity" and k not in refused]
    low = min((cv[k]["error"] for k in left), default=None)
    choice = "identity"
    if low is not None and low < ident["error"]:
        choice = _simplest_within_one_se([k for k in left if cv[k]["error"] == low], losses)
    how: dict[str, Any] = {
        "method": choice,
        "cv": cv,
        "why": _why(choice, cv, refused),
        "criterion": f"CV ECE in excess of its {NULL_QUANTILE:.0%} calibrated quantile",
    }
    if refused:
        how["refused_lower_accuracy"] = refused
    if choice == "temperature_bias":
        tb, bb, extra = fit_biased(z, g, objective, prior_sd=sd)
        how.update({k: v for k, v in extra.items() if k != "cv_nll"}, cv_nll=biased.get("cv_nll"))
        return tb, bb, how
    kind = choice.split("_")[0]
    if kind in offs:
        how["label_free"] = kind
        how["offset"] = [round(float(x), 6) for x in np.asarray(offs[kind], dtype=np.float64)]
    t, b = fit_candidate(choice, z, g, offs.get(kind), objective, sd)
    return t, b, how
