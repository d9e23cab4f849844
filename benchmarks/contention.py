"""PCD under CPU contention: a scenario's warm request with other CPU-bound processes running.

Issue 15's figure: with 2 other CPU-bound processes on the machine, triage's warm request
should take at most 2x its quiet time. The rounds alternate a quiet phase and a busy
phase (the hogs started, then killed), so both see the same background; the ratio is
each round's busy median over the same round's quiet median.

A hog is a separate Python process spinning on arithmetic (`--hog spin`), or running
float32 matmuls through numpy's own BLAS (`--hog blas`), the kind of neighbour a model
server meets.

Usage:
    python benchmarks/contention.py --scenario triage --rounds 3 --hogs 2
    python benchmarks/contention.py --threads 1 --json contention.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HOGS = {
    "spin": "x = 0\nwhile True:\n    x = (x * 1103515245 + 12345) % 2147483648\n",
    "blas": (
        "import numpy as np\n"
        "a = np.random.rand(512, 512).astype(np.float32)\n"
        "while True:\n    a = (a @ a) / 512.0\n"
    ),
}


def _start_hogs(n: int, kind: str) -> list[subprocess.Popen[bytes]]:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen([sys.executable, "-c", HOGS[kind]], env=env, stdout=subprocess.DEVNULL)
        for _ in range(n)
    ]
    time.sleep(1.0)  # let them reach full speed
    return procs


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def _stats(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default="triage")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=3, help="warm requests per phase")
    p.add_argument("--hogs", type=int, default=2)
    p.add_argument("--hog", choices=sorted(HOGS), default="spin")
    p.add_argument("--threads", type=int, default=0, help="PCD_THREADS for this run (0: unset)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.threads:
        os.environ["PCD_THREADS"] = str(args.threads)

    from pcd_tools import Decider
    from pcd_tools.bench import load_scenarios
    from pcd_tools.engine.cpus import cpu_budget
    from pcd_tools.schema import compile_schema

    sc = load_scenarios(Path(__file__).parent / "scenarios")[args.scenario]
    decider = Decider.load()
    schema = compile_schema(sc.schema)
    decider.decide(schema, sc.context)  # the schema prefix cached: every request is warm
    budget = cpu_budget()

    def phase() -> list[float]:
        return [decider.decide(schema, sc.context).elapsed_ms for _ in range(args.requests)]

    quiet: list[float] = []
    busy: list[float] = []
    ratios: list[float] = []
    for r in range(args.rounds):
        q = phase()
        hogs = _start_hogs(args.hogs, args.hog)
        try:
            b = phase()
        finally:
            _stop(hogs)
        quiet += q
        busy += b
        ratios.append(statistics.median(b) / statistics.median(q))
        print(
            f"round {r + 1}: quiet {statistics.median(q):.0f} ms, busy {statistics.median(b):.0f} ms, "
            f"{ratios[-1]:.2f}x",
            flush=True,
        )
    result: dict[str, Any] = {
        "scenario": args.scenario,
        "hogs": args.hogs,
        "hog": args.hog,
        "cpus": budget.cpus,
        "cpu_source": budget.source,
        "threads_env": args.threads or None,
        "quiet_ms": _stats(quiet),
        "busy_ms": _stats(busy),
        "busy_vs_quiet": _stats(ratios),
    }
    st = result["busy_vs_quiet"]
    print(
        f"\n{args.scenario} warm, {args.hogs} {args.hog} hog(s), {budget.cpus} CPUs "
        f"({budget.source}): quiet {result['quiet_ms']['median']:.0f} ms, busy "
        f"{result['busy_ms']['median']:.0f} ms; busy / quiet {st['median']:.2f}x "
        f"({st['min']:.2f}-{st['max']:.2f}) over {args.rounds} rounds"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
