"""PCD under CPU contention: a scenario's warm request with other CPU-bound processes running.

Issue 15's figure: with 2 other CPU-bound processes on the machine, triage's warm request
should take at most 2x its quiet time. The rounds alternate a quiet phase and a busy
phase (the hogs started, then killed), so both see the same background; the ratio is
each round's busy median over the same round's quiet median.

A hog is a separate Python process spinning on arithmetic (`--hog spin`), running
float32 matmuls through numpy's own BLAS on one thread (`--hog blas`), or a PCD batch
job (`--hog pcd`: `decide_many` over 8 copies of the scenario, in a loop, with PCD's
defaults), or a second PCD server (`--hog pcd-requests`: one warm request after
another), the kinds of neighbour a model server meets.

Each phase alternates requests with threads fitted to the machine (the default,
`Engine.fit_threads`) and with a fixed count (`PCD_ADAPTIVE_THREADS=0`: every usable
CPU), so both see the same neighbours.

Usage:
    python benchmarks/contention.py --scenario triage --rounds 3 --hogs 2
    python benchmarks/contention.py --hog pcd --hogs 1 --json contention_pcd.json
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
    "pcd": (
        "import sys\n"
        "from pcd_tools import Decider\n"
        "from pcd_tools.bench.run import load_scenarios\n"
        "from pcd_tools.schema import compile_schema\n"
        "sc = load_scenarios(sys.argv[1])[sys.argv[2]]\n"
        "d = Decider.load()\n"
        "s = compile_schema(sc.schema)\n"
        "d.decide(s, sc.context)\n"
        "print('ready', flush=True)\n"
        "while True:\n    d.decide_many(s, [sc.context] * 8)\n"
    ),
}
# A second model server: one warm request after another, as this process makes them.
HOGS["pcd-requests"] = HOGS["pcd"].replace(
    "d.decide_many(s, [sc.context] * 8)", "d.decide(s, sc.context)"
)
MODES = ("fitted", "fixed")  # PCD_ADAPTIVE_THREADS unset / "0"


def _start_hogs(n: int, kind: str, scenario: str) -> list[subprocess.Popen[bytes]]:
    if kind.startswith("pcd"):  # PCD's own defaults: every usable CPU, fitted per request
        env = {k: v for k, v in os.environ.items() if not k.startswith("PCD_")}
        argv = [str(Path(__file__).parent / "scenarios"), scenario]
    else:
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        argv = []
    procs = [
        subprocess.Popen(
            [sys.executable, "-W", "ignore", "-c", HOGS[kind], *argv],
            env=env,
            stdout=subprocess.PIPE if kind.startswith("pcd") else subprocess.DEVNULL,
        )
        for _ in range(n)
    ]
    for p in procs:  # a PCD hog says when its model is loaded
        if (
            kind.startswith("pcd")
            and p.stdout is not None
            and p.stdout.readline().strip() != b"ready"
        ):
            raise RuntimeError("a pcd hog did not start")
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
    from pcd_tools.bench.run import load_scenarios
    from pcd_tools.engine.host.cpus import cpu_budget
    from pcd_tools.schema import compile_schema

    sc = load_scenarios(Path(__file__).parent / "scenarios")[args.scenario]
    decider = Decider.load()
    schema = compile_schema(sc.schema)
    decider.decide(schema, sc.context)  # the schema prefix cached: every request is warm
    budget = cpu_budget()

    def request(mode: str) -> float:
        if mode == "fixed":
            os.environ["PCD_ADAPTIVE_THREADS"] = "0"
        else:
            os.environ.pop("PCD_ADAPTIVE_THREADS", None)
        try:
            return decider.decide(schema, sc.context).elapsed_ms
        finally:
            os.environ.pop("PCD_ADAPTIVE_THREADS", None)

    def phase() -> dict[str, list[float]]:
        out: dict[str, list[float]] = {m: [] for m in MODES}
        for i in range(args.requests):
            for m in MODES if i % 2 == 0 else MODES[::-1]:
                out[m].append(request(m))
        return out

    quiet: dict[str, list[float]] = {m: [] for m in MODES}
    busy: dict[str, list[float]] = {m: [] for m in MODES}
    ratios: dict[str, list[float]] = {m: [] for m in MODES}
    fewer = decider.engine.stats["fewer_threads"]
    for r in range(args.rounds):
        q = phase()
        hogs = _start_hogs(args.hogs, args.hog, args.scenario)
        try:
            b = phase()
        finally:
            _stop(hogs)
        line = []
        for m in MODES:
            quiet[m] += q[m]
            busy[m] += b[m]
            ratios[m].append(statistics.median(b[m]) / statistics.median(q[m]))
            line.append(
                f"{m}: quiet {statistics.median(q[m]):.0f} ms, busy "
                f"{statistics.median(b[m]):.0f} ms, {ratios[m][-1]:.2f}x"
            )
        print(f"round {r + 1}: " + "; ".join(line), flush=True)
    result: dict[str, Any] = {
        "scenario": args.scenario,
        "hogs": args.hogs,
        "hog": args.hog,
        "cpus": budget.cpus,
        "cpu_source": budget.source,
        "threads_env": args.threads or None,
        "fitted_requests_on_fewer_threads": decider.engine.stats["fewer_threads"] - fewer,
    }
    for m in MODES:  # the fitted keys keep the names of the figure before threads were fitted
        pre = "" if m == "fitted" else "fixed_"
        result[f"{pre}quiet_ms"] = _stats(quiet[m])
        result[f"{pre}busy_ms"] = _stats(busy[m])
        result[f"{pre}busy_vs_quiet"] = _stats(ratios[m])
    print(
        f"\n{args.scenario} warm, {args.hogs} {args.hog} hog(s), {budget.cpus} CPUs ({budget.source}):"
    )
    for m in MODES:
        pre = "" if m == "fitted" else "fixed_"
        st = result[f"{pre}busy_vs_quiet"]
        print(
            f"  threads {m:6}: quiet {result[pre + 'quiet_ms']['median']:.0f} ms, busy "
            f"{result[pre + 'busy_ms']['median']:.0f} ms; busy / quiet {st['median']:.2f}x "
            f"({st['min']:.2f}-{st['max']:.2f}) over {args.rounds} rounds"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
