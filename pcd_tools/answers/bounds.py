"""Certified answers from a partly scored field (pruned scoring, `pruning="on"`).

A pruned field's trie was expanded only where an answer could still beat the best one
found (`pcd_tools.engine.passes.prune`). Its candidates fall in two sets:

- scored: every token of the candidate was read, so its log score `z_c` is exact;
- unscored: the candidate lies under an unexpanded prefix, whose own probability `u_g`
  was read. The candidates under a prefix can never hold more than the prefix's own
  probability (`sum_c p_c <= exp(u_g)`), with full-vocabulary scoring and with
  `scoring="constrained"` alike, because both give each prefix a proper distribution over
  its continuations.

With the decision's distribution `p_c ∝ exp(a z_c + b_c)` (`a` = 1 / temperatures, `b`
the calibration's biases over the temperature), each prefix's unscored share is bounded
by Hölder's inequality: `sum_{c in g} exp(a z_c) <= n_g^max(0, 1 - a) exp(a u_g)` for the
`n_g` candidates under it. That bounds the answer's probability from both sides and the
total probability the unscored candidates can hold, and it certifies the answer: it is
the true argmax whenever its score beats every prefix's best possible candidate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .softmax import logsumexp

__all__ = ["Bounded", "PartialScores", "SearchReport", "bounded", "log_weights", "prefix_floors"]


@dataclass(frozen=True)
class SearchReport:
    """What the pruned search of one question did for one context.

    Args:
        levels: Levels the request's search ran after its first pass (a fallback's
            included).
        read: Trie positions (internal nodes) whose logits it read.
        positions: The trie's positions; `read / positions` is the share read.
        fallback: Whether it ran out of levels uncertified and read the rest of the trie
            (the exhaustive pass), so the answer is exact.
    """

    levels: int
    read: int
    positions: int
    fallback: bool = False

    @property
    def share(self) -> float:
        """The share of the trie's positions read."""
        return self.read / self.positions if self.positions else 1.0


@dataclass(frozen=True)
class PartialScores:
    """A pruned field's candidate log scores, with what bounds the unscored ones.

    Args:
        z: (K,) candidate log scores (log-probabilities), NaN where unscored.
        frontier_logp: (G,) log-probability of each unexpanded prefix.
        frontier_members: Per prefix, the indices of the candidates under it; together
            they are exactly the unscored candidates.
        search: What the search did (levels, positions read, a fallback), when known.
        exact_prefixes: Whether each prefix's probability is exactly its candidates'
            total (`scoring="constrained"`: every node's distribution is over its allowed
            children), not only a bound of it (full-vocabulary scoring).
    """

    z: np.ndarray
    frontier_logp: np.ndarray
    frontier_members: tuple[np.ndarray, ...]
    search: SearchReport | None = None
    exact_prefixes: bool = False

    @classmethod
    def whole(cls, z: np.ndarray, search: SearchReport | None = None) -> PartialScores:
        """A pruned field whose search scored every candidate (it ended there, or fell
        back to the exhaustive pass)."""
        return cls(np.asarray(z, dtype=np.float64), np.zeros(0), (), search, True)

    @property
    def scored(self) -> np.ndarray:
        """Boolean mask of the scored candidates."""
        return ~np.isnan(self.z)


@dataclass(frozen=True)
class Bounded:
    """A pruned field's distribution and its guarantees.

    Args:
        probs: (K,) probabilities: each scored candidate's share of the scored mass (its
            probability if the unscored candidates hold nothing), 0.0 for unscored ones.
        best: Index of the answer (the most probable scored candidate; ties: the first).
        certified: Whether the answer is provably the argmax over every candidate.
        probability_bounds: (lower, upper) bounds of the answer's true probability.
        unscored_mass: Upper bound of the total probability of the unscored candidates.
        certified_top: How many of the most probable candidates are certified, in order:
            the scored ones that beat every unscored candidate's best possible score (all
            of them when nothing is unscored).
        lower_factor: A scored candidate's true probability is at least its `probs`
            entry times this (the unscored candidates at their upper bounds).
        upper_factor: ... and at most its entry times this (the unscored candidates at
            their lower bounds: `prefix_floors`, exact totals under constrained scoring,
            where the two factors meet at temperature 1; 1.0 where no floor is known).
        unscored_top: The most any single unscored candidate's true probability can be
            (0.0 when every candidate is scored): under prefix g at its best weight
            `W_g`, over the scored weights `S`, every prefix's floor `F_h` and what its
            own prefix holds beyond its floor, `W_g / (S + sum_h F_h + max(0, W_g - F_g))`.
            Under constrained scoring at temperature 1 it is the largest unread prefix's
            probability.
    """

    probs: np.ndarray
    best: int
    certified: bool
    probability_bounds: tuple[float, float]
    unscored_mass: float
    certified_top: int = 0
    lower_factor: float = 1.0
    upper_factor: float = 1.0
    unscored_top: float = 0.0

    def bounds_of(self, i: int) -> tuple[float, float]:
        """(lower, upper) bounds of candidate `i`'s true probability (the exhaustive
        pass's); (0, 0) for a candidate that was not scored."""
        p = float(self.probs[i])
        return p * self.lower_factor, p * self.upper_factor


def log_weights(
    scores: PartialScores,
    temperature: float,
    *,
    scale: float = 1.0,
    bias: np.ndarray | None = None,
) -> tuple[np.ndarray, list[tuple[float, np.ndarray]], list[float]]:
    """The log weights `s_c = a z_c + b_c` of the scored candidates (`-inf` for the
    unscored), and per unexpanded prefix the log bound of its candidates' summed weights
    with its members, and the log bound of its best single one (`prefix_floors` gives
    the lower bounds of the sums where the prefixes' probabilities are exact).

    Raises:
        ValueError: if no candidate was scored (the search always scores one).
    """
    z = np.asarray(scores.z, dtype=np.float64)
    seen = ~np.isnan(z)
    if not seen.any():
        raise ValueError("a pruned field has no scored candidate")
    b = np.zeros_like(z) if bias is None else np.asarray(bias, dtype=np.float64) / temperature
    a = scale / temperature
    s = np.full_like(z, -np.inf)
    s[seen] = a * z[seen] + b[seen]
    # Per prefix: the bound of its candidates' summed exp(s), and of the best single one.
    groups: list[tuple[float, np.ndarray]] = []
    group_max: list[float] = []
    for u, members in zip(scores.frontier_logp, scores.frontier_members):
        if not len(members):
            continue
        top_b = float(b[members].max())
        group_max.append(a * float(u) + top_b)
        groups.append((group_max[-1] + max(0.0, 1.0 - a) * np.log(len(members)), members))
    return s, groups, group_max


def prefix_floors(
    scores: PartialScores,
    temperature: float,
    *,
    scale: float = 1.0,
    bias: np.ndarray | None = None,
) -> list[float]:
    """Per unexpanded prefix (as `log_weights` lists them), a log lower bound of its
    candidates' summed weights: `-inf` unless the prefix's probability `u` is exactly
    their total (`exact_prefixes`). Then `sum_c exp(a z_c) >= n^min(0, 1 - a) exp(a u)`
    (the power mean: equality at a = 1), and each weight's bias is at least the least."""
    a = scale / temperature
    b = None if bias is None else np.asarray(bias, dtype=np.float64) / temperature
    out: list[float] = []
    for u, members in zip(scores.frontier_logp, scores.frontier_members):
        if not len(members):
            continue
        if not scores.exact_prefixes:
            out.append(-np.inf)
            continue
        least = 0.0 if b is None else float(b[members].min())
        out.append(a * float(u) + least + min(0.0, 1.0 - a) * np.log(len(members)))
    return out


def bounded(
    scores: PartialScores,
    temperature: float,
    *,
    scale: float = 1.0,
    bias: np.ndarray | None = None,
) -> Bounded:
    """The distribution `softmax((scale * z + bias) / temperature)` of a pruned field,
    with bounds that hold whatever the unscored candidates' scores are.

    Args:
        scores: The field's partial scores.
        temperature: The decision's temperature (> 0).
        scale: 1 / the field's calibrated temperature.
        bias: The field's calibrated per-candidate biases (over `scale`), or None.

    Raises:
        ValueError: if no candidate was scored (the search always scores one).
    """
    s, groups, group_max = log_weights(scores, temperature, scale=scale, bias=bias)
    seen = np.isfinite(s)
    log_s = logsumexp(s[seen])
    best = int(np.argmax(s))  # NaN-free: unscored are -inf; argmax keeps the first tie
    probs = np.zeros_like(s)
    probs[seen] = np.exp(s[seen] - log_s)
    group_sum = [g for g, _ in groups]
    if not group_sum:
        return Bounded(probs, best, True, (float(probs[best]),) * 2, 0.0, int(seen.sum()))
    log_u = logsumexp(np.array(group_sum))
    log_all = np.logaddexp(log_s, log_u)
    # the unscored mass is at least the known floors (exact prefix totals): without them
    # the upper bound would be a share of the scored mass alone, and a taxonomy answer
    # read in one small subtree would report its share there (0.89) for 0.30 overall
    all_floors = prefix_floors(scores, temperature, scale=scale, bias=bias)
    floors = [f for f in all_floors if np.isfinite(f)]
    log_f = logsumexp(np.array(floors)) if floors else -np.inf
    lower = float(np.exp(log_s - log_all))
    upper = float(np.exp(log_s - np.logaddexp(log_s, log_f)))
    return Bounded(
        probs=probs,
        best=best,
        certified=bool(s[best] > max(group_max)),
        probability_bounds=(float(probs[best]) * lower, float(probs[best]) * upper),
        unscored_mass=float(min(1.0, np.exp(log_u - log_all))),
        certified_top=int((s > max(group_max)).sum()),
        lower_factor=lower,
        upper_factor=upper,
        unscored_top=_unscored_top(float(log_s), float(log_f), group_max, all_floors),
    )


def _unscored_top(log_s: float, log_f: float, group_max: list[float], floors: list[float]) -> float:
    """`Bounded.unscored_top` from the scored weights' log total, the floors' log total and
    each prefix's best single weight and floor (logs throughout)."""
    w = np.asarray(group_max, dtype=np.float64)
    f = np.asarray(floors, dtype=np.float64)
    m = np.maximum(max(log_s, log_f), w)
    beyond = np.maximum(0.0, np.exp(w - m) - np.exp(f - m))
    denom = m + np.log(np.exp(log_s - m) + np.exp(log_f - m) + beyond)
    return float(np.exp(w - denom).max())
