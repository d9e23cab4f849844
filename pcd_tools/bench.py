"""`pcd bench`: PCD against autoregressive baselines on the reference scenarios.

For each scenario, in one process on one model, every run times (after a warm-up):

- PCD cold (schema prefix not cached; the token plan is) and PCD warm (prefix cached);
- a bare prefill of the same prompt, the physical floor;
- greedy JSON generation and grammar-constrained generation, both reusing a KV cache of
  the schema part of the prompt.

Methods are interleaved within each run so drift on a busy machine hits them alike.
Peak RSS is measured per method in a fresh subprocess. Times are medians (min-max).

The scenarios live in the repository's `benchmarks/scenarios` package, found next to the
package directory of an editable install or given with `--scenarios-dir`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .errors import InvalidArgumentError

__all__ = ["add_arguments", "load_scenarios", "run"]

METHODS = ("pcd", "greedy", "constrained")
_PKG_NAME = "pcd_bench_scenarios"


# --- scenarios ---------------------------------------------------------------------------


def default_scenarios_dir() -> Path:
    """`benchmarks/scenarios` next to the package (editable install), else under the cwd."""
    beside = Path(__file__).resolve().parent.parent / "benchmarks" / "scenarios"
    here = Path.cwd() / "benchmarks" / "scenarios"
    return beside if (beside / "__init__.py").is_file() or not here.is_dir() else here


def load_scenarios(directory: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Imports the scenarios package and returns its `SCENARIOS` registry.

    Args:
        directory: The `scenarios` package directory; default `default_scenarios_dir()`.

    Raises:
        InvalidArgumentError: if the directory has no `__init__.py` with `SCENARIOS`.
    """
    d = Path(directory) if directory is not None else default_scenarios_dir()
    init = d / "__init__.py"
    if not init.is_file():
        raise InvalidArgumentError(
            f"no benchmark scenarios at {d} (expected a package with __init__.py). "
            "`pcd bench` reads them from the repository's benchmarks/scenarios: run it from an "
            "editable install (`pip install -e .`) or pass --scenarios-dir PATH."
        )
    name = f"{_PKG_NAME}_{abs(hash(str(d.resolve())))}"
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(d)]
        )
        if spec is None or spec.loader is None:  # pragma: no cover - importlib contract
            raise InvalidArgumentError(f"cannot import the scenarios package at {d}.")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[name]
            raise
    scenarios = getattr(mod, "SCENARIOS", None)
    if not isinstance(scenarios, dict) or not scenarios:
        raise InvalidArgumentError(f"{init} defines no SCENARIOS registry (a non-empty dict).")
    return scenarios


def _select(scenarios: dict[str, Any], names: list[str] | None) -> list[Any]:
    if not names:
        return list(scenarios.values())
    unknown = [n for n in names if n not in scenarios]
    if unknown:
        raise InvalidArgumentError(f"unknown scenario(s) {unknown}; accepted: {sorted(scenarios)}.")
    return [scenarios[n] for n in names]


# --- measurement -------------------------------------------------------------------------


def _stats(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def _cold_decide(decider: Any, schema: Any, context: str) -> Any:
    """A request whose schema prefix is not cached (its token plan is, as in production)."""
    from .schema import compile_schema

    compiled = compile_schema(schema)
    decider.engine.clear_cache()
    decider.engine.plan(compiled)
    return decider.decide(compiled, context)


def measure(
    decider: Any,
    scenario: Any,
    *,
    runs: int = 5,
    warmup: int = 1,
    methods: tuple[str, ...] = METHODS,
    throughput: int = 0,
    advance: Any = None,
) -> dict[str, Any]:
    """Times one scenario; returns the scenario's JSON object (medians in ms).

    Args:
        decider: The loaded decider.
        scenario: A `Scenario` from the registry.
        runs: Timed runs per method.
        warmup: Untimed runs first (builds plans, caches and the grammar index).
        methods: Which of "pcd", "greedy", "constrained" to time ("pcd" includes the bare
            prefill).
        throughput: If > 0, also time `decide_many` over this many contexts against as many
            sequential `decide` calls.
        advance: Called with a short label after each step (progress display).
    """
    from .engine.baseline import bare_prefill_ms, constrained_json, greedy_json
    from .schema import compile_schema

    step = advance or (lambda label: None)
    compiled = compile_schema(scenario.schema)
    ctx = scenario.context
    rec: dict[str, list[Any]] = {}

    def add(key: str, value: Any) -> None:
        rec.setdefault(key, []).append(value)

    for r in range(warmup + runs):
        timed = r >= warmup
        if "pcd" in methods:
            d = _cold_decide(decider, compiled, ctx)
            w = decider.decide(compiled, ctx)
            b = bare_prefill_ms(decider, compiled, ctx)
            if timed:
                add("pcd", d.elapsed_ms)
                add("prefill", d.prefill_ms)
                add("suffix", d.suffix_eval_ms)
                add("passes", d.sequential_forward_passes)
                add("warm", w.elapsed_ms)
                add("warm_prefill", w.prefill_ms)
                add("bare", b)
                add("prompt_tokens", d.prompt_tokens)
                add("answer", {k: f.label for k, f in w.fields.items()})
            step("pcd")
        for name, fn in (("greedy", greedy_json), ("constrained", constrained_json)):
            if name in methods:
                g = fn(decider, compiled, ctx)
                if timed:
                    add(name, g.wall_ms)
                    add(f"{name}_prefill", g.prefill_ms)
                    add(f"{name}_tokens", g.tokens)
                    add(f"{name}_passes", g.passes)
                    add(f"{name}_match", g.schema_match)
                    add(f"{name}_text", g.json_text)
                step(name)

    out: dict[str, Any] = {
        "scenario": scenario.name,
        "title": scenario.title,
        "fields": len(compiled.fields),
        "choices": sum(f.cardinality for f in compiled.fields),
        "runs": runs,
        "model": decider.model_id,
        "device": decider.device,
        "reference": dict(scenario.reference),
    }
    if "pcd" in methods:
        out["pcd_ms"], out["pcd_ms_min"], out["pcd_ms_max"] = _stats(rec["pcd"])
        out["prefill_ms"] = statistics.median(rec["prefill"])
        out["suffix_eval_ms"] = statistics.median(rec["suffix"])
        out["pcd_passes"] = int(statistics.median(rec["passes"]))
        out["warm_pcd_ms"], out["warm_pcd_ms_min"], out["warm_pcd_ms_max"] = _stats(rec["warm"])
        out["warm_prefill_ms"] = statistics.median(rec["warm_prefill"])
        out["bare_prefill_ms"], out["bare_prefill_ms_min"], out["bare_prefill_ms_max"] = _stats(
            rec["bare"]
        )
        out["prompt_tokens"] = rec["prompt_tokens"][-1]
        out["pcd_vs_bare_prefill"] = out["pcd_ms"] / out["bare_prefill_ms"]
        out["warm_vs_cold"] = out["warm_pcd_ms"] / out["pcd_ms"]
        out["pcd_answer"] = rec["answer"][-1]
    for name in ("greedy", "constrained"):
        if name not in methods:
            continue
        out[f"{name}_ms"], out[f"{name}_ms_min"], out[f"{name}_ms_max"] = _stats(rec[name])
        out[f"{name}_prefill_ms"] = statistics.median(rec[f"{name}_prefill"])
        out[f"{name}_tokens"] = int(statistics.median(rec[f"{name}_tokens"]))
        out[f"{name}_passes"] = int(statistics.median(rec[f"{name}_passes"]))
        out[f"{name}_schema_match"] = all(rec[f"{name}_match"])
        out[f"{name}_output"] = rec[f"{name}_text"][-1]
        if "pcd" in methods:
            # both sides reuse the cached schema prefix: warm against warm
            out[f"speedup_vs_{name}"] = out[f"{name}_ms"] / out["warm_pcd_ms"]
            out[f"speedup_vs_{name}_cold_pcd"] = out[f"{name}_ms"] / out["pcd_ms"]
    if throughput > 0 and "pcd" in methods:
        out.update(_throughput(decider, compiled, scenario, throughput, step))
    return out


def _throughput(decider: Any, compiled: Any, scenario: Any, n: int, step: Any) -> dict[str, Any]:
    pool = list(scenario.contexts) or [scenario.context]
    ctxs = [pool[i % len(pool)] for i in range(n)]
    decider.decide_many(compiled, ctxs[: min(n, 8)])  # warm plan, prefix and shapes
    t0 = time.perf_counter()
    for c in ctxs:
        decider.decide(compiled, c)
    seq = time.perf_counter() - t0
    step("sequential")
    t0 = time.perf_counter()
    decider.decide_many(compiled, ctxs)
    many = time.perf_counter() - t0
    step("decide_many")
    return {
        "throughput_contexts": n,
        "sequential_rps": n / seq,
        "decide_many_rps": n / many,
        "decide_many_speedup": seq / many,
    }


# --- peak memory in fresh processes ------------------------------------------------------


def _rss_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _probe(argv: list[str]) -> int:
    """Child process: load, reset the RSS high-water mark, run one method once, report."""
    p = argparse.ArgumentParser(prog="pcd_tools.bench --probe")
    p.add_argument("--probe", required=True, choices=METHODS)
    p.add_argument("--scenario", required=True)
    p.add_argument("--scenarios-dir", default=None)
    p.add_argument("--model", default=None)
    a = p.parse_args(argv)
    import resource

    from .decider import Decider
    from .engine.baseline import constrained_json, greedy_json

    sc = _select(load_scenarios(a.scenarios_dir), [a.scenario])[0]
    decider = Decider.load(a.model)
    after_load = _rss_kb("VmRSS") or 0
    reset = False
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM to the current RSS
        reset = True
    except OSError:
        pass
    if a.probe == "pcd":
        decider.decide(sc.schema, sc.context)
    elif a.probe == "greedy":
        greedy_json(decider, sc.schema, sc.context)
    else:
        constrained_json(decider, sc.schema, sc.context)
    peak = _rss_kb("VmHWM") if reset else None
    if peak is None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_rss_mb": peak / 1024, "rss_after_load_mb": after_load / 1024}))
    return 0


def peak_rss(
    method: str, scenario: str, scenarios_dir: str | None, model: str | None
) -> dict[str, float]:
    """Peak RSS (MB) of one cold request of `method` in a fresh process, and RSS after load."""
    cmd = [sys.executable, "-m", "pcd_tools.bench", "--probe", method, "--scenario", scenario]
    if scenarios_dir:
        cmd += ["--scenarios-dir", str(scenarios_dir)]
    if model:
        cmd += ["--model", str(model)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"memory probe {method}/{scenario} failed:\n{done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


# --- CLI ---------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds `pcd bench` options (`--model` and `--json` are added by the CLI)."""
    parser.add_argument(
        "--scenario",
        action="append",
        default=None,
        help="scenario to run (repeatable; default: all): fraud, security_audit, tariff, triage",
    )
    parser.add_argument("--runs", type=int, default=5, help="timed runs per method (median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first")
    parser.add_argument(
        "--methods",
        default=",".join(METHODS),
        help="comma-separated subset of pcd,greedy,constrained",
    )
    parser.add_argument(
        "--throughput",
        type=int,
        default=32,
        help="triage: decide_many over N contexts vs N sequential decides (0 skips)",
    )
    parser.add_argument(
        "--no-rss", action="store_true", help="skip the per-method peak-RSS subprocesses"
    )
    parser.add_argument("--scenarios-dir", default=None, help="path of benchmarks/scenarios")


def _fmt_line(label: str, ms: float, lo: float, hi: float, tail: str) -> str:
    return f"{label:<15}: {ms:8.1f} ms ({lo:.0f}-{hi:.0f}) | {tail}"


def _print_scenario(console: Any, r: dict[str, Any]) -> None:
    console.print(f"\n[bold]{r['title']}[/bold] ({r['scenario']}, {r['fields']} fields)")
    if "greedy_ms" in r:
        console.print(
            _fmt_line(
                "Autoregressive",
                r["greedy_ms"],
                r["greedy_ms_min"],
                r["greedy_ms_max"],
                f"{r['greedy_tokens']} tokens | Passes: {r['greedy_passes']}",
            ),
            highlight=False,
        )
    if "constrained_ms" in r:
        console.print(
            _fmt_line(
                "Constrained",
                r["constrained_ms"],
                r["constrained_ms_min"],
                r["constrained_ms_max"],
                f"{r['constrained_tokens']} tokens | Passes: {r['constrained_passes']}",
            ),
            highlight=False,
        )
    if "pcd_ms" in r:
        console.print(
            _fmt_line(
                "Parallel",
                r["warm_pcd_ms"],
                r["warm_pcd_ms_min"],
                r["warm_pcd_ms_max"],
                f"{r['fields']} fields | Passes: {r['pcd_passes']} | cold {r['pcd_ms']:.1f} ms "
                f"(prefill {r['prefill_ms']:.1f} + fields {r['suffix_eval_ms']:.1f}) | "
                f"bare prefill {r['bare_prefill_ms']:.1f} ms",
            ),
            highlight=False,
        )
    if "speedup_vs_greedy" in r:
        extra = (
            f" (vs constrained: {r['speedup_vs_constrained']:.1f}x)"
            if "speedup_vs_constrained" in r
            else ""
        )
        console.print(f"SPEEDUP: {r['speedup_vs_greedy']:.1f}x{extra}", highlight=False)


def _summary(console: Any, results: list[dict[str, Any]]) -> None:
    from rich.table import Table

    t = Table(title="pcd bench (medians, ms)")
    for col in (
        "scenario",
        "fields",
        "greedy",
        "tokens",
        "constrained",
        "PCD warm",
        "PCD cold",
        "bare prefill",
        "vs greedy",
        "vs constrained",
        "peak RSS MB (PCD/greedy)",
    ):
        t.add_column(col, justify="left" if col == "scenario" else "right")

    def f(r: dict[str, Any], k: str, fmt: str = "{:.0f}") -> str:
        return fmt.format(r[k]) if k in r else "-"

    for r in results:
        rss = (
            f"{r['peak_rss_mb']:.0f}/{r['greedy_peak_rss_mb']:.0f}"
            if "peak_rss_mb" in r and "greedy_peak_rss_mb" in r
            else "-"
        )
        t.add_row(
            r["scenario"],
            str(r["fields"]),
            f(r, "greedy_ms"),
            f(r, "greedy_tokens"),
            f(r, "constrained_ms"),
            f(r, "warm_pcd_ms"),
            f(r, "pcd_ms"),
            f(r, "bare_prefill_ms"),
            f(r, "speedup_vs_greedy", "{:.1f}x"),
            f(r, "speedup_vs_constrained", "{:.1f}x"),
            rss,
        )
    console.print(t)
    for r in results:
        if "decide_many_rps" in r:
            console.print(
                f"{r['scenario']}: decide_many {r['decide_many_rps']:.2f} req/s vs sequential "
                f"{r['sequential_rps']:.2f} req/s over {r['throughput_contexts']} contexts "
                f"({r['decide_many_speedup']:.2f}x)",
                highlight=False,
            )


def run(args: argparse.Namespace) -> int:
    """Runs the benchmark; prints the seed's format and a table, or JSON with `--json`."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    if args.runs < 1 or args.warmup < 0:
        raise InvalidArgumentError(
            f"--runs must be >= 1 and --warmup >= 0; got {args.runs} and {args.warmup}."
        )
    methods = tuple(m.strip() for m in str(args.methods).split(",") if m.strip())
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise InvalidArgumentError(
            f"unknown --methods {bad or methods}; accepted: {list(METHODS)}."
        )
    chosen = _select(load_scenarios(args.scenarios_dir), args.scenario)
    err = Console(stderr=True)
    out = Console(stderr=bool(args.json))

    from .decider import Decider

    with err.status("loading model"):
        decider = Decider.load(args.model)
    per_run = (1 if "pcd" in methods else 0) + sum(m in methods for m in ("greedy", "constrained"))
    rss_methods = [] if args.no_rss else [m for m in METHODS if m in methods]
    results = []
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err,
        transient=bool(args.json),
    ) as progress:
        for sc in chosen:
            thr = args.throughput if sc.name == "triage" else 0
            total = per_run * (args.warmup + args.runs) + (2 if thr else 0) + len(rss_methods)
            task = progress.add_task(f"{sc.name}", total=total)

            def advance(label: str, task: Any = task, name: str = sc.name) -> None:
                progress.update(task, advance=1, description=f"{name}: {label}")

            r = measure(
                decider,
                sc,
                runs=args.runs,
                warmup=args.warmup,
                methods=methods,
                throughput=thr,
                advance=advance,
            )
            for m in rss_methods:
                probe = peak_rss(m, sc.name, args.scenarios_dir, args.model)
                key = "peak_rss_mb" if m == "pcd" else f"{m}_peak_rss_mb"
                r[key] = probe["peak_rss_mb"]
                r["rss_after_load_mb"] = probe["rss_after_load_mb"]
                advance(f"peak RSS {m}")
            if "peak_rss_mb" in r and "greedy_peak_rss_mb" in r:
                r["rss_ratio_vs_greedy"] = r["peak_rss_mb"] / r["greedy_peak_rss_mb"]
            results.append(r)
            if not args.json:
                _print_scenario(out, r)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        _summary(out, results)
    return 0


if __name__ == "__main__":  # the memory probe runs as `python -m pcd_tools.bench --probe ...`
    sys.exit(_probe(sys.argv[1:]))
