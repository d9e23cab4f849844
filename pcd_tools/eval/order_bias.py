"""Order bias: how often answers flip when the allowed values are listed in another order.

The prompt lists each field's allowed values, and a small model leans towards values
listed early (or late). `order_bias` measures how often the answer flips between the
declared listing and its reverse, and `decide_orderings` reduces the lean by averaging
each field's distribution over k listing orders (k prefills and k field passes).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..answers.calibration import CalibrationError
from ..answers.result import Decision
from ..decide.orders import DESIGNS, average, orderings
from ..schema import Schema, compile_schema

if TYPE_CHECKING:
    from ..decide.decider import Decider

__all__ = ["DESIGNS", "OrderBiasReport", "decide_orderings", "order_bias"]


def _orderings(
    schema: Schema, k: int, seed: int, first: str, design: str = "rotations"
) -> list[dict[str, list[int]]]:
    """k listing orders per field, starting from `first` (see `pcd_tools.decide.orders.orderings`)."""
    if design not in DESIGNS:
        raise CalibrationError(f"unknown order design {design!r}; accepted: {list(DESIGNS)}.")
    return orderings(schema, k, seed=seed, first=first, design=design)


def _runs(
    decider: Decider,
    schema: Schema,
    contexts: list[str],
    orderings: Sequence[Mapping[str, Sequence[int]]],
    temperature: float,
    batch_size: int,
) -> tuple[list[list[Decision[Any]]], list[float]]:
    """One `decide_many` per listing order, and the wall seconds of each."""
    runs, secs = [], []
    for o in orderings:
        t0 = time.perf_counter()
        runs.append(
            decider.decide_many(
                schema,
                contexts,
                temperature=temperature,
                choice_order=dict(o),
                batch_size=batch_size,
            )
        )
        secs.append(time.perf_counter() - t0)
    return runs, secs


def decide_orderings(
    decider: Decider,
    schema: Any,
    contexts: Sequence[str],
    *,
    k: int = 4,
    seed: int = 0,
    orderings: Sequence[Mapping[str, Sequence[int]]] | None = None,
    temperature: float = 1.0,
    batch_size: int = 8,
    design: str = "rotations",
) -> list[Decision[Any]]:
    """Decides each context under k listing orders of the allowed values and averages.

    Each field's distribution is the mean of its distributions under the orders: by
    default the declared order rotated by evenly spaced offsets, so every allowed value
    is listed at k spread-out positions (`design="random"`: the declared order and k - 1
    seeded random permutations; `orderings` gives them explicitly). Every order has its own system prompt, so this costs k prefills and k field
    passes per batch: the returned decisions' `sequential_forward_passes`, `prefill_ms`,
    `suffix_eval_ms` and `elapsed_ms` are sums over the orders. `log_scores` hold the log
    of the averaged probabilities.

    Args:
        decider: The decider (its calibration, if any, applies under each order).
        schema: The decision schema.
        contexts: The texts.
        k: Number of orders (ignored when `orderings` is given).
        seed: Seed of the random orders.
        orderings: Explicit per-field listing orders (indices into each field's choices).
        temperature: Softmax temperature.
        batch_size: Contexts per pass.
        design: `"rotations"` (default) or `"random"`.
    """
    compiled = compile_schema(schema)
    if orderings is None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise CalibrationError(f"k must be an int >= 1; got {k!r}.")
        orderings = _orderings(compiled, k, seed, "identity", design)
    runs, _ = _runs(decider, compiled, list(contexts), orderings, temperature, batch_size)
    return average(compiled, runs)


@dataclass
class OrderBiasReport:
    """How often answers flip when the allowed values are listed in another order.

    Args:
        n: Contexts measured.
        k: Orders averaged over in the averaging option (0 if not run).
        flip_rate: Per field: the fraction whose answer differs between the declared and
            the reversed listing.
        flip_rate_averaged: Per field: the fraction whose averaged answer differs between
            the k orders built from the declared listing and the k built from its reverse.
        ms_per_item: Wall time per context: `"single"` (one order) and `"averaged"` (k).
        passes_per_call: Sequential forward passes of one call over a batch of contexts,
            for `"single"` and `"averaged"`.
        design: How the k orders were built: `"rotations"` or `"random"`.
    """

    n: int
    k: int
    flip_rate: dict[str, float]
    flip_rate_averaged: dict[str, float] = field(default_factory=dict)
    ms_per_item: dict[str, float] = field(default_factory=dict)
    passes_per_call: dict[str, float] = field(default_factory=dict)
    design: str = "rotations"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return asdict(self)


def _flips(
    a: Sequence[Decision[Any]], b: Sequence[Decision[Any]], names: list[str]
) -> dict[str, float]:
    return {
        n: float(np.mean([x.fields[n].label != y.fields[n].label for x, y in zip(a, b)]))
        for n in names
    }


def order_bias(
    schema: Any,
    contexts: Sequence[str],
    *,
    decider: Decider | None = None,
    k: int = 0,
    seed: int = 0,
    temperature: float = 1.0,
    batch_size: int = 8,
    design: str = "rotations",
) -> OrderBiasReport:
    """Measures the order-flip rate, and with `k >= 2` that of the k-order average.

    The raw flip rate compares the declared listing with its reverse. The averaged one
    compares the average over k orders built from the declared listing with the average
    over k orders built from the reversed listing:

    - `rotations` (default, what `decide_orderings` uses): each listing rotated by k
      evenly spaced offsets. The two sets share no order when a field has more than two
      values; for a boolean with k = 2 they are the same two orders, so its averaged
      answer cannot depend on the order at all.
    - `random`: each listing plus k - 1 independently drawn random permutations.

    Args:
        schema: The decision schema.
        contexts: The texts.
        decider: The decider (default: the embedded model).
        k: Orders for the averaging option; 0 or 1 measures the raw flip rate only.
        seed: Seed of the random orders.
        temperature: Softmax temperature.
        batch_size: Contexts per pass.
        design: `"rotations"` or `"random"`.
    """
    from ..decide.decider import default_decider

    d = decider or default_decider()
    compiled = compile_schema(schema)
    names = compiled.field_names
    ctx = list(contexts)
    n = max(1, len(ctx))
    kk = k if k >= 2 else 1
    ra, sa = _runs(
        d,
        compiled,
        ctx,
        _orderings(compiled, kk, seed, "identity", design),
        temperature,
        batch_size,
    )
    rb, sb = _runs(
        d,
        compiled,
        ctx,
        _orderings(compiled, kk, seed + 1, "reverse", design),
        temperature,
        batch_size,
    )
    single_passes = [x.sequential_forward_passes for x in ra[0] + rb[0]]
    report = OrderBiasReport(
        n=len(ctx),
        k=0,
        flip_rate=_flips(ra[0], rb[0], names),
        ms_per_item={"single": (sa[0] + sb[0]) * 1e3 / (2 * n)},
        passes_per_call={"single": float(np.mean(single_passes))},
        design=design,
    )
    if k >= 2:
        a_k, b_k = average(compiled, ra), average(compiled, rb)
        report.k = k
        report.flip_rate_averaged = _flips(a_k, b_k, names)
        report.ms_per_item["averaged"] = (sum(sa) + sum(sb)) * 1e3 / (2 * n)
        report.passes_per_call["averaged"] = float(
            np.mean([x.sequential_forward_passes for x in a_k + b_k])
        )
    return report
