"""The int8 / bf16 kernels of `engine.qgemm` against float32 sgemm, interleaved.

For each shape (rows x k -> n) and weight type, every method runs once per round, the
rounds interleaved so that a busy machine slows every method alike; the table gives
the median and the range of each method's rate over the rounds, in G operations a
second (2 * rows * k * n / seconds; one multiply-add is two operations), by the wall
clock and by the process's CPU time (``time.process_time``: on a shared machine, the
fairer measure of the work each method costs; with ``--threads 1`` it is the work
itself):

- ``int8/<kernel>``: `QuantizedMatrix.matmul` on the file's blocks, activations quantized
  per block of 32 (the quantization is inside the time), one row per kernel this CPU
  runs (``avx512vnni``, ``avxvnni``, ``avx2``; ``scalar`` with ``--scalar``);
- ``int8-k256/<kernel>``: the same for K-quant weights with activations per 256
  (``act_block=256``: sub-block scales folded into the integer sums);
- ``int8-cols/avx512vnni``: K-quant weights, activations per 256, on the column-panel
  kernel (``vpdpbusd`` across 16 output columns; what ``compute="int8"`` runs for
  K-quant matrices on an AVX-512 VNNI CPU);
- ``bf16``: the bf16 route, where the CPU has AVX-512 BF16;
- ``sgemm``: float32 ``mx.matmul(x, W.T)`` over dense weights already in memory, through
  the BLAS bound by `engine.platform` (what the engine runs today; 4 bytes a weight);
- ``deq``: dequantizing the blocks to float32 into a reused scratch (the native decoder
  of `_qgemm.c`); ``deq+sgemm``: its time plus the sgemm's of the same round, what
  issue 30's per-matrix scratch route costs (the copy into an ``mx.array`` left out).

Shapes: Qwen2.5-1.5B (hidden 1536, MLP 8960) and SmolLM2-135M (hidden 576, MLP 1536)
at 512 prefill rows. A K-quant type cannot hold rows of 576 (not whole blocks of 256),
so those rows use ``--fallback`` (Q4_1, the embedded model's file type), as llama.cpp
writes such tensors in another type.

Usage:

    python benchmarks/qgemm.py                       # Q4_K, every shape, 7 rounds
    python benchmarks/qgemm.py --types Q4_K,Q6_K,Q8_0 --rounds 9 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = [  # (label, rows, k, n)
    ("1.5B q/o 1536->1536", 512, 1536, 1536),
    ("1.5B gate/up 1536->8960", 512, 1536, 8960),
    ("1.5B down 8960->1536", 512, 8960, 1536),
    ("0.5B q/o 896->896", 512, 896, 896),
    ("0.5B gate/up 896->4864", 512, 896, 4864),
    ("0.5B down 4864->896", 512, 4864, 896),
    ("135M q/o 576->576", 512, 576, 576),
    ("135M gate/up 576->1536", 512, 576, 1536),
]


def random_blocks(name: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """File bytes of a random [n, k] matrix: quantized by `gguf` for the 32-blocks, valid
    random blocks (finite scales) for the K-quants."""
    if name.endswith("_K"):
        size = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[name]
        nb = n * k // 256
        b = rng.integers(0, 256, (nb, size), dtype=np.uint8)
        pos, cnt = (208, 1) if name == "Q6_K" else (0, 2)
        d = rng.uniform(1e-3, 1e-2, (nb, cnt)).astype(np.float16)
        b[:, pos : pos + 2 * cnt] = d.view(np.uint8).reshape(nb, -1)
        return b.reshape(n, -1)
    import gguf
    import gguf.quants as gq

    w = rng.standard_normal((n, k)).astype(np.float32)
    return gq.quantize(w, gguf.GGMLQuantizationType[name])


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from pcd_tools.engine.host.blas import blas_status, import_mlx, set_blas_threads
    from pcd_tools.engine.kernels import qgemm

    mx = import_mlx()
    set_blas_threads(args.threads)
    info = blas_status(measure=False)
    paths = [p for p in qgemm.available_paths() if p != "avx512bf16"]
    if not args.scalar:
        paths = [p for p in paths if p != "scalar"]
    print(f"BLAS: {info.name}; int8 kernels: {paths}; modes: {qgemm.available_modes()}")
    print(f"threads {args.threads}, rounds {args.rounds}, load average {os.getloadavg()[0]:.1f}")
    rng = np.random.default_rng(0)
    out: list[dict[str, Any]] = []
    for tname in args.types.split(","):
        for label, rows, k, n in [
            (lb if r == 512 else f"{lb} x {r} rows", r, k, n)
            for lb, rows0, k, n in SHAPES
            for r in (args.rows or [rows0])
        ]:
            if args.shapes and not any(s in label for s in args.shapes.split(",")):
                continue
            tn = tname
            if tn.endswith("_K") and k % 256:  # as llama.cpp does, a 32-block type instead
                tn = args.fallback
            raw = random_blocks(tn, n, k, rng)
            m = qgemm.prepare(raw, tn, (n, k))
            x = rng.standard_normal((rows, k)).astype(np.float32)
            w = mx.array(m.dequantize())
            xm = mx.array(x)
            mx.eval(w, xm)

            scratch = np.empty((n, k), dtype=np.float32)

            methods: dict[str, Any] = {
                f"int8/{p}": (lambda p=p, m=m, x=x: m.matmul(x, path=p, threads=args.threads))
                for p in paths
            }
            if m.kquant:
                for p in paths:
                    methods[f"int8-k256/{p}"] = lambda p=p, m=m, x=x: m.matmul(
                        x, path=p, threads=args.threads, act_block=256
                    )
                if "avx512vnni" in paths:  # the column-panel kernel (compute="int8")
                    methods["int8-cols/avx512vnni"] = lambda m=m, x=x: m.matmul(
                        x, path="avx512vnni-cols", threads=args.threads
                    )
            if "bf16" in qgemm.available_modes():
                methods["bf16"] = lambda m=m, x=x: m.matmul(x, mode="bf16", threads=args.threads)
            methods["sgemm"] = lambda xm=xm, w=w: mx.eval(mx.matmul(xm, w.T))
            methods["deq"] = lambda m=m, scratch=scratch: m.dequantize(out=scratch)
            times: dict[str, list[float]] = {name: [] for name in methods}
            cpu: dict[str, list[float]] = {name: [] for name in methods}
            for fn in methods.values():  # warm-up
                fn()
            for _ in range(args.rounds):
                for name, fn in methods.items():
                    t0, c0 = time.perf_counter(), time.process_time()
                    fn()
                    times[name].append(time.perf_counter() - t0)
                    cpu[name].append(time.process_time() - c0)
            # the scratch route of issue 30: dequantize, then the same sgemm (per round)
            times["deq+sgemm"] = [a + b for a, b in zip(times["deq"], times["sgemm"])]
            cpu["deq+sgemm"] = [a + b for a, b in zip(cpu["deq"], cpu["sgemm"])]
            ops = 2.0 * rows * k * n
            base = statistics.median(times["sgemm"])
            for name, ts in times.items():
                rates = [ops / t / 1e9 for t in ts]
                row = {
                    "type": tn,
                    "shape": label,
                    "rows": rows,
                    "k": k,
                    "n": n,
                    "method": name,
                    "ms_median": statistics.median(ts) * 1e3,
                    "gops_median": statistics.median(rates),
                    "gops_min": min(rates),
                    "gops_max": max(rates),
                    "vs_sgemm": base / statistics.median(ts),
                    "cpu_gops_median": ops / statistics.median(cpu[name]) / 1e9,
                    "cpu_vs_sgemm": statistics.median(cpu["sgemm"]) / statistics.median(cpu[name]),
                    "weight_bytes": m.nbytes if name not in ("sgemm", "deq") else 4 * n * k,
                }
                out.append(row)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| type | shape (512 rows unless named) | method | ms (median) | G op/s median [range] | vs sgemm "
        "| G op per CPU-s | vs sgemm, CPU time | weight MB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["method"] == "deq":  # no matmul: its time only, and the scratch it fills
            lines.append(
                f"| {r['type']} | {r['shape']} | deq (float32 scratch) | {r['ms_median']:.1f} "
                f"| - | - | - | - | {r['weight_bytes'] / 1e6:.1f} |"
            )
            continue
        lines.append(
            f"| {r['type']} | {r['shape']} | {r['method']} | {r['ms_median']:.1f} | "
            f"{r['gops_median']:.1f} [{r['gops_min']:.1f}-{r['gops_max']:.1f}] | "
            f"{r['vs_sgemm']:.2f}x | {r['cpu_gops_median']:.1f} | {r['cpu_vs_sgemm']:.2f}x | "
            f"{r['weight_bytes'] / 1e6:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    """Parse the arguments, run the rounds and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", default="Q4_K", help="comma-separated GGUF types")
    ap.add_argument("--shapes", default="", help="comma-separated substrings of shape labels")
    ap.add_argument(
        "--fallback",
        default="Q4_1",
        help="type for rows that are not whole K-quant blocks (576: SmolLM2-135M; its file is Q4_1)",
    )
    ap.add_argument(
        "--rows",
        type=lambda s: [int(v) for v in s.split(",")],
        default=None,
        help="comma-separated row counts instead of 512 (few rows: the panel decode's share)",
    )
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--scalar", action="store_true", help="also time the portable C kernel")
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--from-json", type=Path, help="print the table of an earlier run")
    args = ap.parse_args()
    if args.from_json:
        print(table(json.loads(args.from_json.read_text())))
        return
    rows = run(args)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
