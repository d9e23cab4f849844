"""The cascade's own cost: a batch's escalated rows against calling the large model directly.

A `Cascade` of two `Decider`s runs a batch of tickets. Each field's threshold sits at the
median of the first stage's probabilities on them, so each field escalates on about half
the rows (and most rows escalate at least one of the three fields). Three ways of doing the same work are timed, interleaved round by round:

- **cascade.batch**: `Cascade.batch(texts)`, the first stage on every row, the escalated
  rows to the second stage in one `decide_many` per narrowed sub-schema;
- **direct**: the same calls made by hand, with no cascade around them:
  `small.decide_many(schema, texts)`, then `large.decide_many(narrowed, rows)` for each
  set of escalated fields (the least the work can cost);
- **invoke per row**: `[cascade.invoke(t) for t in texts]`, one row at a time.

The overhead is cascade.batch / direct (1.0 = none); the batching gain is invoke per row /
cascade.batch. Medians and ranges over rounds; the machine may be shared, so only ratios
from the same run are compared.

Usage:
    python benchmarks/cascade.py --rounds 3
    python benchmarks/cascade.py --large ~/.cache/pcd-tools/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    python -m pytest benchmarks/cascade.py --benchmark-only
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TICKETS = [
    "The checkout page returns HTTP 500 for every EU customer since 09:00 UTC.",
    "I was charged twice for invoice #4471; please refund the duplicate payment.",
    "Could you add dark mode to the dashboard? Not urgent, just an idea.",
    "I cannot log in: the password reset e-mail never arrives.",
    "Our enterprise renewal shows the wrong seat count. Please fix it before Friday.",
    "Your API dropped 300 webhooks last night and our orders are stuck.",
    "How do I export my data to CSV for the quarterly report?",
    "Thanks, the new release is fantastic and the team loves it!",
]


class Ticket(BaseModel):
    """Triage an inbound customer support ticket."""

    priority: Literal["P0_CRITICAL", "P1_HIGH", "P2_NORMAL", "P3_LOW"] = Field(
        description="Urgency tier"
    )
    department: Literal["ENGINEERING", "BILLING", "ACCOUNT", "SALES"] = Field(
        description="Team that owns it"
    )
    escalate: bool = Field(description="Does a manager need to see it today?")


def build(small: Any, large: Any, texts: list[str]) -> Any:
    """The cascade, thresholds at each field's median first-stage probability."""
    from pcd_tools.agents import Cascade, DeciderStage

    ds = small.decide_many(Ticket, texts)
    mid = len(texts) // 2
    per_field = {
        n: sum(sorted(d.fields[n].probability for d in ds)[mid - 1 : mid + 1]) / 2
        for n in ds[0].fields
    }
    return Cascade(
        Ticket,
        [DeciderStage(small, name="small"), DeciderStage(large, name="large")],
        per_field=per_field,
    )


def direct(cascade: Any, small: Any, large: Any, texts: list[str]) -> None:
    """The same model calls as `cascade.batch`, made by hand."""
    from pcd_tools.agents.stages import narrowed_model

    ds = small.decide_many(Ticket, texts)
    groups: dict[tuple[str, ...], list[str]] = {}
    for t, d in zip(texts, ds):
        low = tuple(n for n, f in d.fields.items() if not cascade.confident(n, f))
        if low:
            groups.setdefault(low, []).append(t)
    for names, rows in groups.items():
        large.decide_many(narrowed_model(cascade.schema, list(names)), rows)


def measure(small: Any, large: Any, texts: list[str], rounds: int) -> dict[str, Any]:
    cascade = build(small, large, texts)
    runs = {
        "cascade.batch": lambda: cascade.batch(texts),
        "direct": lambda: direct(cascade, small, large, texts),
        "invoke per row": lambda: [cascade.invoke(t) for t in texts],
    }
    for fn in runs.values():  # warm-up: prompt caches, compiled kernels
        fn()
    ms: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for k, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            ms[k].append((time.perf_counter() - t0) * 1e3)
    out = cascade.batch(texts)
    over = [b / d for b, d in zip(ms["cascade.batch"], ms["direct"])]
    gain = [i / b for i, b in zip(ms["invoke per row"], ms["cascade.batch"])]
    return {
        "rows": len(texts),
        "escalated_rows": sum(1 for r in out if len(r.stages) > 1),
        "ms": {
            k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in ms.items()
        },
        "overhead": {"median": statistics.median(over), "min": min(over), "max": max(over)},
        "batching_gain": {"median": statistics.median(gain), "min": min(gain), "max": max(gain)},
    }


def test_cascade_batch_overhead(benchmark, decider):
    """cascade.batch on the embedded model as both stages (pytest-benchmark)."""
    texts = TICKETS * 2
    cascade = build(decider, decider, texts)
    benchmark.pedantic(lambda: cascade.batch(texts), rounds=3, iterations=1, warmup_rounds=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", default=None, help="first stage (default: the embedded model)")
    p.add_argument("--large", default=None, help="second stage (default: the embedded model)")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()

    from pcd_tools import Decider

    small = Decider.load(args.small)
    large = small if args.large == args.small else Decider.load(args.large)
    texts = [TICKETS[i % len(TICKETS)] + f" (ref {i})" for i in range(args.rows)]
    res = measure(small, large, texts, args.rounds)
    res["small"], res["large"] = small.model_id, large.model_id
    print(
        f"{res['small']} -> {res['large']}: {res['rows']} rows, {res['escalated_rows']} escalated"
    )
    print(f"{'way':<16} {'median ms':>10} {'range':>20}")
    for k, v in res["ms"].items():
        print(f"{k:<16} {v['median']:>10.0f} {v['min']:>9.0f}-{v['max']:<9.0f}")
    o, g = res["overhead"], res["batching_gain"]
    print(f"overhead cascade.batch / direct: {o['median']:.3f}x ({o['min']:.3f}-{o['max']:.3f})")
    print(
        f"batching gain invoke per row / cascade.batch: {g['median']:.2f}x ({g['min']:.2f}-{g['max']:.2f})"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
