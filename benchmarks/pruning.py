"""Certified pruned scoring against the exhaustive pass, side by side in one run.

For each dataset (a built-in one from `../shared/data`, or `tariff`, the benchmark
scenario's contexts), the same items are decided twice per batch, pruned
(`pruning="on"`) and whole (`pruning="off"`), in alternating order so that the machine's
load falls on both. It reports:

- how often the answers are identical, and the certified share;
- whether the exhaustive answer's probability lies inside the pruned field's
  `probability_bounds` (every time, to 1e-4 for float32 passes);
- the accuracy of both on the labelled datasets;
- the time of each, summed, and their ratio per batch: median and range.

Usage:

    python benchmarks/pruning.py --dataset banking77 --dataset clinc150 --dataset tariff \
        --n 300 --json benchmarks/results/pruning.json
    python benchmarks/pruning.py --dataset tariff --scoring constrained
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def items_of(name: str, n: int, seed: int, field: str | None) -> tuple[Any, list[str], list[Any]]:
    """(schema, texts, gold labels of the pruned field or None) for one dataset."""
    if name == "tariff":
        from benchmarks.scenarios import SCENARIOS

        sc = SCENARIOS["tariff"]
        texts = [sc.context, *sc.contexts]
        return sc.schema, (texts * (n // len(texts) + 1))[:n], [None] * n
    from pcd_tools.eval.datasets.builtin import load_dataset

    ds = load_dataset(name, fields=[field] if field else None)
    split = ds.eval_split.sample(n, seed)
    texts = [t for t, _ in split.examples]
    key = field or next(iter(split.examples[0][1]))
    return ds.schema, texts, [lab.get(key) for _, lab in split.examples]


def run(decider: Any, name: str, args: argparse.Namespace) -> dict[str, Any]:
    from pcd_tools.schema import compile_schema

    field = "intent" if name == "clinc150" else None
    schema, texts, gold = items_of(name, args.n, args.seed, field)
    compiled = compile_schema(schema)
    decider.decide_many(compiled, texts[:2], pruning="off", scoring=args.scoring)  # warm
    from pcd_tools.baselines.generation import constrained_json

    times: dict[str, list[float]] = {"on": [], "off": [], "generation": []}
    if args.baseline:
        constrained_json(decider, compiled, texts[0])  # builds the grammar index
    same = inside = certified = pruned_fields = 0
    worst = 0.0
    right = {"on": 0, "off": 0}
    for b, start in enumerate(range(0, len(texts), args.batch_size)):
        chunk = texts[start : start + args.batch_size]
        got = {}
        for mode in ("on", "off") if b % 2 == 0 else ("off", "on"):
            t0 = time.perf_counter()
            got[mode] = decider.decide_many(
                compiled, chunk, pruning=mode, scoring=args.scoring, batch_size=len(chunk)
            )
            times[mode].append(time.perf_counter() - t0)
        if args.baseline:  # grammar-constrained generation of the same items, warm
            t0 = time.perf_counter()
            for text in chunk:
                constrained_json(decider, compiled, text)
            times["generation"].append(time.perf_counter() - t0)
        for j, (p, w) in enumerate(zip(got["on"], got["off"])):
            same += p.value == w.value
            for fname, fp in p.fields.items():
                if fp.certified is None:
                    continue
                pruned_fields += 1
                certified += bool(fp.certified)
                lo, hi = fp.probability_bounds
                pw = w.fields[fname].probability
                inside += lo - 1e-4 <= pw <= hi + 1e-4
                worst = max(worst, lo - pw, pw - hi)
            g = gold[start + j]
            if g is not None:
                key = field or next(iter(p.fields))
                right["on"] += p.fields[key].label == g
                right["off"] += w.fields[key].label == g
    ratios = [a / b for a, b in zip(times["on"], times["off"])]
    n = len(texts)
    out = {
        "dataset": name,
        "n": n,
        "scoring": args.scoring,
        "batch_size": args.batch_size,
        "identical_answers": same / n,
        "pruned_fields": pruned_fields,
        "certified": certified / max(1, pruned_fields),
        "inside_bounds": inside / max(1, pruned_fields),
        "worst_bound_miss": worst,
        "pruned_s": sum(times["on"]),
        "exhaustive_s": sum(times["off"]),
        "time_ratio": sum(times["on"]) / sum(times["off"]),
        "batch_ratio_median": statistics.median(ratios),
        "batch_ratio_min": min(ratios),
        "batch_ratio_max": max(ratios),
    }
    if times["generation"]:
        gen = [a / b for a, b in zip(times["on"], times["generation"])]
        out["generation_s"] = sum(times["generation"])
        out["pruned_vs_generation"] = sum(times["on"]) / sum(times["generation"])
        out["pruned_vs_generation_median"] = statistics.median(gen)
        out["pruned_vs_generation_min"] = min(gen)
        out["pruned_vs_generation_max"] = max(gen)
    if gold[0] is not None:
        out["accuracy_pruned"] = right["on"] / n
        out["accuracy_exhaustive"] = right["off"] / n
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", action="append", default=[])
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--scoring", choices=["full", "constrained"], default="full")
    p.add_argument(
        "--baseline",
        action="store_true",
        help="also time grammar-constrained generation of every item (warm)",
    )
    p.add_argument("--json", default=None)
    args = p.parse_args()
    from pcd_tools import Decider

    decider = Decider.load()
    results = []
    for name in args.dataset or ["banking77", "clinc150", "tariff"]:
        r = run(decider, name, args)
        results.append(r)
        print(json.dumps(r), flush=True)
    print(
        "\n| dataset | n | identical | certified | inside bounds | accuracy pruned / whole "
        "| pruned / whole time: total, per batch median (range) |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        acc = (
            f"{r['accuracy_pruned']:.3f} / {r['accuracy_exhaustive']:.3f}"
            if "accuracy_pruned" in r
            else "-"
        )
        print(
            f"| {r['dataset']} | {r['n']} | {100 * r['identical_answers']:.1f}% | "
            f"{100 * r['certified']:.1f}% | {100 * r['inside_bounds']:.1f}% | {acc} | "
            f"{r['time_ratio']:.2f}x, {r['batch_ratio_median']:.2f}x "
            f"({r['batch_ratio_min']:.2f}-{r['batch_ratio_max']:.2f}) |"
        )
        if "pruned_vs_generation" in r:
            print(
                f"  {r['dataset']}: pruned / constrained generation "
                f"{r['pruned_vs_generation']:.2f}x, per batch "
                f"{r['pruned_vs_generation_median']:.2f}x "
                f"({r['pruned_vs_generation_min']:.2f}-{r['pruned_vs_generation_max']:.2f})"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
