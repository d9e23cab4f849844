"""PCD's cold prefill against llama.cpp's prompt evaluation, on the same tokens.

Issue 31 item 3: each compute mode's prefill rate against the CPU's peak for that
arithmetic, and against llama.cpp's prompt rate on the same prompt.

For each scenario (`--scenario`, default fraud and triage) the prompt is PCD's exact
bare-prefill prompt for it (schema head + context + tail, as `pcd bench`'s "bare
prefill"), as token ids. Each round times, in rotating order:

- **PCD, per compute mode** (`--modes`, default `auto,float32`): one plain prefill of those
  ids into a fresh KV cache, last position's logits evaluated (`baselines.generation.
  bare_prefill_ms`, no prefix cache);
- **llama.cpp** on the same GGUF file (`llama_cpp.Llama.eval` of the same ids after
  `reset()`, `n_batch` 512, the same thread count; skipped with a note without the `peer`
  extra).

Rates are `engine.flops` FLOPs (linear maps + causal attention; the head on the last
position) over the wall time. The **peak** column is this CPU's register-only rate for the
arithmetic a mode runs, measured in the same process by a small native probe (asm, no
loads, 8 independent accumulators): float32 `vfmadd231ps`; int8 on AVX2 `vpmaddubsw + vpmaddwd +
vpaddd` (what the K-quant kernels spend per 32 multiply-adds); AVX-VNNI / AVX-512 VNNI
`vpdpbusd`. A multiply-add counts as 2 operations, as in the FLOP counts, and the peak is
per thread times the threads used.

Usage:
    python benchmarks/prefill.py --model qwen2.5-coder-1.5b --rounds 3 --json out.json
    python benchmarks/prefill.py --from-json out.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pcd_tools.engine.host.threads import thread_budget

PROBE = r"""
#include <time.h>
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
#if defined(__x86_64__)
/* Written in asm so that no compiler folds the identical products of the chains: 8
 * independent accumulators, n iterations of 8 steps each. */
#define STEPS8(OP) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11)
#define S_(x) #x
#define S(x) S_(x)
#define FMA(k) "vfmadd231ps %%ymm12, %%ymm13, %%ymm" S(k) "\n\t"
#define I8(k) "vpmaddubsw %%ymm13, %%ymm12, %%ymm0\n\tvpmaddwd %%ymm14, %%ymm0, %%ymm0\n\tvpaddd %%ymm0, %%ymm" S(k) ", %%ymm" S(k) "\n\t"
#define VNNI(k) "%{vex%} vpdpbusd %%ymm13, %%ymm12, %%ymm" S(k) "\n\t"
#define Z(k) "vpdpbusd %%zmm13, %%zmm12, %%zmm" S(k) "\n\t"
#define LOOP(BODY)                                                                   \
    __asm__ volatile("vpxor %%xmm12, %%xmm12, %%xmm12\n\tvpxor %%xmm13, %%xmm13, %%xmm13\n\t" \
                     "vpxor %%xmm14, %%xmm14, %%xmm14\n\t"                                 \
                     "1:\n\t" STEPS8(BODY) "dec %0\n\tjnz 1b\n\t"                          \
                     : "+r"(n)::"ymm0", "ymm4", "ymm5", "ymm6", "ymm7", "ymm8", "ymm9", \
                       "ymm10", "ymm11", "ymm12", "ymm13", "ymm14", "cc")
__attribute__((target("avx2,fma"))) static double fma_rate(long n) {
    long k = n; double t = now(); LOOP(FMA); return k * 8.0 * 8.0 / (now() - t);
}
__attribute__((target("avx2"))) static double avx2_int8_rate(long n) {
    long k = n; double t = now(); LOOP(I8); return k * 8.0 * 32.0 / (now() - t);
}
__attribute__((target("avx2,avxvnni"))) static double avxvnni_rate(long n) {
    long k = n; double t = now(); LOOP(VNNI); return k * 8.0 * 32.0 / (now() - t);
}
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static double avx512vnni_rate(long n) {
    long k = n; double t = now(); LOOP(Z); return k * 8.0 * 64.0 / (now() - t);
}
/* multiply-adds per second of one thread: 0 fma (8 lanes), 1 AVX2 int8 (32 per
 * maddubs + madd + add), 2 AVX-VNNI vpdpbusd ymm (32), 3 AVX-512 VNNI vpdpbusd zmm (64) */
double pcd_peak_macs(int kind, long n) {
    switch (kind) {
    case 0: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? fma_rate(n) : 0;
    case 1: return __builtin_cpu_supports("avx2") ? avx2_int8_rate(n) : 0;
    case 2: return __builtin_cpu_supports("avxvnni") ? avxvnni_rate(n) : 0;
    case 3: return __builtin_cpu_supports("avx512vnni") ? avx512vnni_rate(n) : 0;
    }
    return 0;
}
#else
double pcd_peak_macs(int kind, long n) { (void)kind; (void)n; return 0; }
#endif
"""

PEAK_KINDS = {"fma": 0, "avx2-int8": 1, "avxvnni": 2, "avx512vnni": 3}


def peaks(rounds: int = 5) -> dict[str, float]:
    """This CPU's register-only multiply-add rates per thread (best of `rounds`), G op/s
    (2 operations per multiply-add); 0 where the CPU lacks the instructions."""
    import tempfile

    from pcd_tools.engine.host.build import compile_c

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "prefill_probe.c"
        src.write_text(PROBE)
        path, _ = compile_c(src, "prefill_probe", flags=("-O2",))
    lib = ctypes.CDLL(str(path))
    lib.pcd_peak_macs.argtypes = [ctypes.c_int, ctypes.c_long]
    lib.pcd_peak_macs.restype = ctypes.c_double
    out = {}
    for name, kind in PEAK_KINDS.items():
        out[name] = max(lib.pcd_peak_macs(kind, 20_000_000) for _ in range(rounds)) * 2 / 1e9
    return out


def mode_peak(pk: dict[str, float], isa: str | None, mode: str) -> tuple[str, float]:
    """The arithmetic a compute mode runs on this CPU and its register-only peak."""
    if mode == "int8":
        for name in ("avx512vnni", "avxvnni", "avx2-int8"):
            if pk.get(name) and (isa or "").startswith(name.split("-")[0]):
                return name, pk[name]
        return "avx2-int8", pk.get("avx2-int8", 0.0)
    return "fma", pk.get("fma", 0.0)


def _stats(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pcd_tools import Decider
    from pcd_tools.baselines.generation import bare_prefill_ms
    from pcd_tools.baselines.llama_cpp import settle
    from pcd_tools.bench import flops
    from pcd_tools.bench.scenarios import load_scenarios
    from pcd_tools.engine.kernels import qgemm
    from pcd_tools.schema import compile_schema

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from model_size import model_file

    path = Path(args.model) if Path(args.model).exists() else model_file(args.model)
    if path is None:
        raise SystemExit(f"no model {args.model!r}: a GGUF path, or one of 0.5b, 1.5b")
    threads = args.threads or thread_budget()
    scen = load_scenarios()
    deciders = {m: Decider.load(str(path), compute=m) for m in args.modes}
    first = next(iter(deciders.values()))
    ar = flops.arithmetic(first.loaded.model)
    llama = None
    peer_note = None
    try:
        if args.no_peer:
            raise ImportError("--no-peer")
        import llama_cpp

        llama = llama_cpp.Llama(
            model_path=str(path), n_ctx=4096, n_threads=threads, n_threads_batch=threads,
            n_batch=512, logits_all=False, verbose=False,
        )  # fmt: skip
    except ImportError as e:
        peer_note = f"llama.cpp skipped: {e} (pip install 'pcd-tools[peer]')"
        print(peer_note, flush=True)
    pk = peaks()
    out: dict[str, Any] = {
        "model": path.name,
        "threads": threads,
        "machine": {"cpu": platform.processor() or platform.machine(), "isa": qgemm.isa()},
        "peaks_gops_per_thread": pk,
        "modes": {m: d.loaded.compute for m, d in deciders.items()},
        "peer": peer_note,
        "scenarios": {},
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    for name in args.scenario:
        sc = scen[name]
        schema = compile_schema(sc.schema)
        plan = first.engine.plan(schema)
        ids = plan.head_ids + first.engine.encode_ids(sc.context) + plan.tail_ids
        gflop = ar.prefill(len(ids), head_positions=1) / 1e9 if ar else float("nan")
        methods: list[str] = [*deciders, *(["llama.cpp"] if llama else [])]
        times: dict[str, list[float]] = {m: [] for m in methods}

        def once(
            method: str, ids: list[int] = ids, schema: Any = schema, ctx: str = sc.context
        ) -> float:
            if method == "llama.cpp":
                assert llama is not None
                llama.reset()
                t = time.perf_counter()
                llama.eval(ids)
                ms = (time.perf_counter() - t) * 1e3
                settle()  # its OpenMP threads spin on: the next method gets a quiet CPU
                return ms
            return float(bare_prefill_ms(deciders[method], schema, ctx))

        for m in methods:  # warm-up: kernels built, pages in
            once(m)
        for r in range(args.rounds):
            order = methods[r % len(methods) :] + methods[: r % len(methods)]
            for m in order:
                times[m].append(once(m))
                print(f"{name} round {r + 1} {m}: {times[m][-1]:.0f} ms", flush=True)
        rows = {}
        for m in methods:
            st = _stats(times[m])
            row: dict[str, Any] = {"ms": times[m], **{f"ms_{k}": v for k, v in st.items()}}
            row["gops"] = gflop / (st["median"] / 1e3)
            if m != "llama.cpp":
                compute = deciders[m].loaded.compute
                arith, peak = mode_peak(pk, qgemm.isa(), compute)
                row.update(compute=compute, arithmetic=arith, peak_gops=peak * threads)
                row["of_peak"] = row["gops"] / (peak * threads) if peak else None
                if llama:
                    ratios = [b / a for a, b in zip(times[m], times["llama.cpp"])]
                    row["vs_llama"] = _stats(ratios)
            rows[m] = row
        out["scenarios"][name] = {"tokens": len(ids), "gflop": gflop, "methods": rows}
    return out


def table(out: dict[str, Any]) -> str:
    pk = out["peaks_gops_per_thread"]
    lines = [
        f"{out['model']}, {out['threads']} threads, {out['machine']['isa']}; register-only "
        f"peaks per thread, G op/s: " + ", ".join(f"{k} {v:.0f}" for k, v in pk.items() if v),
        "",
        "| scenario | tokens | method | compute | ms, median (range) | G op/s | of the arithmetic's peak | llama.cpp time / this, median (range) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, sc in out["scenarios"].items():
        for m, r in sc["methods"].items():
            peak = (
                f"{r['of_peak']:.0%} of {r['peak_gops']:.0f} ({r['arithmetic']})"
                if r.get("of_peak")
                else "-"
            )
            vs = r.get("vs_llama")
            vs_s = f"**{vs['median']:.2f}x** ({vs['min']:.2f}-{vs['max']:.2f})" if vs else "-"
            lines.append(
                f"| {name} | {sc['tokens']} | {m} | {r.get('compute', '-')} | "
                f"{r['ms_median']:,.0f} ({r['ms_min']:,.0f}-{r['ms_max']:,.0f}) | "
                f"{r['gops']:.0f} | {peak} | {vs_s} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="1.5b", help="GGUF path, or 0.5b / 1.5b (shared models)")
    ap.add_argument("--modes", default="auto,float32", help="compute modes, comma-separated")
    ap.add_argument(
        "--scenario", action="append", help="scenario (repeatable); default fraud, triage"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="default: the usable CPUs")
    ap.add_argument("--no-peer", action="store_true", help="leave llama.cpp out")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--from-json", type=Path)
    args = ap.parse_args(argv)
    if args.from_json:
        print(table(json.loads(args.from_json.read_text())))
        return 0
    args.modes = [m for m in args.modes.split(",") if m]
    args.scenario = args.scenario or ["fraud", "triage"]
    out = run(args)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    print(table(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
