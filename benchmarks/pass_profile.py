"""Per-layer profile of a scenario's cold prefill and its packed fields pass.

Issue 15, part 4: a small fields pass (fraud: 85 pack tokens) ran well under the rate the
prefill reaches. This finds where its time goes, part by part, against the prefill of the
same prompt:

- **uninstrumented**: the prefill and the fields pass as the engine runs them (its stream,
  its threads, its kernels), median and range over `--runs`;
- **per part**: the same two passes with every part of every layer evaluated and timed on
  its own (norms, q/k/v/o projections, RoPE, attention, SwiGLU, MLP projections, the
  residual adds as "rest"), plus the LM head and the host-side log-softmax of the fields
  pass. Each part's FLOPs (`pcd_tools.bench.flops`) give its GFLOP/s. Evaluating each
  part on its own adds one synchronisation per part, so the per-part total is a little
  above the uninstrumented time; the gap is reported.

Multi-chunk passes run their chunks on the stream workers at once; their per-part times
then add up both threads' time. Fraud and security_audit have one chunk.

Usage:
    python benchmarks/pass_profile.py --scenario fraud --runs 5
    python benchmarks/pass_profile.py --scenario fraud --scenario security_audit --json p.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

PARTS = (
    "input_layernorm",
    "q_proj",
    "k_proj",
    "v_proj",
    "rope",
    "attention",
    "o_proj",
    "post_attention_layernorm",
    "gate_proj",
    "up_proj",
    "swiglu",
    "down_proj",
    "rest",
)


class _Clock:
    """Sums the seconds spent per part, from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def add(self, name: str, dt: float) -> None:
        with self.lock:
            self.seconds[name] += dt
            self.calls[name] += 1


def _timed(clock: _Clock, name: str, fn: Any) -> Any:
    import mlx.core as mx

    def call(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        mx.eval(out)
        clock.add(name, time.perf_counter() - t0)
        return out

    return call


class _Instrumented:
    """Wraps a model's layer parts with timers while inside the `with` block."""

    def __init__(self, model: Any, clock: _Clock) -> None:
        self.model, self.clock = model, clock
        self.undo: list[Any] = []

    def __enter__(self) -> _Instrumented:
        import mlx.core as mx
        import mlx.nn as nn

        clock = self.clock

        class Part(nn.Module):
            def __init__(self, inner: Any, name: str) -> None:
                super().__init__()
                self.inner, self.part = inner, name

            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                out = self.inner(*args, **kwargs)
                mx.eval(out)
                clock.add(self.part, time.perf_counter() - t0)
                return out

        layers = self.model.model.layers
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            for owner, names in (
                (layer, ("input_layernorm", "post_attention_layernorm")),
                (attn, ("q_proj", "k_proj", "v_proj", "o_proj", "rope")),
                (mlp, ("gate_proj", "up_proj", "down_proj")),
            ):
                for n in names:
                    inner = getattr(owner, n)
                    setattr(owner, n, Part(inner, n))
                    self.undo.append((owner, n, inner))
        # the attention and SwiGLU functions the layer modules call
        module = sys.modules[type(layers[0].self_attn).__module__]
        for attr, name in (("scaled_dot_product_attention", "attention"), ("swiglu", "swiglu")):
            fn = getattr(module, attr)
            setattr(module, attr, _timed(clock, name, fn))
            self.undo.append((module, attr, fn))
        # whole layers, for the rest (residual adds, reshapes, the K/V concatenation)
        cls = type(layers[0])
        original = cls.__call__

        def layer_call(this: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = original(this, *args, **kwargs)
            mx.eval(out)
            clock.add("layer", time.perf_counter() - t0)
            return out

        cls.__call__ = layer_call
        self.undo.append((cls, "__call__", original))
        return self

    def __exit__(self, *exc: Any) -> None:
        for owner, name, value in reversed(self.undo):
            setattr(owner, name, value)


def _part_flops(model: Any, tokens: int, pairs: float) -> dict[str, float]:
    """FLOPs per part, summed over layers, for `tokens` queries and `pairs` query-key
    pairs per layer (`engine.flops`' arithmetic, split by part)."""
    from pcd_tools.bench.flops import arithmetic, linear_flops

    ar = arithmetic(model)
    assert ar is not None  # checked by the caller
    out: dict[str, float] = defaultdict(float)
    for layer in model.model.layers:
        for owner, names in (
            (layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
            (layer.mlp, ("gate_proj", "up_proj", "down_proj")),
        ):
            for n in names:
                out[n] += tokens * linear_flops(getattr(owner, n))
    out["attention"] = ar.attention_per_pair * pairs
    return out


def profile(decider: Any, scenario: Any, runs: int) -> dict[str, Any]:
    import mlx.core as mx
    import numpy as np

    from pcd_tools.bench.flops import arithmetic
    from pcd_tools.engine.passes.forward import chunk_edges
    from pcd_tools.schema import compile_schema

    engine = decider.engine
    compiled = compile_schema(scenario.schema)
    plan = engine.plan(compiled)
    decider.decide(compiled, scenario.context)  # warm kernels and caches
    ids = plan.head_ids + engine.encode_ids(scenario.context) + plan.tail_ids
    prompt = len(ids)
    ar = arithmetic(engine.passes.model)
    if ar is None:
        raise SystemExit("this model's arithmetic is unknown (not a llama-like layout)")
    model = engine.passes.model
    pack = sum(len(c.tokens) for c in plan.chunks)
    slots = sum(len(c.slots) for c in plan.chunks)
    allowed = sum(int(np.count_nonzero(c.allow)) for c in plan.chunks)

    def prefill() -> Any:
        return engine._parallel([lambda: engine.passes.prefill([ids], None)])[0]

    def fields(kv: Any) -> Any:
        return engine._fields_pass(plan, kv, [prompt], "packed")

    plain: dict[str, list[float]] = {"prefill": [], "fields": []}
    kv = None
    for _ in range(runs):
        t0 = time.perf_counter()
        kv = prefill()
        t1 = time.perf_counter()
        fields(kv)
        t2 = time.perf_counter()
        plain["prefill"].append((t1 - t0) * 1e3)
        plain["fields"].append((t2 - t1) * 1e3)

    # the fields pass's head and host work, timed on their own
    head_ms: list[float] = []
    host_ms: list[float] = []
    ch = plan.chunks[0]
    for _ in range(runs):
        hidden = mx.random.normal((1, len(ch.tokens), model.model.args.hidden_size))
        mx.eval(hidden)
        t0 = time.perf_counter()
        logits = engine.passes.logits_at(hidden, slice(None), mx.array(ch.slots))
        mx.eval(logits)
        t1 = time.perf_counter()
        chunk_edges(plan, ch, np.asarray(logits))
        t2 = time.perf_counter()
        head_ms.append((t1 - t0) * 1e3)
        host_ms.append((t2 - t1) * 1e3)

    parts: dict[str, dict[str, list[float]]] = {
        "prefill": defaultdict(list),
        "fields": defaultdict(list),
    }
    for _ in range(runs):
        for phase in ("prefill", "fields"):
            clock = _Clock()
            with _Instrumented(model, clock):
                if phase == "prefill":
                    t0 = time.perf_counter()
                    kv = prefill()
                else:
                    t0 = time.perf_counter()
                    fields(kv)
                total = time.perf_counter() - t0
            named = sum(v for k, v in clock.seconds.items() if k in PARTS)
            clock.seconds["rest"] = clock.seconds["layer"] - named
            for k in PARTS:
                parts[phase][k].append(clock.seconds[k] * 1e3)
            parts[phase]["layers"].append(clock.seconds["layer"] * 1e3)
            parts[phase]["total"].append(total * 1e3)

    flops = {
        "prefill": _part_flops(model, prompt, prompt * (prompt + 1) / 2),
        "fields": _part_flops(model, pack, pack * prompt + allowed),
    }
    whole = {"prefill": ar.prefill(prompt), "fields": ar.packed(plan.chunks, prompt)}

    def med(xs: list[float]) -> dict[str, float]:
        return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}

    result: dict[str, Any] = {
        "scenario": scenario.name,
        "prompt_tokens": prompt,
        "pack_tokens": pack,
        "chunks": len(plan.chunks),
        "slots": slots,
        "gflop": {k: v / 1e9 for k, v in whole.items()},
        "uninstrumented_ms": {k: med(v) for k, v in plain.items()},
        "head_ms": med(head_ms),
        "host_ms": med(host_ms),
        "parts": {},
    }
    for phase in ("prefill", "fields"):
        result["parts"][phase] = {}
        for k in (*PARTS, "layers", "total"):
            m = statistics.median(parts[phase][k])
            f = flops[phase].get(k, 0.0)
            result["parts"][phase][k] = {
                "ms": m,
                "gflop": f / 1e9,
                "gflops_per_s": (f / 1e6 / m) if f and m > 0 else None,
            }
        u = result["uninstrumented_ms"][phase]["median"]
        result[f"{phase}_gflops_per_s"] = whole[phase] / 1e6 / u
    result["fields_vs_prefill_rate"] = (
        result["fields_gflops_per_s"] / result["prefill_gflops_per_s"]
    )
    return result


def _print(r: dict[str, Any]) -> None:
    u = r["uninstrumented_ms"]
    print(
        f"\n{r['scenario']}: prompt {r['prompt_tokens']} tokens, pack {r['pack_tokens']} tokens "
        f"in {r['chunks']} chunk(s), {r['slots']} scored positions"
    )
    for phase in ("prefill", "fields"):
        x = u[phase]
        print(
            f"  {phase}: {x['median']:.1f} ms ({x['min']:.1f}-{x['max']:.1f}), "
            f"{r['gflop'][phase]:.1f} GFLOP, {r[phase + '_gflops_per_s']:.1f} GFLOP/s"
        )
    print(f"  fields rate / prefill rate: {r['fields_vs_prefill_rate']:.2f}")
    print(
        f"  fields pass LM head (alone): {r['head_ms']['median']:.1f} ms; "
        f"host log-softmax and edges: {r['host_ms']['median']:.1f} ms"
    )
    print("\n| part (30 layers) | prefill ms | prefill GFLOP/s | fields ms | fields GFLOP/s |")
    print("|---|---|---|---|---|")
    for k in (*PARTS, "layers", "total"):
        p, f = r["parts"]["prefill"][k], r["parts"]["fields"][k]

        def rate(x: dict[str, Any]) -> str:
            return "-" if x["gflops_per_s"] is None else f"{x['gflops_per_s']:.0f}"

        print(f"| {k} | {p['ms']:.1f} | {rate(p)} | {f['ms']:.1f} | {rate(f)} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", action="append", default=None)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args()

    from pcd_tools import Decider
    from pcd_tools.bench.run import load_scenarios
    from pcd_tools.engine.host.blas import blas_status

    scenarios = load_scenarios(Path(__file__).parent / "scenarios")
    decider = Decider.load()
    print(blas_status(measure=True))
    results = [profile(decider, scenarios[s], args.runs) for s in args.scenario or ["fraud"]]
    for r in results:
        _print(r)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
