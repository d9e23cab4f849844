"""Accuracy and calibration metrics for one decision field (pure numpy).

Conventions, shared by every function here:

- `probs` is an `(n, K)` array: each row is a probability distribution over the field's
  K candidates; `gold` holds the index of the correct candidate per row.
- `confidence` is the probability of the chosen answer and `correct` whether it was right.
- ECE uses 15 equal-width bins on [0, 1]; a confidence of exactly `b/15` falls in bin
  `b - 1` (bins are closed on the right), and 0 falls in the first bin.
- Brier is the multi-class score `mean_i sum_k (p_ik - y_ik)^2` (0 is perfect, 2 is worst).
- NLL is `mean_i -log p_i,gold`, with probabilities clipped at `1e-12`.
- The risk-coverage curve accepts items in order of falling confidence; tied confidences
  enter together. AURC is the area under it, `sum_j (c_j - c_{j-1}) * r_j`, which without
  ties equals `mean_k risk@k` (Geifman et al., 2019).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "ECE_BINS",
    "FieldMetrics",
    "accuracy",
    "aurc",
    "auroc",
    "brier",
    "ece",
    "ece_floor",
    "ece_null_quantile",
    "field_metrics",
    "macro_f1",
    "nll",
    "reliability_bins",
    "risk_coverage",
]

ECE_BINS = 15
_EPS = 1e-12


def _vec(x: Any, dtype: Any = np.float64) -> np.ndarray:
    a = np.asarray(x, dtype=dtype)
    if a.ndim != 1:
        raise ValueError(f"expected a 1-D array; got shape {a.shape}.")
    return a


def _probs_gold(probs: Any, gold: Any) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(probs, dtype=np.float64)
    g = np.asarray(gold, dtype=np.int64)
    if p.ndim != 2 or g.ndim != 1 or p.shape[0] != g.shape[0]:
        raise ValueError(f"probs must be (n, K) and gold (n,); got {p.shape} and {g.shape}.")
    if g.size and (g.min() < 0 or g.max() >= p.shape[1]):
        raise ValueError(f"gold indices must lie in [0, {p.shape[1]}); got {g.min()}..{g.max()}.")
    return p, g


def accuracy(gold: Sequence[Any], pred: Sequence[Any]) -> float:
    """Fraction of `pred` equal to `gold` (NaN when empty)."""
    g, p = list(gold), list(pred)
    if len(g) != len(p):
        raise ValueError(f"gold and pred differ in length: {len(g)} vs {len(p)}.")
    if not g:
        return float("nan")
    return sum(a == b for a, b in zip(g, p)) / len(g)


def macro_f1(gold: Sequence[Any], pred: Sequence[Any]) -> float:
    """Unweighted mean F1 over every label that occurs in `gold` or `pred`.

    A label that is predicted but never gold (or the reverse) scores F1 = 0, as in
    scikit-learn's `f1_score(average="macro")`. A `None` prediction (no valid answer) is
    wrong for its gold label but is not a label itself.
    """
    g, p = list(gold), list(pred)
    if len(g) != len(p):
        raise ValueError(f"gold and pred differ in length: {len(g)} vs {len(p)}.")
    if not g:
        return float("nan")
    labels = [lab for lab in dict.fromkeys([*g, *p]) if lab is not None]
    scores = []
    for lab in labels:
        tp = sum(a == lab and b == lab for a, b in zip(g, p))
        fp = sum(a != lab and b == lab for a, b in zip(g, p))
        fn = sum(a == lab and b != lab for a, b in zip(g, p))
        denom = 2 * tp + fp + fn
        scores.append(2 * tp / denom if denom else 0.0)
    return float(np.mean(scores))


def _bin_index(conf: np.ndarray, n_bins: int) -> np.ndarray:
    # bins (b/n, (b+1)/n]; 0 goes to the first bin
    return np.clip(np.ceil(conf * n_bins).astype(np.int64) - 1, 0, n_bins - 1)


def reliability_bins(
    confidence: Any, correct: Any, n_bins: int = ECE_BINS
) -> dict[str, np.ndarray]:
    """Per-bin counts, mean confidence and accuracy (equal-width bins on [0, 1]).

    Returns:
        `{"edges": (n_bins + 1,), "count": (n_bins,), "confidence": (n_bins,),
        "accuracy": (n_bins,)}`; empty bins have NaN confidence and accuracy.
    """
    c = _vec(confidence)
    ok = _vec(correct, np.float64)
    if c.shape != ok.shape:
        raise ValueError(f"confidence and correct differ in shape: {c.shape} vs {ok.shape}.")
    idx = _bin_index(c, n_bins)
    count = np.bincount(idx, minlength=n_bins).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(idx, weights=c, minlength=n_bins) / count
        mean_acc = np.bincount(idx, weights=ok, minlength=n_bins) / count
    return {
        "edges": np.linspace(0.0, 1.0, n_bins + 1),
        "count": count,
        "confidence": mean_conf,
        "accuracy": mean_acc,
    }


def ece(confidence: Any, correct: Any, n_bins: int = ECE_BINS) -> float:
    """Expected calibration error: `sum_b |B_b|/n * |acc(B_b) - conf(B_b)|`."""
    bins = reliability_bins(confidence, correct, n_bins)
    n = bins["count"].sum()
    if n == 0:
        return float("nan")
    filled = bins["count"] > 0
    gap = np.abs(bins["accuracy"][filled] - bins["confidence"][filled])
    return float((bins["count"][filled] / n * gap).sum())


def _null_eces(c: np.ndarray, n_bins: int, draws: int, seed: int) -> np.ndarray:
    """ECEs of `draws` samples `correct ~ Bernoulli(c)`: a perfectly calibrated predictor."""
    if draws < 1:
        raise ValueError(f"draws must be >= 1; got {draws}.")
    if np.any((c < 0) | (c > 1)):
        raise ValueError("confidence must lie in [0, 1].")
    idx = _bin_index(c, n_bins)
    conf_sum = np.bincount(idx, weights=c, minlength=n_bins)
    rng = np.random.default_rng(seed)
    out = np.empty(draws)
    onehot = np.zeros((c.size, n_bins))
    onehot[np.arange(c.size), idx] = 1.0
    step = max(1, 2_000_000 // c.size)
    for lo in range(0, draws, step):
        hi = min(draws, lo + step)
        hits = (rng.random((hi - lo, c.size)) < c).astype(np.float64) @ onehot
        out[lo:hi] = np.abs(hits - conf_sum).sum(axis=1) / c.size
    return out


def ece_floor(
    confidence: Any, n_bins: int = ECE_BINS, *, draws: int = 2000, seed: int = 0
) -> float:
    """The ECE a perfectly calibrated predictor with these confidences would show.

    ECE on a finite sample is biased upwards: even when every answer given with
    confidence `c` is right with probability exactly `c`, the per-bin accuracies scatter
    around their confidences. This draws `correct ~ Bernoulli(confidence)` `draws` times
    (fixed `seed`) and returns the mean ECE, so a measured ECE can be read against it: a
    value near the floor is as small as this sample can show.

    Args:
        confidence: `(n,)` confidences in [0, 1].
        n_bins: Equal-width bins, as in `ece`.
        draws: Monte-Carlo draws (the standard error is about `floor / sqrt(draws)`).
        seed: Seed of the draws.

    Returns:
        The mean ECE over the draws (NaN for an empty sample).
    """
    c = _vec(confidence)
    if draws < 1:
        raise ValueError(f"draws must be >= 1; got {draws}.")
    if c.size == 0:
        return float("nan")
    return float(_null_eces(c, n_bins, draws, seed).mean())


def ece_null_quantile(
    confidence: Any, q: float = 0.9, n_bins: int = ECE_BINS, *, draws: int = 2000, seed: int = 0
) -> float:
    """The `q`-quantile of the ECE a perfectly calibrated predictor with these
    confidences would show (the same draws as `ece_floor`, whose mean is the floor).

    A measured ECE below it is one that a calibrated predictor exceeds with probability
    about `1 - q`: on this sample it cannot be told from perfect calibration.

    Args:
        confidence: `(n,)` confidences in [0, 1].
        q: The quantile, in [0, 1].
        n_bins: Equal-width bins, as in `ece`.
        draws: Monte-Carlo draws.
        seed: Seed of the draws.

    Returns:
        The quantile (NaN for an empty sample).
    """
    c = _vec(confidence)
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must lie in [0, 1]; got {q}.")
    if c.size == 0:
        return float("nan")
    return float(np.quantile(_null_eces(c, n_bins, draws, seed), q))


def brier(probs: Any, gold: Any) -> float:
    """Multi-class Brier score: `mean_i sum_k (p_ik - [k == gold_i])^2`."""
    p, g = _probs_gold(probs, gold)
    if not len(g):
        return float("nan")
    onehot = np.zeros_like(p)
    onehot[np.arange(len(g)), g] = 1.0
    return float(((p - onehot) ** 2).sum(axis=1).mean())


def nll(probs: Any, gold: Any) -> float:
    """Mean negative log-likelihood of the gold candidate, in nats."""
    p, g = _probs_gold(probs, gold)
    if not len(g):
        return float("nan")
    return float(-np.log(np.clip(p[np.arange(len(g)), g], _EPS, 1.0)).mean())


def risk_coverage(confidence: Any, correct: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The risk-coverage curve of selective answering.

    Returns:
        `(thresholds, coverage, risk)`, one point per distinct confidence in falling
        order: answering only items with confidence >= threshold covers `coverage` of
        them with error rate `risk`.
    """
    c = _vec(confidence)
    ok = _vec(correct, np.float64)
    if c.shape != ok.shape:
        raise ValueError(f"confidence and correct differ in shape: {c.shape} vs {ok.shape}.")
    if not c.size:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    order = np.argsort(-c, kind="stable")
    cs, errs = c[order], 1.0 - ok[order]
    cum_err = np.cumsum(errs)
    # the last index of each run of equal confidences
    last = np.flatnonzero(np.append(cs[1:] != cs[:-1], True))
    accepted = last + 1
    return cs[last], accepted / c.size, cum_err[last] / accepted


def aurc(confidence: Any, correct: Any) -> float:
    """Area under the risk-coverage curve (lower is better)."""
    _, cov, risk = risk_coverage(confidence, correct)
    if not cov.size:
        return float("nan")
    widths = np.diff(np.concatenate([[0.0], cov]))
    return float((widths * risk).sum())


def auroc(confidence: Any, correct: Any) -> float:
    """How well the confidence separates right answers from wrong ones: the probability
    that a right answer's confidence is above a wrong one's (ties count half; the
    Mann-Whitney statistic). 0.5 is no separation, 1.0 perfect; NaN when the answers
    are all right or all wrong."""
    c = np.asarray(confidence, dtype=np.float64)
    ok = np.asarray(correct, dtype=bool)
    n_ok, n_bad = int(ok.sum()), int((~ok).sum())
    if not n_ok or not n_bad:
        return float("nan")
    # 1-based ranks, tied values sharing their mean rank
    _, at, counts = np.unique(c, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[at]
    return float((ranks[ok].sum() - n_ok * (n_ok + 1) / 2) / (n_ok * n_bad))


@dataclass
class FieldMetrics:
    """Accuracy and calibration of one field's answers.

    Args:
        n: Items scored.
        accuracy: Fraction answered correctly.
        macro_f1: Unweighted mean F1 over labels.
        ece: Expected calibration error (15 equal-width bins).
        brier: Multi-class Brier score.
        nll: Mean negative log-likelihood of the gold answer (nats).
        aurc: Area under the risk-coverage curve.
        mean_confidence: Mean probability of the chosen answer.
        ece_floor: The ECE a perfectly calibrated predictor with these confidences would
            show on this many items (`ece_floor`); an `ece` near it is as low as the
            sample can resolve.
        coverage: Risk-coverage curve, coverage axis (not serialised by default).
        risk: Risk-coverage curve, risk axis.
    """

    n: int
    accuracy: float
    macro_f1: float
    ece: float
    brier: float
    nll: float
    aurc: float
    mean_confidence: float
    ece_floor: float = float("nan")
    coverage: list[float] = field(default_factory=list, repr=False)
    risk: list[float] = field(default_factory=list, repr=False)

    def to_dict(self, *, curve: bool = False) -> dict[str, Any]:
        """A JSON-serialisable dict; `curve=True` adds the risk-coverage points."""
        d = asdict(self)
        if not curve:
            d.pop("coverage")
            d.pop("risk")
        return d


def field_metrics(
    probs: Any, gold: Any, *, confidence: Any = None, pred: Any = None
) -> FieldMetrics:
    """Every metric for one field.

    Args:
        probs: `(n, K)` distributions over the candidates.
        gold: `(n,)` index of the correct candidate.
        confidence: Confidence of each answer; default the row maximum of `probs`.
        pred: Index of each answer (-1 for no valid answer); default the row argmax
            (ties: the first candidate).
    """
    p, g = _probs_gold(probs, gold)
    pr = np.argmax(p, axis=1) if pred is None else np.asarray(pred, dtype=np.int64)
    conf = p.max(axis=1) if confidence is None else _vec(confidence)
    correct = pr == g
    _, cov, risk = risk_coverage(conf, correct)
    return FieldMetrics(
        n=len(g),
        accuracy=float(correct.mean()) if len(g) else float("nan"),
        macro_f1=macro_f1(g.tolist(), [int(i) if i >= 0 else None for i in pr]),
        ece=ece(conf, correct),
        brier=brier(p, g),
        nll=nll(p, g),
        aurc=aurc(conf, correct),
        mean_confidence=float(conf.mean()) if len(g) else float("nan"),
        ece_floor=ece_floor(np.clip(conf, 0.0, 1.0)),
        coverage=cov.tolist(),
        risk=risk.tolist(),
    )
