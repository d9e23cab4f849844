"""Label sets at scale: ranked multi-label fields, and single-choice fields up to 50,000.

Two tables, one model per run (the embedded SmolLM2-135M or a GGUF file):

1. **ranked**: messages naming two regions, decided over a multi-label field of 255
   and of 5,010 ISO 3166-2 subdivisions ("Name, Country"; past 255 a multi-label field
   is read ranked, `pcd_tools.answers.ranked`; the 255 field is read ranked too, so the
   two differ in size only), warm, interleaved round by round: time, the ratio, the
   certified share, positions read, how many gold regions were chosen, and (on the 255
   field, every context) agreement with the exhaustive pass (`pruning="off"`).
2. **sizes**: one single-choice field over 255, 5,010 and 50,100 labels (the regions,
   then each region with one of ten kinds of site: "Bayern, Germany - warehouse"): the
   schema's compile and trie build time, the trie's positions and bytes, peak RSS, and
   the warm decision (certified pruned search) per size.

Usage (the runs of docs/labels-benchmarks.md):

    python benchmarks/labels_scale.py --model embedded --rounds 3 --json scale-135m.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.labels import fmt, load, med_range, one, region_labels, subset, vm

PAIRS = [
    ("Our offices in Munich, Bavaria and in Barcelona, Catalonia close early on Friday.",
     ["Bayern, Germany", "Catalunya [Cataluña], Spain"]),
    ("We ship from Toronto, Ontario and from Vancouver, British Columbia.",
     ["Ontario, Canada", "British Columbia, Canada"]),
    ("The tour visits Sydney, New South Wales, then Melbourne, Victoria.",
     ["New South Wales, Australia", "Victoria, Australia"]),
    ("Customers in Sacramento, California and in Austin, Texas reported the outage.",
     ["California, United States", "Texas, United States"]),
    ("Warehouses in Kochi, Kerala and in Chennai, Tamil Nadu are full.",
     ["Kerala, India", "Tamil Nādu, India"]),
    ("Stores in Guadalajara, Jalisco and Monterrey, Nuevo León open on Monday.",
     ["Jalisco, Mexico", "Nuevo León, Mexico"]),
]  # fmt: skip
KINDS = ["office", "warehouse", "store", "factory", "depot", "lab", "clinic", "school",
         "hotel", "farm"]  # fmt: skip


def ranked_model(values: list[str], name: str) -> Any:
    from typing import Literal

    from pydantic import Field, create_model

    return create_model(
        name,
        regions=(
            list[Literal[tuple(values)]],  # type: ignore[valid-type]
            Field(
                description="The states, provinces or regions the message names",
                json_schema_extra={"reading": "ranked"},
            ),
        ),
    )


def ranked_table(decider: Any, args: argparse.Namespace) -> dict[str, Any]:
    from pcd_tools.schema import compile_schema

    allv = region_labels()
    gold = [g for _, gs in PAIRS for g in gs]
    cases = {
        "small": compile_schema(ranked_model(subset(allv, gold, 255), "Regions255")),
        "large": compile_schema(ranked_model(allv, f"Regions{len(allv)}")),
    }
    ctxs = PAIRS[: args.contexts]
    for s in cases.values():
        one(decider, s, ctxs[0][0])  # builds the trie and the prefix cache
    rec: dict[str, list[dict[str, Any]]] = {k: [] for k in cases}
    for r in range(args.rounds):
        for i, (ctx, gs) in enumerate(ctxs):
            for k in ("small", "large") if (r + i) % 2 == 0 else ("large", "small"):
                ms, d = one(decider, cases[k], ctx)
                f = d.fields["regions"]
                rec[k].append(
                    {
                        "context": i,
                        "ms": ms,
                        "value": f.label,
                        "gold_chosen": sum(g in f.label for g in gs),
                        "probability": f.probability,
                        "certified": f.certified,
                        "read": f.search.read if f.search else None,
                        "positions": f.search.positions if f.search else None,
                        "fallback": f.search.fallback if f.search else None,
                    }
                )
    out: dict[str, Any] = {"labels": {k: len(s.fields[0].choices) for k, s in cases.items()}}
    for k, rows in rec.items():
        out[k] = {
            "ms": med_range([x["ms"] for x in rows]),
            "certified": sum(bool(x["certified"]) for x in rows) / len(rows),
            "fallbacks": sum(bool(x["fallback"]) for x in rows),
            "gold_chosen": sum(x["gold_chosen"] for x in rows) / (2 * len(rows)),
            "read": med_range([x["read"] or 0 for x in rows]),
            "positions": rows[0]["positions"],
            "rows": rows,
        }
    out["ratio"] = med_range([b["ms"] / a["ms"] for a, b in zip(rec["small"], rec["large"])])
    same = []
    for i, (ctx, _) in enumerate(ctxs):
        ms, d = one(decider, cases["small"], ctx, pruning="off")
        pruned = next(x for x in rec["small"] if x["context"] == i)
        same.append({"context": i, "ms": ms, "same": d.fields["regions"].label == pruned["value"]})
    out["exhaustive_small"] = same
    return out


def size_labels() -> dict[str, list[str]]:
    allv = region_labels()
    return {
        "255": subset(allv, [], 255),
        str(len(allv)): allv,
        str(len(allv) * len(KINDS)): [f"{v} - {k}" for v in allv for k in KINDS],
    }


def sizes_table(decider: Any, args: argparse.Namespace) -> dict[str, Any]:
    from typing import Literal

    from pydantic import Field, create_model

    from pcd_tools.schema import compile_schema

    out: dict[str, Any] = {}
    ctxs = [c for c, _ in PAIRS[: args.contexts]]
    for n, values in size_labels().items():
        t0 = time.perf_counter()
        model = create_model(
            f"Site{n}",
            site=(Literal[tuple(values)], Field(description="The site the message is about")),
        )
        schema = compile_schema(model)
        compile_ms = (time.perf_counter() - t0) * 1e3
        tracemalloc.start()
        t0 = time.perf_counter()
        plan = decider.engine.plan(schema)
        plan_ms = (time.perf_counter() - t0) * 1e3
        trie_bytes = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        first_ms, _ = one(decider, schema, ctxs[0])
        rows = []
        for _ in range(args.rounds):
            for ctx in ctxs:
                ms, d = one(decider, schema, ctx)
                f = d.fields["site"]
                rows.append(
                    {"ms": ms, "certified": f.certified, "read": f.search.read if f.search else 0}
                )
        out[n] = {
            "labels": len(values),
            "compile_ms": compile_ms,
            "plan_ms": plan_ms,
            "plan_peak_bytes": trie_bytes,
            "positions": plan.tries[0].n_nodes,
            "first_ms": first_ms,
            "ms": med_range([r["ms"] for r in rows]),
            "certified": sum(bool(r["certified"]) for r in rows) / len(rows),
            "read": med_range([r["read"] for r in rows]),
            "rss_mib_after": vm("VmRSS") / 1024,
            "peak_rss_mib": vm("VmHWM") / 1024,
        }
        print(f"  {n} labels: {_size_line(out[n])}", flush=True)
    return out


def _size_line(s: dict[str, Any]) -> str:
    return (
        f"compile {s['compile_ms']:.0f} ms, plan {s['plan_ms']:.0f} ms "
        f"({s['plan_peak_bytes'] / 2**20:.1f} MiB traced), {s['positions']:,} positions, "
        f"warm {fmt(s['ms'], ' ms')}, certified {s['certified']:.0%}, read {fmt(s['read'])}, "
        f"RSS {s['rss_mib_after']:.0f} MiB (peak {s['peak_rss_mib']:.0f})"
    )


def print_ranked(t: dict[str, Any]) -> None:
    print("\nRanked multi-label field (two regions a message), warm:")
    for k in ("small", "large"):
        s = t[k]
        print(
            f"  {t['labels'][k]:>5} labels: {fmt(s['ms'], ' ms')}, certified {s['certified']:.0%}"
            f" ({s['fallbacks']} fallbacks), gold regions chosen {s['gold_chosen']:.0%}, "
            f"read {fmt(s['read'])} of {s['positions']:,}"
        )
    print(f"  large / small: {fmt(t['ratio'], 'x', 2)}")
    same = sum(x["same"] for x in t["exhaustive_small"])
    print(f"  255 labels, pruned = exhaustive: {same}/{len(t['exhaustive_small'])}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="embedded")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--contexts", type=int, default=len(PAIRS))
    p.add_argument("--only", action="append", choices=["ranked", "sizes"])
    p.add_argument("--json", default=None)
    args = p.parse_args()
    only = set(args.only or ["ranked", "sizes"])
    decider = load(args.model)
    out: dict[str, Any] = {
        "model": args.model,
        "model_id": decider.model_id,
        "date": dt.date.today().isoformat(),
        "args": vars(args),
    }
    if "ranked" in only:
        out["ranked"] = ranked_table(decider, args)
        print_ranked(out["ranked"])
    if "sizes" in only:
        print("\nSingle-choice fields by size:")
        out["sizes"] = sizes_table(decider, args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
