"""What examples in the cached prefix cost a warm request, in arithmetic.

A warm request re-prefills only its context (after the cached schema part) and runs the
fields pass; both attend to the whole prefix, so examples make every one of those tokens
attend to more keys. This prints, per dataset, the prefix length with K shots (the same
draw as `pcd eval --label-free-grid`) and the FLOPs of a warm request over its FLOPs
without examples (`engine.flops`), median over the first `--texts` evaluation items:
the part of the measured warm ratio that is arithmetic, not overhead.

Usage:
    python scripts/shots_cost.py banking77 clinc150 nlupp mams sst2 sms_spam --shots 8
"""

from __future__ import annotations

import argparse
import statistics


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("datasets", nargs="+")
    p.add_argument("--shots", type=int, default=8)
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shots-seed", type=int, default=1)
    p.add_argument("--texts", type=int, default=8)
    args = p.parse_args()

    from pcd_tools import Decider
    from pcd_tools.bench.flops import arithmetic
    from pcd_tools.eval.datasets.builtin import load_dataset
    from pcd_tools.eval.shots import draw_shots
    from pcd_tools.schema import compile_schema, with_examples

    decider = Decider.load()
    engine = decider.engine
    arith = arithmetic(decider.loaded.model)
    if arith is None:
        raise SystemExit("this model's shapes are not counted by engine.flops")
    print("| dataset | prefix tokens, 0 shots | prefix tokens, K shots | warm FLOPs, K shots / 0 |")
    print("|---|---|---|---|")
    for name in args.datasets:
        ds = load_dataset(name)
        compiled = compile_schema(ds.schema)
        ev = ds.eval_sample(args.n, args.seed)
        draw = draw_shots(ds, args.shots, seed=args.shots_seed, eval_ids=ev.ids)
        plans = [
            engine.plan(compiled),
            engine.plan(with_examples(compiled, draw.examples, "the drawn shots")),
        ]

        def warm(plan, ctx: list[int]) -> float:
            new = len(ctx) + len(plan.tail_ids)
            prompt = len(plan.head_ids) + new
            return arith.prefill(new, cached=len(plan.head_ids)) + arith.packed(plan.chunks, prompt)

        ratios = []
        for text, _ in ev.examples[: args.texts]:
            ctx = engine.encode_ids(text)
            ratios.append(warm(plans[1], ctx) / warm(plans[0], ctx))
        print(
            f"| {name} | {len(plans[0].head_ids):,} | {len(plans[1].head_ids):,} | "
            f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |"
        )


if __name__ == "__main__":
    main()
