"""Listing orders: decide under k orders of the allowed values and average.

A small model leans towards values listed early (or late) in the prompt. Deciding under k
listing orders and averaging each field's distribution reduces that lean (EVAL.md: on
banking77, averaging over 4 rotations halves the answers that flip when the listing is
reversed). Each order has its own system prompt, so it costs k prefills of the schema
part (each kept in the prefix cache) and k field passes.

`Decider.decide(..., orders=k)` uses this module, and so does `pcd_tools.eval.order_bias`,
which measures the flips.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..answers.ranked import ranked_result
from ..answers.result import Decision, FieldResult
from ..errors import InvalidArgumentError
from ..schema import Schema

__all__ = ["DESIGNS", "average", "check_orders", "orderings"]

DESIGNS = ("rotations", "random")


def check_orders(orders: Any) -> int:
    """Validates the `orders=` argument of a decision call.

    Raises:
        InvalidArgumentError: unless `orders` is an int >= 1.
    """
    if isinstance(orders, bool) or not isinstance(orders, int) or orders < 1:
        raise InvalidArgumentError(
            f"orders must be an int >= 1 (1: the declared listing only); got {orders!r}."
        )
    return orders


def orderings(
    schema: Schema,
    k: int,
    *,
    seed: int = 0,
    first: str = "identity",
    design: str = "rotations",
) -> list[dict[str, list[int]]]:
    """k listing orders per field (indices into each field's choices); for a part of a
    schema (`Schema.part`), per field of its whole, whose prompt lists them all.

    - `rotations`: the first order rotated by `j * K // k` places for j < k, so every
      allowed value sits at k evenly spread positions and its mean position is close to
      the middle of the list, whatever the first order was. The first of them is the
      first order itself.
    - `random`: the first order, then k - 1 seeded random permutations.

    Args:
        schema: The compiled schema.
        k: Number of orders.
        seed: Seed of the random orders.
        first: `"identity"` (the declared listing) or `"reverse"`.
        design: `"rotations"` or `"random"`.

    Raises:
        InvalidArgumentError: for an unknown `design` or `first`.
    """
    if design not in DESIGNS:
        raise InvalidArgumentError(f"unknown order design {design!r}; accepted: {list(DESIGNS)}.")
    if first not in ("identity", "reverse"):
        raise InvalidArgumentError(
            f"unknown first order {first!r}; accepted: ['identity', 'reverse']."
        )
    listed = schema.shown.fields  # a part of a schema is listed as its whole is
    head = {f.name: list(range(f.cardinality)) for f in listed}
    if first == "reverse":
        head = {n: o[::-1] for n, o in head.items()}
    if design == "rotations":
        out = []
        for j in range(k):
            order = {}
            for name, base in head.items():
                r = j * len(base) // k
                order[name] = base[r:] + base[:r]
            out.append(order)
        return out
    rng = np.random.default_rng(seed)
    out = [head]
    for _ in range(k - 1):
        out.append({f.name: [int(i) for i in rng.permutation(f.cardinality)] for f in listed})
    return out


def average(schema: Schema, runs: Sequence[Sequence[Decision[Any]]]) -> list[Decision[Any]]:
    """Per context, the mean distribution over the runs (one run per listing order).

    Each field's answer is the argmax of its averaged distribution; its `log_scores` hold
    the log of the averaged probabilities, and its `flip_rate` is the fraction of the
    orders whose own answer differs from the averaged one. The decision's timings and
    `sequential_forward_passes` are sums over the orders (they ran one after another);
    `orders` is the number of runs.

    Args:
        schema: The compiled schema.
        runs: For each order, the decisions of every context, in context order.
    """
    k = len(runs)
    out = []
    for per in zip(*runs):
        fields, native = {}, {}
        for spec in schema.fields:
            # a union branch's field is kept only by the orders that took its branch: its
            # distribution (given the branch) is averaged over those
            have = [d for d in per if spec.name in d.fields]
            if not have:
                continue
            p = np.mean(
                [[d.fields[spec.name].distribution[c.label] for c in spec.choices] for d in have],
                axis=0,
            )
            if spec.reading == "ranked":  # the ranking, averaged
                res = ranked_result(spec, p, np.log(np.maximum(p, 1e-300)))
            elif spec.kind == "multilabel":  # each label's P(yes), averaged
                q = np.clip(p, 1e-300, 1 - 1e-16)
                res = FieldResult.from_labels(spec, p, np.log(q) - np.log1p(-q))
            else:
                res = FieldResult.from_probs(spec, p, np.log(np.maximum(p, 1e-300)))
            fields[spec.name] = res
        first = per[0]
        joint = {
            pair: {key: float(np.mean([d.joint[pair][key] for d in per])) for key in t}
            for pair, t in first.joint.items()
            if all(pair in d.joint for d in per)
        }
        _joint_answers(schema, fields, joint)
        _union_answers(schema, fields)
        for name, res in fields.items():
            flips = sum(d.fields[name].label != res.label for d in per if name in d.fields)
            side = next(d.fields[name].scoring for d in per if name in d.fields)
            fields[name] = replace(res, flip_rate=flips / k, scoring=side)
            native[name] = res.value
        out.append(
            replace(
                first,
                value=schema.build(native),
                fields=fields,
                prefill_ms=sum(d.prefill_ms for d in per),
                suffix_eval_ms=sum(d.suffix_eval_ms for d in per),
                elapsed_ms=sum(d.elapsed_ms for d in per),
                content_free_ms=sum(d.content_free_ms for d in per),
                attention_ms=sum(d.attention_ms for d in per),
                sequential_forward_passes=sum(d.sequential_forward_passes for d in per),
                prefix_cache_hit=all(d.prefix_cache_hit for d in per),
                orders=k,
                joint=joint,
            )
        )
    return out


def _joint_answers(
    schema: Schema, fields: dict[str, FieldResult], joint: dict[tuple[str, str], Any]
) -> None:
    """A `choices_by` pair's answer: the best cell of the averaged joint table, so that
    the child is always allowed with the parent (two averaged marginals' argmaxes need
    not be)."""
    for (parent, child), table in joint.items():
        if parent not in fields or child not in fields:
            continue
        pv, cv = max(table, key=lambda key: table[key])
        for name, label in ((parent, pv), (child, cv)):
            res = fields[name]
            best = [c.label for c in res.spec.choices].index(label)
            probs = np.array(list(res.distribution.values()))
            fields[name] = FieldResult.from_probs(res.spec, probs, res.log_scores, best=best)


def _union_answers(schema: Schema, fields: dict[str, FieldResult]) -> None:
    """A union's branch from the averaged distributions (as `joint` chooses it), among the
    branches whose fields some order scored; the other branches' fields are dropped."""
    kinds = dict.fromkeys(f.branch[0] for f in schema.fields if f.branch is not None)
    for kind in kinds:
        if kind not in fields:
            continue
        res = fields[kind]
        best, best_score = None, -1.0
        for t, pt in enumerate(res.distribution.values()):
            branch = [f for f in schema.fields if f.branch == (kind, t)]
            if any(f.name not in fields for f in branch):
                continue  # no order took this branch: its fields were never kept
            score = pt
            for f in branch:
                if f.kind != "multilabel":
                    score *= max(fields[f.name].distribution.values())
            if score > best_score:
                best, best_score = t, score
        if best is None:  # pragma: no cover - the orders' own answers are always eligible
            continue
        probs = np.array(list(res.distribution.values()))
        fields[kind] = FieldResult.from_probs(res.spec, probs, res.log_scores, best=best)
        for f in schema.fields:
            if f.branch is not None and f.branch[0] == kind and f.branch[1] != best:
                fields.pop(f.name, None)
