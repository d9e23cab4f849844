"""How far PCD can beat grammar-constrained generation: the prefill bound, measured.

A warm PCD request and a warm constrained-generation request (baseline (b)) share their
first step: both prefill the same context tokens after the same cached schema part. Then
(b) decodes its answer token by token, and PCD runs its fields pass (and, for a pruned
field, its levels). So

    (b) / PCD = (prefill + decode) / (prefill + fields pass)
             <  (prefill + decode) / prefill           (the bound: a free fields pass)

and PCD reaches ``k`` times (b) only when its fields pass fits in ``(b) / k - prefill``.
This script times both methods in alternating blocks of warm requests on one context of
a scenario, leaves the first request of every block out, and prints per method the
median of each phase, the ratio, the bound, and the fields-pass budget a 2x target
leaves.

Usage:

    python benchmarks/bound.py --scenario fraud --scenario security_audit
    python benchmarks/bound.py --scenario tariff --scoring constrained --pruning auto \\
        --json benchmarks/results/bound_tariff.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _med(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def measure(decider: Any, name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Blocks of warm requests per method on the scenario's main context."""
    from benchmarks.scenarios import SCENARIOS
    from pcd_tools.baselines.generation import constrained_json
    from pcd_tools.schema import compile_schema

    sc = SCENARIOS[name]
    schema = compile_schema(sc.schema)
    opts = {"scoring": args.scoring, "pruning": args.pruning}
    decider.decide(schema, sc.context, **opts)  # caches the schema part
    constrained_json(decider, schema, sc.context)  # builds the grammar index
    pcd: dict[str, list[float]] = {"total": [], "prefill": [], "fields": []}
    gen: dict[str, list[float]] = {"total": [], "prefill": [], "decode": []}
    tokens = 0
    certified: list[bool] = []
    for block in range(2 * args.blocks):
        first_pcd = block % 2 == 0
        for i in range(args.per_block + 1):
            if first_pcd:
                r = decider.decide(schema, sc.context, **opts)
                if i:
                    pcd["total"].append(r.elapsed_ms)
                    pcd["prefill"].append(r.prefill_ms)
                    pcd["fields"].append(r.suffix_eval_ms)
                    certified.extend(
                        bool(f.certified) for f in r.fields.values() if f.certified is not None
                    )
            else:
                g = constrained_json(decider, schema, sc.context)
                if i:
                    gen["total"].append(g.wall_ms)
                    gen["prefill"].append(g.prefill_ms)
                    gen["decode"].append(g.decode_ms)
                    tokens = g.tokens
    p = {k: _med(v) for k, v in pcd.items()}
    b = {k: _med(v) for k, v in gen.items()}
    ratio = b["total"]["median"] / p["total"]["median"]
    bound = b["total"]["median"] / p["prefill"]["median"]
    return {
        "scenario": name,
        "scoring": args.scoring,
        "pruning": args.pruning,
        "requests_per_method": len(pcd["total"]),
        "pcd_ms": p,
        "constrained_ms": b,
        "constrained_tokens": tokens,
        "constrained_over_pcd": ratio,
        "bound": bound,
        "fields_budget_for_2x_ms": b["total"]["median"] / 2 - p["prefill"]["median"],
        "pruned_certified": (all(certified) if certified else None),
    }


def _fmt(d: dict[str, float]) -> str:
    return f"{d['median']:.0f} ms ({d['min']:.0f}-{d['max']:.0f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", action="append", default=[])
    p.add_argument("--scoring", choices=["auto", "full", "constrained"], default="auto")
    p.add_argument("--pruning", choices=["auto", "on", "off"], default="auto")
    p.add_argument("--blocks", type=int, default=2, help="blocks per method (default 2)")
    p.add_argument("--per-block", type=int, default=5, help="timed requests per block")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    from pcd_tools import Decider

    decider = Decider.load()
    results = []
    for name in args.scenario or ["fraud", "security_audit"]:
        r = measure(decider, name, args)
        results.append(r)
        print(json.dumps(r), flush=True)
    print(
        "\n| scenario | (b) warm: prefill + decode (tokens) | PCD warm: prefill + fields "
        "| (b) / PCD | bound (b) / PCD prefill | fields budget for 2x |"
    )
    print("|---|---|---|---|---|---|")
    for r in results:
        b, c = r["constrained_ms"], r["pcd_ms"]
        print(
            f"| {r['scenario']} | {_fmt(b['total'])}: {b['prefill']['median']:.0f} + "
            f"{b['decode']['median']:.0f} ms ({r['constrained_tokens']}) | {_fmt(c['total'])}: "
            f"{c['prefill']['median']:.0f} + {c['fields']['median']:.0f} ms | "
            f"{r['constrained_over_pcd']:.2f}x | {r['bound']:.2f}x | "
            f"{r['fields_budget_for_2x_ms']:.0f} ms |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
