"""`pcd bench`: PCD against autoregressive baselines on the reference scenarios.

For each scenario, in one process on one model, every run times (after a warm-up):

- PCD cold (schema prefix not cached; the token plan is) and PCD warm (prefix cached);
- a bare prefill of the same prompt, the physical floor;
- greedy JSON generation and grammar-constrained generation, both reusing a KV cache of
  the schema part of the prompt;
- llama.cpp (the `peer` extra, `pcd_tools.baselines.llama_cpp`): the same GGUF, prompt ids and threads,
  grammar-constrained greedy decoding, cold and warm (schema part cached). Skipped with a
  message (`BenchPlan.skipped`) when `llama-cpp-python` is not installed.

Methods are interleaved within each run so drift on a busy machine hits them alike.
Peak RSS is measured per method in a fresh subprocess. Times are medians (min-max).

The scenarios live in the repository's `benchmarks/scenarios` package, found next to the
package directory of an editable install or given with `--scenarios-dir`.

`plan_bench` checks the options and picks the scenarios, `run_bench` times them and returns
one JSON-ready dict per scenario; `pcd bench` (`pcd_tools.cli.bench`) prints them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..baselines.llama_cpp import PEER
from ..errors import InvalidArgumentError
from .scenarios import _select, load_scenarios, peak_rss, probe

__all__ = [
    "ALL_METHODS",
    "METHODS",
    "PEER",
    "BenchPlan",
    "bench_scenario",
    "load_scenarios",
    "measure",
    "peak_rss",
    "plan_bench",
    "probe",
    "run_bench",
]

METHODS = ("pcd", "greedy", "constrained")
ALL_METHODS = (*METHODS, PEER)


# --- measurement -------------------------------------------------------------------------


def _stats(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def _cold_decide(decider: Any, schema: Any, context: str, scoring: str = "auto") -> Any:
    """A request whose schema prefix is not cached (its token plan is, as in production)."""
    from ..schema import compile_schema

    compiled = compile_schema(schema)
    decider.engine.clear_cache()
    decider.engine.plan(compiled)
    return decider.decide(compiled, context, scoring=scoring)


def measure(
    decider: Any,
    scenario: Any,
    *,
    runs: int = 5,
    warmup: int = 1,
    methods: tuple[str, ...] = METHODS,
    throughput: int = 0,
    advance: Any = None,
    scoring: str = "auto",
) -> dict[str, Any]:
    """Times one scenario; returns the scenario's JSON object (medians in ms).

    Args:
        decider: The loaded decider.
        scenario: A `Scenario` from the registry.
        runs: Timed runs per method.
        warmup: Untimed runs first (builds plans, caches and the grammar index).
        methods: Which of "pcd", "greedy", "constrained", "llamacpp" to time ("pcd"
            includes the bare prefill).
        throughput: If > 0, also time `decide_many` over this many contexts against as many
            sequential `decide` calls.
        advance: Called with a short label after each step (progress display).
        scoring: PCD's scoring (the baselines generate as they always do).
    """
    from ..baselines.generation import bare_prefill_ms, constrained_json, greedy_json
    from ..schema import compile_schema

    step = advance or (lambda label: None)
    compiled = compile_schema(scenario.schema)
    from ..baselines.llama_cpp import bench_peer, peer_keys

    peer = bench_peer(decider) if PEER in methods else None
    if PEER in methods and peer is None:
        methods = tuple(m for m in methods if m != PEER)
    ctx = scenario.context
    rec: dict[str, list[Any]] = {}

    def add(key: str, value: Any) -> None:
        rec.setdefault(key, []).append(value)

    for r in range(warmup + runs):
        timed = r >= warmup
        if "pcd" in methods:
            d = _cold_decide(decider, compiled, ctx, scoring)
            w = decider.decide(compiled, ctx, scoring=scoring)
            whole = (
                decider.decide(compiled, ctx, scoring=scoring, pruning="off")
                if w.certified is not None
                else None
            )
            b = bare_prefill_ms(decider, compiled, ctx)
            if timed:
                if whole is not None:  # a field was pruned: the exhaustive pass beside it
                    add("warm_whole", whole.elapsed_ms)
                    add("whole_agrees", whole.value == w.value)
                add("certified", w.certified is not False)
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
        if peer is not None:
            cold = peer.run(compiled, ctx, warm=False)
            bare = peer.eval_ms(compiled, ctx)
            warm = peer.run(compiled, ctx, warm=True)
            if timed:
                add(PEER, warm.wall_ms)
                add(f"{PEER}_cold", cold.wall_ms)
                add(f"{PEER}_prefill", warm.prefill_ms)
                add(f"{PEER}_cold_prefill", cold.prefill_ms)
                add(f"{PEER}_bare", bare)
                add(f"{PEER}_tokens", warm.tokens)
                add(f"{PEER}_match", warm.result.schema_match and cold.result.schema_match)
                add(f"{PEER}_text", warm.result.json_text)
                add(f"{PEER}_values", warm.result.values)
            step(PEER)

    out: dict[str, Any] = {
        "scenario": scenario.name,
        "title": scenario.title,
        "fields": len(compiled.fields),
        "choices": sum(f.cardinality for f in compiled.fields),
        "runs": runs,
        "model": decider.model_id,
        "device": decider.device,
        "compute": getattr(getattr(decider, "loaded", None), "compute", None),
        "reference": dict(scenario.reference),
        "scoring": scoring,
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
        out["certified"] = all(rec["certified"])
        if "warm_whole" not in rec:  # one fields pass, no pruned levels
            out.update(_pass_rates(decider, compiled, out))
        else:  # pruned fields: the same decision scored whole
            out["warm_exhaustive_ms"] = statistics.median(rec["warm_whole"])
            out["pruned_vs_exhaustive"] = out["warm_pcd_ms"] / out["warm_exhaustive_ms"]
            out["pruned_agrees"] = all(rec["whole_agrees"])
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
    if peer is not None:
        out.update(peer_keys(rec, out))
    if throughput > 0 and "pcd" in methods:
        out.update(_throughput(decider, compiled, scenario, throughput, step))
    return out


def _pass_rates(decider: Any, compiled: Any, out: dict[str, Any]) -> dict[str, Any]:
    """The cold request's two phases as rates: GFLOP and GFLOP/s of the prefill and of
    the fields pass (`engine.flops`), and the fields pass's rate over the prefill's.

    Only for packed fields passes without waves on a model whose arithmetic is known;
    otherwise empty. The caller leaves out pruned requests (several levels).
    """
    from ..answers.waves import has_waves
    from .flops import arithmetic

    engine = decider.engine
    ar = arithmetic(engine.passes.model)
    if ar is None or engine.default_mode != "packed" or has_waves(compiled):
        return {}
    plan = engine.plan(compiled)
    prompt = int(out["prompt_tokens"])
    prefill = ar.prefill(prompt)
    fields = ar.packed(plan.chunks, prompt)
    keys = {
        "prefill_gflop": prefill / 1e9,
        "fields_gflop": fields / 1e9,
        "prefill_gflops_per_s": prefill / 1e6 / out["prefill_ms"],
        "fields_gflops_per_s": fields / 1e6 / out["suffix_eval_ms"],
    }
    keys["fields_vs_prefill_rate"] = keys["fields_gflops_per_s"] / keys["prefill_gflops_per_s"]
    if getattr(decider.loaded, "compute", None) == "int8" and engine.device == "cpu":
        from ..engine.kernels.peak import int8_peak

        peak = int8_peak()  # measured once per process
        if peak is not None:  # the share of the CPU's int8 peak the prefill ran at
            keys["int8_peak_gops_per_s"] = peak.all_threads
            keys["int8_peak_path"] = peak.path
            keys["prefill_peak_share"] = keys["prefill_gflops_per_s"] / peak.all_threads
    return keys


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


# --- a whole run -------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchPlan:
    """What `run_bench` times, checked by `plan_bench`.

    Args:
        scenarios: The chosen `Scenario`s, in order.
        runs: Timed runs per method.
        warmup: Untimed runs first.
        methods: Which of `ALL_METHODS` to time.
        skipped: Why a method asked for was left out (the llama.cpp peer without its
            extra), or None.
        throughput: Contexts for the `decide_many` throughput run (triage only; 0 skips).
        rss_methods: Methods whose peak RSS is measured in a fresh process.
        scenarios_dir: Where the scenarios came from (the RSS probes read them again).
        model: The model source the RSS probes load.
        scoring: PCD's scoring, `"auto"`, `"full"` or `"constrained"` (`pruning="auto"`
            prunes large fields under auto and constrained scoring).
    """

    scenarios: tuple[Any, ...]
    runs: int = 5
    warmup: int = 1
    methods: tuple[str, ...] = METHODS
    skipped: str | None = None
    throughput: int = 32
    rss_methods: tuple[str, ...] = METHODS
    scenarios_dir: str | None = None
    model: str | None = None
    scoring: str = "auto"

    def throughput_for(self, scenario: Any) -> int:
        """Contexts of the throughput run for `scenario` (only triage has one)."""
        return self.throughput if scenario.name == "triage" else 0

    def steps(self, scenario: Any) -> int:
        """How many progress steps `bench_scenario` reports for `scenario`."""
        per_run = (1 if "pcd" in self.methods else 0) + sum(
            m in self.methods for m in ("greedy", "constrained", PEER)
        )
        thr = self.throughput_for(scenario)
        return per_run * (self.warmup + self.runs) + (2 if thr else 0) + len(self.rss_methods)


def plan_bench(
    *,
    scenarios: Sequence[str] | None = None,
    scenarios_dir: str | None = None,
    runs: int = 5,
    warmup: int = 1,
    methods: Sequence[str] = ALL_METHODS,
    throughput: int = 32,
    rss: bool = True,
    model: str | None = None,
    scoring: str = "auto",
) -> BenchPlan:
    """Checks the options and loads the chosen scenarios (nothing is timed yet).

    Args:
        scenarios: Scenario names; default all.
        scenarios_dir: The scenarios package directory; default `default_scenarios_dir()`.
        runs: Timed runs per method (>= 1).
        warmup: Untimed runs first (>= 0).
        methods: A non-empty subset of `ALL_METHODS`; `llamacpp` is left out, with the
            reason in `skipped`, when `llama-cpp-python` is not installed.
        throughput: Contexts for triage's `decide_many` run (0 skips).
        rss: Measure each method's peak RSS in a fresh process.
        model: The model source the RSS probes load.
        scoring: PCD's scoring, `"auto"`, `"full"` or `"constrained"`.

    Raises:
        InvalidArgumentError: on a bad count, method, scenario or scoring.
    """
    if scoring not in ("auto", "full", "constrained"):
        raise InvalidArgumentError(
            f"unknown --scoring {scoring!r}; accepted: 'auto', 'full', 'constrained'."
        )
    if runs < 1 or warmup < 0:
        raise InvalidArgumentError(
            f"--runs must be >= 1 and --warmup >= 0; got {runs} and {warmup}."
        )
    chosen_methods = tuple(methods)
    bad = [m for m in chosen_methods if m not in ALL_METHODS]
    if bad or not chosen_methods:
        raise InvalidArgumentError(
            f"unknown --methods {bad or chosen_methods}; accepted: {list(ALL_METHODS)}."
        )
    skipped = None
    if PEER in chosen_methods:
        from ..baselines.llama_cpp import peer_available

        why = peer_available()
        if why is not None:
            skipped = f"llama.cpp peer skipped: {why}"
            chosen_methods = tuple(m for m in chosen_methods if m != PEER)
            if not chosen_methods:
                raise InvalidArgumentError(skipped)
    chosen = _select(load_scenarios(scenarios_dir), list(scenarios) if scenarios else None)
    return BenchPlan(
        scenarios=tuple(chosen),
        runs=runs,
        warmup=warmup,
        methods=chosen_methods,
        skipped=skipped,
        throughput=throughput,
        rss_methods=tuple(m for m in METHODS if m in chosen_methods) if rss else (),
        scenarios_dir=scenarios_dir,
        model=model,
        scoring=scoring,
    )


def bench_scenario(
    decider: Any, scenario: Any, plan: BenchPlan, *, advance: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Times one scenario of `plan`, then its peak RSS per method.

    Args:
        decider: The loaded decider.
        scenario: One of `plan.scenarios`.
        plan: The checked options.
        advance: Called with a short label after each step (`plan.steps(scenario)` in all).

    Returns:
        The scenario's JSON object (see `measure`), with `peak_rss_mb`,
        `<method>_peak_rss_mb`, `rss_after_load_mb` and `rss_ratio_vs_greedy` when measured.
    """
    step = advance or (lambda label: None)
    r = measure(
        decider,
        scenario,
        runs=plan.runs,
        warmup=plan.warmup,
        methods=plan.methods,
        throughput=plan.throughput_for(scenario),
        advance=step,
        scoring=plan.scoring,
    )
    for m in plan.rss_methods:
        rss = peak_rss(m, scenario.name, plan.scenarios_dir, plan.model)
        key = "peak_rss_mb" if m == "pcd" else f"{m}_peak_rss_mb"
        r[key] = rss["peak_rss_mb"]
        r["rss_after_load_mb"] = rss["rss_after_load_mb"]
        step(f"peak RSS {m}")
    if "peak_rss_mb" in r and "greedy_peak_rss_mb" in r:
        r["rss_ratio_vs_greedy"] = r["peak_rss_mb"] / r["greedy_peak_rss_mb"]
    return r


def run_bench(
    decider: Any,
    plan: BenchPlan,
    *,
    advance: Callable[[str, str], None] | None = None,
) -> list[dict[str, Any]]:
    """Times every scenario of `plan`.

    Args:
        decider: The loaded decider.
        plan: The checked options, from `plan_bench`.
        advance: Called with the scenario's name and a short label after each step.

    Returns:
        One JSON object per scenario (see `bench_scenario`), in order.
    """
    results = []
    for sc in plan.scenarios:
        step = None if advance is None else (lambda label, n=sc.name: advance(n, label))
        results.append(bench_scenario(decider, sc, plan, advance=step))
    return results
