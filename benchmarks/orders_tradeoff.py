"""What `decide(..., orders=k)` buys and costs: accuracy and latency for k = 1, 2, 4.

Runs on the labelled data in `../shared/data` (fixed-seed stratified samples) with the
embedded model by default, and prints a markdown table. Each k runs on the same items
after a warm-up, so the schema prefixes of every rotation are cached, as in a server.

    .venv/bin/python benchmarks/orders_tradeoff.py --n 100 --datasets sst2 clinc150:domain
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pcd_tools import Decider
from pcd_tools.eval.datasets import label_index, load_dataset
from pcd_tools.schema import compile_schema


def measure(decider: Decider, spec: str, n: int, seed: int, ks: list[int]) -> list[dict]:
    name, _, field = spec.partition(":")
    ds = load_dataset(name, fields=[field] if field else None)
    sample = ds.eval_sample(n, seed)
    schema = compile_schema(ds.schema)
    texts = [t for t, _ in sample.examples]
    rows = []
    for k in ks:
        decider.decide_many(schema, texts[:2], orders=k)  # warm the k prefixes
        t0 = time.perf_counter()
        ds_k = decider.decide_many(schema, texts, orders=k, batch_size=8)
        ms = (time.perf_counter() - t0) * 1e3 / len(texts)
        for f in schema.fields:
            gold = [(i, lab[f.name]) for i, (_, lab) in enumerate(sample.examples) if f.name in lab]
            hits = [
                ds_k[i].fields[f.name].label == f.choices[label_index(f, g)].label for i, g in gold
            ]
            flips = [ds_k[i].fields[f.name].flip_rate or 0.0 for i, _ in gold]
            rows.append(
                {
                    "data": f"{name} `{f.name}`",
                    "k": k,
                    "n": len(gold),
                    "accuracy": float(np.mean(hits)),
                    "flip_rate": float(np.mean(flips)),
                    "ms_per_item": ms,
                }
            )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--n", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--orders", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--datasets", nargs="+", default=["sst2", "clinc150:domain"])
    args = p.parse_args()
    decider = Decider.load(args.model)
    print(f"model {decider.model_id}, n={args.n}, seed={args.seed}")
    print("| data | k | n | accuracy | mean flip rate | ms / item |")
    print("|---|---|---|---|---|---|")
    for spec in args.datasets:
        for r in measure(decider, spec, args.n, args.seed, args.orders):
            print(
                f"| {r['data']} | {r['k']} | {r['n']} | {r['accuracy']:.2f} | "
                f"{r['flip_rate']:.2f} | {r['ms_per_item']:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
