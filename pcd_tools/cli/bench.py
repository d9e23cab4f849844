"""`pcd bench`: PCD against autoregressive baselines on the reference scenarios.

The timing lives in `pcd_tools.bench.run`; this module parses the options, shows progress
and prints the seed's format and a summary table, or JSON with `--json`.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..bench import run as bench
from ..bench.run import ALL_METHODS
from ..errors import InvalidArgumentError
from ._common import UsageError, check_at_least

HELP = "benchmark PCD against autoregressive baselines"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `pcd bench` options (the dispatcher adds `--model` and `--json`).

    Args:
        parser: The sub-command's parser.
    """
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
        default=",".join(ALL_METHODS),
        help="comma-separated subset of pcd,greedy,constrained,llamacpp (llamacpp: the "
        "llama.cpp peer, from the `peer` extra; skipped with a message when missing)",
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
    parser.add_argument(
        "--scenarios-dir",
        default=None,
        help="path of benchmarks/scenarios (the scenarios, and --lengths-schema triage)",
    )
    parser.add_argument(
        "--scoring",
        choices=["auto", "full", "constrained"],
        default="auto",
        help="PCD's scoring (default auto: full, except large fields, which are scored "
        "constrained and pruned with certified bounds); a pruned field is timed against "
        "the exhaustive pass too",
    )
    parser.add_argument(
        "--lengths",
        default=None,
        metavar="N,N,...",
        help="run the long-input sweep instead of the scenarios: context tokens per length, "
        "positive whole numbers separated by commas (e.g. 256,1024,2048); times PCD warm, "
        "cold and its floor, and llama.cpp's eval and decision when --methods has llamacpp "
        "and the peer extra is installed; --runs rounds a length, --warmup untimed rounds "
        "first; not with --scenario (docs/long-inputs-benchmarks.md)",
    )
    parser.add_argument(
        "--lengths-schema",
        choices=["small", "triage"],
        default=None,
        help="the --lengths sweep's schema: small (one bool and one 4-way field; the "
        "default) or triage (the triage scenario's 28 fields, from --scenarios-dir)",
    )


def run(args: argparse.Namespace) -> int:
    """Runs the benchmark; prints the seed's format and a table, or JSON with `--json`.

    Args:
        args: The parsed arguments.

    Returns:
        The exit code: 2 for a bad option (checked before the model loads).
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    if args.lengths is not None:
        return run_lengths(args)
    if args.lengths_schema is not None:
        raise UsageError(
            f"--lengths-schema {args.lengths_schema} is the schema of the --lengths sweep; "
            "give --lengths too (e.g. --lengths 256,1024,2048)."
        )
    check_at_least(args, 0, "throughput")
    try:
        plan = bench.plan_bench(
            scenarios=args.scenario,
            scenarios_dir=args.scenarios_dir,
            runs=args.runs,
            warmup=args.warmup,
            methods=[m.strip() for m in str(args.methods).split(",") if m.strip()],
            throughput=args.throughput,
            rss=not args.no_rss,
            model=args.model,
            scoring=args.scoring,
        )
    except InvalidArgumentError as e:  # every plan error is about an option
        raise UsageError(str(e)) from e
    err = Console(stderr=True)
    out = Console(stderr=bool(args.json))
    if plan.skipped:
        err.print(plan.skipped, highlight=False)

    from ..decide.decider import Decider
    from ..engine.load.sources import model_source

    with err.status("loading model"):
        decider = Decider.load(model_source(args.model))
    results = []
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err,
        transient=bool(args.json),
    ) as progress:
        for sc in plan.scenarios:
            task = progress.add_task(f"{sc.name}", total=plan.steps(sc))

            def advance(label: str, task: Any = task, name: str = sc.name) -> None:
                progress.update(task, advance=1, description=f"{name}: {label}")

            r = bench.bench_scenario(decider, sc, plan, advance=advance)
            results.append(r)
            if not args.json:
                print_scenario(out, r)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_summary(out, results)
    return 0


def run_lengths(args: argparse.Namespace) -> int:
    """`pcd bench --lengths`: the long-input sweep (`pcd_tools.bench.long_inputs`) on
    `--model`; prints its Markdown tables, or its JSON with `--json`. Progress goes to stderr.

    Args:
        args: The parsed arguments.

    Returns:
        The exit code.

    Raises:
        UsageError: for a bad `--lengths`, `--runs`, `--warmup`, `--methods` or
            `--lengths-schema` (triage without the scenarios), or `--scenario` beside
            `--lengths` (checked before the model loads).
    """
    import sys

    from ..baselines.llama_cpp import PEER, peer_available
    from ..bench import long_inputs
    from ..engine.load.sources import model_source

    if args.scenario:
        raise UsageError(
            "--lengths runs the long-input sweep and --scenario the scenarios: give one of "
            f"them (got --scenario {' '.join(args.scenario)}); run `pcd bench` twice for both."
        )
    check_at_least(args, 1, "runs")
    check_at_least(args, 0, "warmup")
    methods = [m.strip() for m in str(args.methods).split(",") if m.strip()]
    bad = [m for m in methods if m not in ALL_METHODS]
    if bad or not methods:
        raise UsageError(f"unknown --methods {bad or methods}; accepted: {list(ALL_METHODS)}.")
    if "pcd" not in methods:
        raise UsageError(
            f"--lengths always times PCD (warm, cold and its floor): --methods must include "
            f"pcd (and llamacpp for llama.cpp's columns); got {','.join(methods)}."
        )
    schema = args.lengths_schema or "small"
    try:
        lengths = long_inputs.parse_lengths(args.lengths)
        long_inputs.schema_of(schema, args.scenarios_dir, "--lengths-schema")
    except InvalidArgumentError as e:
        raise UsageError(str(e)) from e
    no_peer = None if PEER in methods else f"--methods has no {PEER}"
    if no_peer is None and (why := peer_available()) is not None:
        no_peer = why

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    options = long_inputs.SweepOptions(
        lengths=tuple(lengths),
        model=model_source(args.model),
        schema=schema,
        rounds=args.runs,
        warmup=args.warmup,
        no_peer=no_peer,
        scenarios_dir=args.scenarios_dir,
    )
    out = long_inputs.run(options, log=log)
    print(json.dumps(out, indent=2, default=str) if args.json else long_inputs.table(out))
    return 0


def _fmt_line(label: str, ms: float, lo: float, hi: float, tail: str) -> str:
    return f"{label:<15}: {ms:8.1f} ms ({lo:.0f}-{hi:.0f}) | {tail}"


def print_scenario(console: Any, r: dict[str, Any]) -> None:
    """Prints one scenario's result in the seed's format.

    Args:
        console: A rich Console.
        r: One result of `pcd_tools.bench.run.bench_scenario`.
    """
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
    if "llamacpp_ms" in r:
        console.print(
            _fmt_line(
                "llama.cpp",
                r["llamacpp_ms"],
                r["llamacpp_ms_min"],
                r["llamacpp_ms_max"],
                f"{r['llamacpp_tokens']} tokens | cold {r['llamacpp_cold_ms']:.1f} ms | valid "
                f"{r['llamacpp_schema_match']} | agrees with PCD on "
                f"{100 * r.get('llamacpp_agreement', 0):.0f}% of fields",
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
    if "warm_exhaustive_ms" in r:
        console.print(
            f"{'  pruned':<16}certified {r['certified']} | scored whole: "
            f"{r['warm_exhaustive_ms']:.1f} ms ({r['pruned_vs_exhaustive']:.2f}x), same answer "
            f"{r['pruned_agrees']}",
            highlight=False,
        )
    if "speedup_vs_greedy" in r:
        extra = (
            f" (vs constrained: {r['speedup_vs_constrained']:.1f}x)"
            if "speedup_vs_constrained" in r
            else ""
        )
        if "speedup_vs_llamacpp" in r:
            extra += f" (vs llama.cpp: {r['speedup_vs_llamacpp']:.1f}x)"
        console.print(f"SPEEDUP: {r['speedup_vs_greedy']:.1f}x{extra}", highlight=False)


def print_summary(console: Any, results: list[dict[str, Any]]) -> None:
    """Prints the summary table and the throughput lines.

    Args:
        console: A rich Console.
        results: The results of every scenario.
    """
    from rich.table import Table

    t = Table(title="pcd bench (medians, ms)")
    for col in (
        "scenario",
        "fields",
        "greedy",
        "tokens",
        "constrained",
        "llama.cpp",
        "PCD warm",
        "PCD cold",
        "bare prefill",
        "vs greedy",
        "vs constrained",
        "vs llama.cpp",
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
            f(r, "llamacpp_ms"),
            f(r, "warm_pcd_ms"),
            f(r, "pcd_ms"),
            f(r, "bare_prefill_ms"),
            f(r, "speedup_vs_greedy", "{:.1f}x"),
            f(r, "speedup_vs_constrained", "{:.1f}x"),
            f(r, "speedup_vs_llamacpp", "{:.1f}x"),
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
