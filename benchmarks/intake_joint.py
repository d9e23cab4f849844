"""The intake scenario's joint pass against a flat pass of the same fields.

`SupportIntake` scores `category` x `subcategory` jointly, the union's branches after
their `kind`, the tags label by label, and `team` in a second wave; `FlatIntake` has the
same fields with none of the structure (every subcategory and team allowed, the union's
fields side by side), in one pass. Both are timed warm (schema prefix cached): the whole
decision, and the first pass alone (`first_pass_ms`, the engine call without the wave).

    python benchmarks/intake_joint.py --runs 5 --json intake_joint.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _time(decider, schema, context, runs):
    from pcd_tools.schema import compile_schema

    decider.decide(schema, context)  # warm-up: plans, prefix cache
    rows = [decider.decide(schema, context) for _ in range(runs)]
    pick = lambda key: [getattr(d, key) for d in rows]  # noqa: E731
    out = {}
    for key in ("elapsed_ms", "prefill_ms", "suffix_eval_ms"):
        xs = pick(key)
        out[key] = statistics.median(xs)
        out[key + "_range"] = [min(xs), max(xs)]
    out["passes"] = rows[-1].sequential_forward_passes
    out["answer"] = {k: f.label for k, f in rows[-1].fields.items()}
    # the first pass alone (no later wave): the engine call `decide` starts with
    first = [decider.scores(schema, [context]).suffix_eval_ms for _ in range(runs)]
    out["first_pass_ms"] = statistics.median(first)
    out["first_pass_ms_range"] = [min(first), max(first)]
    plan = decider.engine.plan(compile_schema(schema))
    out["first_pass_tokens"] = sum(len(c.tokens) for c in plan.chunks)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE.parent))
    from benchmarks.scenarios import intake
    from pcd_tools import Decider

    decider = Decider.load()
    joint = _time(decider, intake.SCHEMA, intake.CONTEXT, args.runs)
    flat = _time(decider, intake.FLAT_SCHEMA, intake.CONTEXT, args.runs)
    res = {
        "model": decider.model_id,
        "runs": args.runs,
        "joint": joint,
        "flat": flat,
        "first_pass_ratio": joint["first_pass_ms"] / flat["first_pass_ms"],
        "first_pass_tokens_ratio": joint["first_pass_tokens"] / flat["first_pass_tokens"],
        "fields_pass_ratio": joint["suffix_eval_ms"] / flat["suffix_eval_ms"],
        "elapsed_ratio": joint["elapsed_ms"] / flat["elapsed_ms"],
    }
    text = json.dumps(res, indent=2, default=str)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
