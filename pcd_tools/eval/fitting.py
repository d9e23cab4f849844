"""The fits behind a calibration: a temperature, a temperature with biases, and the
cross-validation folds they share.

- `fit_temperature`: one temperature T minimising the NLL of `softmax(z / T)` (or the
  top-label NLL of the answer's confidence);
- `fit_temperature_bias`: T and one bias per allowed value, `softmax(z / T + b)`, with a
  Gaussian prior on the biases (Platt scaling for a boolean);
- `fit_biased`: that fit with the prior's width chosen by cross-validated NLL, and the
  temperature refitted on the top-label objective when asked.

`pcd_tools.eval.calibration` builds a `Calibration` from these; `pcd_tools.eval.auto`
chooses among them (and the label-free corrections) per field.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..answers.calibration import CalibrationError
from ..answers.softmax import softmax

__all__ = [
    "BIAS_PRIOR_SDS",
    "CV_FOLDS",
    "OBJECTIVES",
    "T_MAX",
    "T_MIN",
    "check_objective",
    "fit_biased",
    "fit_temperature",
    "fit_temperature_bias",
    "folds",
]

T_MIN, T_MAX = 0.02, 50.0
# Candidate standard deviations (in nats) of the Gaussian prior on the biases; the fit
# picks one by cross-validated NLL on the calibration data.
BIAS_PRIOR_SDS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
CV_FOLDS = 5


# --- temperature fitting ----------------------------------------------------------------


def _nll_at(z: np.ndarray, gold: np.ndarray, t: float) -> float:
    s = z / t
    m = s.max(axis=1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(s - m).sum(axis=1))) if len(s) else np.zeros(0)
    return float((lse - s[np.arange(len(gold)), gold]).mean())


def _top_label_nll_at(z: np.ndarray, gold: np.ndarray, t: float) -> float:
    """Binary NLL of "the answer is right" under the answer's probability."""
    p = softmax(z, t).max(axis=1).clip(1e-12, 1 - 1e-12)
    ok = z.argmax(axis=1) == gold
    return float(-np.where(ok, np.log(p), np.log1p(-p)).mean())


OBJECTIVES = {"nll": _nll_at, "top_label_nll": _top_label_nll_at}


def fit_temperature(
    log_scores: Any,
    gold: Any,
    *,
    objective: str = "nll",
    bounds: tuple[float, float] = (T_MIN, T_MAX),
) -> float:
    """The temperature T minimising a likelihood loss of `softmax(log_scores / T)`.

    A 1-D search on log T: a 64-point grid over `bounds`, then golden-section refinement
    between the best point's neighbours (the losses are smooth and, in practice, unimodal).

    Args:
        log_scores: `(n, K)` raw candidate log scores.
        gold: `(n,)` index of the correct candidate.
        objective: `"nll"` (default: the NLL of the gold candidate, classic temperature
            scaling) or `"top_label_nll"` (the binary NLL of whether the answer is right,
            given its probability: it fits the confidence users threshold on, and is not
            dominated by gold candidates the model scores near zero).
        bounds: Smallest and largest temperature considered.

    Raises:
        CalibrationError: on empty or mis-shaped input, or an unknown objective.
    """
    z = np.asarray(log_scores, dtype=np.float64)
    g = np.asarray(gold, dtype=np.int64)
    if z.ndim != 2 or g.shape != (z.shape[0],) or not len(g):
        raise CalibrationError(
            f"need (n, K) log scores and (n,) gold indices with n > 0; got {z.shape} and {g.shape}."
        )
    if objective not in OBJECTIVES:
        raise CalibrationError(f"unknown objective {objective!r}; accepted: {sorted(OBJECTIVES)}.")
    loss = OBJECTIVES[objective]
    lo, hi = math.log(bounds[0]), math.log(bounds[1])
    grid = np.linspace(lo, hi, 64)
    vals = [loss(z, g, math.exp(x)) for x in grid]
    j = int(np.argmin(vals))
    a, b = grid[max(j - 1, 0)], grid[min(j + 1, len(grid) - 1)]
    phi = (math.sqrt(5) - 1) / 2
    c, d = b - phi * (b - a), a + phi * (b - a)
    fc, fd = loss(z, g, math.exp(c)), loss(z, g, math.exp(d))
    for _ in range(60):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - phi * (b - a)
            fc = loss(z, g, math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + phi * (b - a)
            fd = loss(z, g, math.exp(d))
    best = (a + b) / 2
    return float(math.exp(best if loss(z, g, math.exp(best)) <= vals[j] else grid[j]))


def _tb_loss_grad_hess(
    z: np.ndarray, y: np.ndarray, a: float, b: np.ndarray, lam: float, fixed_a: bool
) -> tuple[float, np.ndarray, np.ndarray]:
    """MAP loss of `softmax(a z + b)` with an L2 penalty `lam/2 |b|^2 / n`, its gradient
    and Hessian in `(a, b)` (or in `b` alone when `a` is fixed). The loss is convex."""
    n = len(z)
    p = softmax(z, 1.0 / a, b)
    rows = np.arange(n)
    loss = float(-np.log(np.maximum(p[rows, y], 1e-300)).mean() + 0.5 * lam * (b @ b) / n)
    r = p.copy()
    r[rows, y] -= 1.0
    g_b = r.mean(axis=0) + lam * b / n
    h_bb = (np.diag(p.sum(axis=0)) - p.T @ p) / n + lam * np.eye(len(b)) / n
    if fixed_a:
        return loss, g_b, h_bb
    pz = (p * z).sum(axis=1)  # E_p[z] per item
    g_a = float((r * z).mean(axis=0).sum())
    h_aa = float(((p * z * z).sum(axis=1) - pz**2).mean())
    h_ab = (p * z - p * pz[:, None]).mean(axis=0)
    grad = np.concatenate([[g_a], g_b])
    hess = np.block([[np.array([[h_aa]]), h_ab[None, :]], [h_ab[:, None], h_bb]])
    return loss, grad, hess


def _newton(
    z: np.ndarray, y: np.ndarray, a: float, b: np.ndarray, lam: float, fixed_a: bool
) -> tuple[float, np.ndarray]:
    for _ in range(100):
        loss, grad, hess = _tb_loss_grad_hess(z, y, a, b, lam, fixed_a)
        if float(np.abs(grad).max()) < 1e-9:
            break
        step = np.linalg.solve(hess + 1e-10 * np.eye(len(grad)), grad)
        t = 1.0
        while t > 1e-6:
            na = a if fixed_a else a - t * step[0]
            nb = b - t * (step if fixed_a else step[1:])
            if _tb_loss_grad_hess(z, y, na, nb, lam, True)[0] <= loss + 1e-12:
                break
            t /= 2
        else:
            break
        a, b = na, nb
    return a, b


def fit_temperature_bias(
    log_scores: Any,
    gold: Any,
    *,
    prior_sd: float = 1.0,
    bounds: tuple[float, float] = (T_MIN, T_MAX),
) -> tuple[float, np.ndarray]:
    """The temperature T and per-candidate biases b minimising the NLL of `softmax(z/T + b)`.

    The biases have a Gaussian prior N(0, prior_sd^2) (a ridge penalty), so candidates
    seen rarely in the fitting data are not pushed far. The problem is convex in
    `(1/T, b)` and is solved by damped Newton steps; if `T` leaves `bounds` it is held at
    the nearer bound and the biases are refitted. For a boolean field this is Platt
    scaling of the log-odds. Biases are returned with mean zero.

    Args:
        log_scores: `(n, K)` raw candidate log scores.
        gold: `(n,)` index of the correct candidate.
        prior_sd: Standard deviation of the prior on each bias, in nats (> 0).
        bounds: Smallest and largest temperature allowed.

    Raises:
        CalibrationError: on empty or mis-shaped input or a bad `prior_sd`.
    """
    z = np.asarray(log_scores, dtype=np.float64)
    g = np.asarray(gold, dtype=np.int64)
    if z.ndim != 2 or g.shape != (z.shape[0],) or not len(g):
        raise CalibrationError(
            f"need (n, K) log scores and (n,) gold indices with n > 0; got {z.shape} and {g.shape}."
        )
    if isinstance(prior_sd, bool) or not isinstance(prior_sd, (int, float)) or not prior_sd > 0:
        raise CalibrationError(f"prior_sd must be a number > 0; got {prior_sd!r}.")
    z = z - z.max(axis=1, keepdims=True)  # softmax is shift-invariant per row
    lam = 1.0 / float(prior_sd) ** 2
    a0 = 1.0 / fit_temperature(z, g, bounds=bounds)
    a, b = _newton(z, g, a0, np.zeros(z.shape[1]), lam, fixed_a=False)
    lo, hi = 1.0 / bounds[1], 1.0 / bounds[0]
    if not lo <= a <= hi:
        a = min(max(a, lo), hi)
        a, b = _newton(z, g, a, np.zeros(z.shape[1]), lam, fixed_a=True)
    return float(1.0 / a), b - b.mean()


def folds(n: int, k: int = 0, seed: int = 0) -> list[np.ndarray]:
    """`k` (default `CV_FOLDS`) disjoint test folds covering `range(n)`, seeded."""
    k = k or CV_FOLDS
    perm = np.random.default_rng(seed).permutation(n)
    return [perm[i::k] for i in range(k)]


def _cv_nll(z: np.ndarray, g: np.ndarray, prior_sd: float | None) -> float:
    """Held-out NLL of a method over `CV_FOLDS` folds (`prior_sd=None`: temperature only)."""
    total = 0.0
    for test in folds(len(g)):
        train = np.setdiff1d(np.arange(len(g)), test)
        if prior_sd is None:
            p = softmax(z[test], fit_temperature(z[train], g[train]))
        else:
            t, b = fit_temperature_bias(z[train], g[train], prior_sd=prior_sd)
            p = softmax(z[test], t, b)
        total += float(-np.log(np.maximum(p[np.arange(len(test)), g[test]], 1e-300)).sum())
    return total / len(g)


def check_objective(objective: str) -> None:
    """Raises `CalibrationError` unless `objective` is one of `OBJECTIVES`."""
    if objective not in OBJECTIVES:
        raise CalibrationError(f"unknown objective {objective!r}; accepted: {sorted(OBJECTIVES)}.")


def fit_biased(
    z: np.ndarray, g: np.ndarray, objective: str = "nll", prior_sd: float | None = None
) -> tuple[float, np.ndarray, dict[str, Any]]:
    """A temperature and biases, `(T, b, how)`, as `method="temperature_bias"` fits them.

    The prior's width is `prior_sd`, or the one of `BIAS_PRIOR_SDS` with the lowest
    `CV_FOLDS`-fold cross-validated NLL (the middle one below `2 * CV_FOLDS` items). The
    biases are always fitted by NLL. With `objective="top_label_nll"` the temperature is
    then refitted on that objective with the biases held: `softmax(z/T + b)` becomes
    `softmax((z/T + b)/s)`, returned as `(T*s, b/s)`; a positive rescale keeps every
    answer and moves only the confidence.

    Args:
        z: `(n, K)` raw candidate log scores.
        g: `(n,)` index of the correct candidate.
        objective: `"nll"` or `"top_label_nll"`.
        prior_sd: The prior's standard deviation, or None to choose it.

    Raises:
        CalibrationError: on an unknown objective.
    """
    check_objective(objective)
    how: dict[str, Any] = {}
    if prior_sd is None:
        options = list(BIAS_PRIOR_SDS)
        if len(g) < 2 * CV_FOLDS:  # too few items to cross-validate: the middle option
            prior_sd = options[len(options) // 2]
        else:
            cv = {str(o): _cv_nll(z, g, o) for o in options}
            prior_sd = min(options, key=lambda o: cv[str(o)])
            how["cv_nll"] = cv
    how["bias_prior_sd"] = prior_sd
    t, b = fit_temperature_bias(z, g, prior_sd=prior_sd)
    if objective != "nll":
        scale = fit_temperature(z / t + b, g, objective=objective)
        how["nll_temperature"] = t
        how["rescale"] = scale
        t, b = t * scale, b / scale
    return t, b, how
