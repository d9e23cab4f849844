"""Latency against number of fields, for PCD and greedy generation -> fields_scaling.png.

The schemas are the triage scenario's first N fields (N <= 28); 64 fields add 36 more,
copies of triage fields under new names. PCD is timed warm (schema prefix cached), and
greedy generation reuses its own cache of the schema part, so both sides prefill only
the ticket. Run from the repository root::

    python benchmarks/plot_fields.py                       # default sizes, 3 runs each
    python benchmarks/plot_fields.py --runs 5 --constrained --json fields.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SIZES = (1, 2, 4, 8, 16, 28, 64)


def triage_fields(n: int) -> Any:
    """A `StructuredSchema` with the first `n` triage fields (copies beyond 28)."""
    from pcd_tools import StructuredSchema
    from pcd_tools.bench.run import load_scenarios
    from pcd_tools.schema import compile_schema

    base = compile_schema(load_scenarios(HERE / "scenarios")["triage"].schema)
    spec: dict[str, Any] = {}
    k = 0
    while len(spec) < n:
        f = base.fields[k % len(base.fields)]
        name = f.name if k < len(base.fields) else f"{f.name}_{k // len(base.fields) + 1}"
        entry: dict[str, Any] = {"type": f.kind, "description": f.description}
        if f.kind == "enum":
            entry["choices"] = list(f.labels)
        spec[name] = entry
        k += 1
    return StructuredSchema(spec, name="SupportTriage", instructions=base.instructions)


def measure(
    decider: Any, sizes: tuple[int, ...], runs: int, constrained: bool
) -> list[dict[str, Any]]:
    from pcd_tools.baselines.generation import constrained_json, greedy_json
    from pcd_tools.bench.run import load_scenarios

    ctx = load_scenarios(HERE / "scenarios")["triage"].context
    rows = []
    for n in sizes:
        schema = triage_fields(n)
        decider.decide(schema, ctx)  # warm-up: plan and prefix cache
        greedy_json(decider, schema, ctx)
        pcd, greedy, tokens, cons, ctoks = [], [], [], [], []
        for _ in range(runs):
            pcd.append(decider.decide(schema, ctx).elapsed_ms)
            g = greedy_json(decider, schema, ctx)
            greedy.append(g.wall_ms)
            tokens.append(g.tokens)
            if constrained:
                c = constrained_json(decider, schema, ctx)
                cons.append(c.wall_ms)
                ctoks.append(c.tokens)
        row = {
            "fields": n,
            "pcd_ms": statistics.median(pcd),
            "greedy_ms": statistics.median(greedy),
            "greedy_tokens": int(statistics.median(tokens)),
        }
        if constrained:
            row["constrained_ms"] = statistics.median(cons)
            row["constrained_tokens"] = int(statistics.median(ctoks))
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def plot(rows: list[dict[str, Any]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r["fields"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(n, [r["greedy_ms"] / 1e3 for r in rows], "o-", label="greedy autoregressive")
    for r in rows:
        ax.annotate(
            f"{r['greedy_tokens']} tok",
            (r["fields"], r["greedy_ms"] / 1e3),
            textcoords="offset points",
            xytext=(4, 4),
            fontsize=7,
        )
    if "constrained_ms" in rows[0]:
        ax.plot(n, [r["constrained_ms"] / 1e3 for r in rows], "s--", label="grammar-constrained")
    ax.plot(n, [r["pcd_ms"] / 1e3 for r in rows], "o-", label="PCD (one packed pass)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(n, [str(x) for x in n])
    ax.set_xlabel("fields in the schema")
    ax.set_ylabel("latency per request (s, median)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--sizes", default=",".join(map(str, SIZES)))
    p.add_argument("--model", default=None)
    p.add_argument("--constrained", action="store_true", help="also time constrained decoding")
    p.add_argument("--json", default=None, help="also write the measurements to this file")
    p.add_argument("--out", default=str(HERE / "fields_scaling.png"))
    p.add_argument("--from-json", default=None, help="re-plot saved measurements")
    a = p.parse_args(argv)
    from pcd_tools import Decider

    if a.from_json:
        data = json.loads(Path(a.from_json).read_text())
        rows, title = data["rows"], data["title"]
    else:
        decider = Decider.load(a.model)
        sizes = tuple(int(s) for s in a.sizes.split(","))
        rows = measure(decider, sizes, a.runs, a.constrained)
        title = f"{decider.model_id} ({decider.device}, {decider.loaded.dtype}); ticket context"
        if a.json:
            Path(a.json).write_text(json.dumps({"title": title, "rows": rows}, indent=2))
    plot(rows, Path(a.out), title)
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
