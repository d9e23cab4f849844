"""Scale-out overheads: `pcd batch` and Ray Data against a plain `decide_many` loop.

Every method decides the same fraud-scenario rows with the same model in one run:

- **loop**: the baseline, a plain loop of `decider.decide_many(schema, chunk,
  batch_size=B)` over chunks of `--chunk-rows` rows, results kept in memory: the very
  batches `pcd batch` runs, without its reading, checkpoints and output;
- **loop, fixed batches**: `decide_many(schema, rows[i:i + B], batch_size=B)` over the
  rows in order (no length grouping), for reference;
- **pcd batch**: `pcd_tools.batch.run_batch` (what `pcd batch` runs, minus argument
  parsing and the model load) from a JSONL file to a Parquet file, with its chunked
  checkpoint, on the same loaded decider; the time spent inside `decide_many` is also
  measured, so that the job's own cost (reading, row checks, checkpoints, output) is
  reported apart from the model, whatever the background load;
- **ray, 1 actor**: `pcd_tools.ray.decide_dataset` on a local Ray instance, one actor with
  all the CPUs, consumed with `take_all`; timed from the call, so the actor's start-up
  and model load are included; the start-up (until the first batch comes back) is also
  reported on its own.

The methods alternate within each round, so that all of them see the same background
load on a shared machine. Ratios are each round's method time over the same round's loop
time; the table gives the median and the range over rounds.

Usage:
    python benchmarks/scale_out.py --rows 1000 --rounds 3
    python benchmarks/scale_out.py --rows 96 --rounds 3 --json scale_out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def fraud_rows(n: int) -> tuple[Any, list[str]]:
    """The fraud scenario's schema and `n` distinct contexts (its narratives, numbered)."""
    from pcd_tools.bench.run import load_scenarios

    sc = load_scenarios(Path(__file__).parent / "scenarios")["fraud"]
    base = list(sc.contexts)
    return sc.schema, [f"Case {i:05d}. {base[i % len(base)]}" for i in range(n)]


def run_loop(decider: Any, schema: Any, rows: list[str], step: int, batch: int) -> float:
    t0 = time.perf_counter()
    out = []
    for i in range(0, len(rows), step):
        out += decider.decide_many(schema, rows[i : i + step], batch_size=batch)
    assert len(out) == len(rows)
    return time.perf_counter() - t0


def run_pcd_batch(
    decider: Any, schema: Any, src: Path, work: Path, batch: int, chunk: int
) -> tuple[float, float]:
    """Wall time of the job, and the part of it spent inside `decide_many`."""
    from pcd_tools.batch import run_batch

    out = work / "decided.parquet"
    out.unlink(missing_ok=True)
    inside = [0.0]
    decide_many = decider.decide_many

    def timed(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return decide_many(*a, **k)
        finally:
            inside[0] += time.perf_counter() - t

    decider.decide_many = timed
    try:
        t0 = time.perf_counter()
        rep = run_batch(decider, schema, src, out, batch_size=batch, chunk_rows=chunk)
        dt = time.perf_counter() - t0
    finally:
        del decider.decide_many  # back to the class's method
    assert rep.rows == rep.decided and rep.errors == 0, rep
    return dt, inside[0]


def run_ray(schema: Any, rows: list[str], batch: int, cpus: int) -> tuple[float, float]:
    import ray

    from pcd_tools.ray import decide_dataset

    ds = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(rows)])
    t0 = time.perf_counter()
    out = decide_dataset(
        ds, schema, text_column="text", actors=1, num_cpus_per_actor=cpus, batch_size=batch
    )
    first = None
    n = 0
    for b in out.iter_batches(batch_size=None, batch_format="pyarrow"):
        if first is None:
            first = time.perf_counter() - t0
        n += b.num_rows
        assert b.column("error").null_count == b.num_rows
    assert n == len(rows)
    return time.perf_counter() - t0, first or 0.0


def driver_rows_per_s(schema: Any, n: int, chunk: int, work: Path) -> float:
    """The file job's own rate without a model: read, checkpoint, assemble `n` rows.

    Every chunk is "decided" instantly (each row marked failed, so its columns are
    written as nulls); this bounds what one `pcd batch --ray` driver can feed and write.
    """
    from pcd_tools.batch.columns import decision_table
    from pcd_tools.batch.io import InputFile
    from pcd_tools.batch.job import run_job
    from pcd_tools.schema import compile_schema

    compiled = compile_schema(schema)
    src = work / "driver.jsonl"
    text = "Authorisation 91C0-00412, EUR 38.60 at a grocery store, chip and PIN. " * 4
    src.write_text("".join(json.dumps({"id": i, "text": text}) + "\n" for i in range(n)))

    def instant(source: Any, start: int, tick: Any) -> Any:
        for c in source.chunks(start, chunk):
            yield c, decision_table(compiled, ["skipped"] * len(c.texts))

    t0 = time.perf_counter()
    source = InputFile(src, "text", None)
    rep = run_job(compiled, source, work / "driver.parquet", instant, {}, overwrite=True)
    assert rep.rows == n
    return n / (time.perf_counter() - t0)


def _stats(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--chunk-rows", type=int, default=64)
    p.add_argument("--no-ray", action="store_true")
    p.add_argument("--no-fixed", action="store_true", help="skip the fixed-batches loop")
    p.add_argument(
        "--driver-rows",
        type=int,
        default=0,
        help="only measure the file job without a model on this many rows, and exit",
    )
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()

    import pcd_tools.batch
    import pcd_tools.ray  # noqa: F401  (imported up front: the run takes a while)
    from pcd_tools import Decider
    from pcd_tools.engine.host.blas import blas_status

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    schema, rows = fraud_rows(args.rows)
    if args.driver_rows:
        with tempfile.TemporaryDirectory() as tmp:
            rates = [
                driver_rows_per_s(schema, args.driver_rows, args.chunk_rows, Path(tmp))
                for _ in range(args.rounds)
            ]
        st = _stats(rates)
        print(
            f"file job without a model, {args.driver_rows} rows, chunk {args.chunk_rows}: "
            f"{st['median']:.0f} rows/s ({st['min']:.0f}-{st['max']:.0f})"
        )
        return
    t0 = time.perf_counter()
    decider = Decider.load()
    load_s = time.perf_counter() - t0
    decider.decide_many(schema, rows[:2])  # warm the schema prefix and kernels
    if not args.no_ray:
        import ray

        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    times: dict[str, list[float]] = {
        "loop": [],
        "loop, fixed batches": [],
        "pcd batch": [],
        "ray, 1 actor": [],
    }
    startup: list[float] = []
    outside: list[float] = []  # pcd batch: time outside decide_many / time inside
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        src = work / "fraud.jsonl"
        src.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(rows)))
        for r in range(args.rounds):
            b, c = args.batch_size, args.chunk_rows
            times["loop"].append(run_loop(decider, schema, rows, c, b))
            if not args.no_fixed:
                times["loop, fixed batches"].append(run_loop(decider, schema, rows, b, b))
            wall, model = run_pcd_batch(decider, schema, src, work, b, c)
            times["pcd batch"].append(wall)
            outside.append((wall - model) / model)
            if not args.no_ray:
                total, first = run_ray(schema, rows, args.batch_size, cpus or 1)
                times["ray, 1 actor"].append(total)
                startup.append(first)
            print(
                f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}s" for k, v in times.items() if v),
                flush=True,
            )
    base = times["loop"]
    result: dict[str, Any] = {
        "rows": args.rows,
        "rounds": args.rounds,
        "batch_size": args.batch_size,
        "chunk_rows": args.chunk_rows,
        "model": decider.model_id,
        "model_load_s": round(load_s, 2),
        "machine": f"{platform.machine()}, {cpus} CPUs, {platform.platform()}",
        "blas": str(blas_status(measure=False)),
        "methods": {},
    }
    print(
        f"\n{args.rows} fraud rows, {args.rounds} rounds, batch {args.batch_size}, chunk {args.chunk_rows}"
    )
    print("| method | rows/s median (range) | time / loop time: median (range) |")
    print("|---|---|---|")
    for name, ts in times.items():
        if not ts:
            continue
        rate = _stats([args.rows / t for t in ts])
        ratio = _stats([t / b for t, b in zip(ts, base)])
        result["methods"][name] = {"seconds": ts, "rows_per_s": rate, "ratio": ratio}
        print(
            f"| {name} | {rate['median']:.3f} ({rate['min']:.3f}-{rate['max']:.3f}) | "
            f"{ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f}) |"
        )
    if outside:
        result["pcd_batch_outside_model"] = _stats(outside)
        print(
            "pcd batch, time outside decide_many (reading, checks, checkpoints, output) / "
            f"time inside: {100 * statistics.median(outside):.2f}% "
            f"({100 * min(outside):.2f}-{100 * max(outside):.2f}%)"
        )
    if startup:
        # start-up: time to the first batch less that batch's decisions at the loop's pace
        per_row = [b / args.rows for b in base]
        est = [f - min(args.batch_size, args.rows) * pr for f, pr in zip(startup, per_row)]
        result["ray_first_batch_s"] = _stats(startup)
        result["ray_startup_s"] = _stats(est)
        print(
            f"ray start-up (actor start and model load; first batch at the loop's pace "
            f"taken off): {_stats(est)['median']:.1f} s ({min(est):.1f}-{max(est):.1f})"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
