"""What one generated token costs: MLX float32, native 8-bit (one row, eight rows), llama.cpp.

On the embedded model (or `--model`, a GGUF file), the same prompt token ids (the prompt
of a hybrid schema, `reason: str` then `route: Literal[...]`, on a support ticket) are
prefilled once per method (not timed); then `--tokens` unconstrained greedy steps are
timed, each step being the model call and the argmax:

- **mlx**: the old path, one MLX float32 call per token (`generate.forward`);
- **native B=1**: one native step per token (`fast_decode`);
- **native B=8 / row**: one native step for 8 independent sequences (8 tickets), divided by 8;
- for a GGUF kept encoded (`--model`, 0.5B and larger), each of these for every form of
  `NativeDecoder`: the file's blocks with 8-bit activations (what `compute="int8"`
  decodes with), the file's blocks with float32 activations, and the 8-bit copy;
- **llama.cpp**: `llama_cpp.Llama.eval` on the same GGUF file and the same ids, with the
  same thread count and `logits_all=False` (skipped with a note when `llama_cpp` is not
  importable: `pip install 'pcd-tools[peer]'`).

The methods alternate within each round (the order rotates), so all of them see the same
background load; the table gives the median and range over rounds, and the ratio to
llama.cpp is the median of the per-round ratios. Exactness: on ~10 tickets, `decide_many`
with `decode="int8"` against `decode="mlx"`: the largest difference of the scored
field's probabilities and how many generated texts differ (with their wall times).

Both native and llama.cpp run on `--threads` threads (default: the usable CPUs), fixed
(the native decoder's thread tuning is off). llama.cpp's extra weight buffers are off
unless `--llama-extra-bufts`: its AMX kernels raise SIGILL on VMs without AMX tiles.

Measured on the 2-core AVX-512 VM this was written on, other jobs holding a load
average of ~4 (SmolLM2-135M Q4_1, 137-token prompt, 32 tokens x 7 rounds):

| threads | mlx float32 | int8 B=1 | int8 B=8 / row | llama.cpp | int8 B=1 / llama.cpp |
|---|---|---|---|---|---|
| 1 | 180.6 ms | 20.6 ms | 9.4 ms | 27.5 ms | 0.75x |
| 2 | 186.7 ms | 29.6 ms | 10.3 ms | 210-3400 ms | llama.cpp collapses |

(llama.cpp's spinning barriers lose whole time slices when its 2 threads share the 2
cores with other work; on a quiet moment it measured 14 ms with 2 threads.) Exactness on
10 tickets: max |delta P(route)| 8.5e-7, 0/10 generated reasons differ.

Usage:
    .venv/bin/python benchmarks/decode_speed.py --tokens 32 --rounds 5
    .venv/bin/python benchmarks/decode_speed.py --threads 1 --rounds 7 --json decode_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pcd_tools import Decider
from pcd_tools.engine.host.threads import thread_budget

TICKETS = [
    "I was charged twice for my subscription this month, please refund one payment.",
    "The app crashes every time I open the settings page on Android 14.",
    "We want to upgrade to the enterprise plan for 40 seats; who can send a quote?",
    "My password reset e-mail never arrives, so I cannot log in at all.",
    "Your API returns HTTP 500 on every webhook since last night; orders are stuck.",
    "Can I get an invoice with our VAT number on it for last quarter?",
    "Is there a discount for non-profits if we buy a yearly licence?",
    "Exports to CSV silently drop every row after the first thousand.",
    "I cancelled in March but you still took money in April and May.",
    "Do you offer on-site training for a team of twelve next month?",
]


class Route(BaseModel):
    """Route a customer support message to the right team."""

    reason: str = Field(max_length=48, description="One short sentence on what the customer needs")
    route: Literal["billing", "technical", "sales"] = Field(description="The team that handles it")


def prompt_ids(decider: Decider, text: str) -> list[int]:
    from pcd_tools.schema import compile_schema

    eng = decider.engine
    plan = eng.plan(compile_schema(Route))
    return plan.head_ids + eng.encode_ids(text) + plan.tail_ids


def _prefill(decider: Decider, ids: list[int]) -> tuple[list[Any], np.ndarray]:
    from mlx_lm.models.cache import make_prompt_cache

    from pcd_tools.engine.decode.generate import forward
    from pcd_tools.engine.host.blas import import_mlx

    mx = import_mlx()
    cache = make_prompt_cache(decider.engine.model)
    with mx.stream(decider.engine.stream):
        logits = forward(decider.engine.passes, ids, cache)
    return cache, logits


def mlx_run(decider: Decider, ids: list[int], n: int) -> float:
    """ms per token of MLX float32 greedy steps after the prompt."""
    from pcd_tools.engine.decode.generate import forward
    from pcd_tools.engine.host.blas import import_mlx

    mx = import_mlx()
    cache, logits = _prefill(decider, ids)
    with mx.stream(decider.engine.stream):
        t0 = time.perf_counter()
        for _ in range(n):
            logits = forward(decider.engine.passes, [int(np.argmax(logits))], cache)
        return (time.perf_counter() - t0) * 1e3 / n


def native_run(decoder: Any, prefilled: list[tuple[list[Any], np.ndarray]], n: int) -> float:
    """ms per token and row of native greedy steps for the rows of `prefilled` at once."""
    st = decoder.stepper([c for c, _ in prefilled], n)
    toks = [int(np.argmax(lg)) for _, lg in prefilled]
    t0 = time.perf_counter()
    for _ in range(n):
        out = st.step(toks)
        toks = [int(t) for t in out.argmax(axis=1)]
    ms = (time.perf_counter() - t0) * 1e3 / n / len(prefilled)
    st.close()
    return ms


def llama_cpp_runner(
    path: str, threads: int, ctx: int, extra_bufts: bool
) -> Callable[[list[int], int], float] | str:
    """A runner of llama.cpp greedy steps, or why there is none. `extra_bufts`: llama.cpp's
    extra weight buffers (AMX, repacked layouts); off by default, as AMX code raises
    SIGILL where the hypervisor does not enable AMX tiles (this machine)."""
    try:
        import llama_cpp
        import llama_cpp.llama_cpp as lib

        from pcd_tools.baselines.llama_cpp import settle
    except ImportError as e:
        return f"llama_cpp is not importable ({e}); pip install 'pcd-tools[peer]'"
    default = lib.llama_model_default_params

    def params() -> Any:  # no extra buffer types: AMX tiles fault (SIGILL) in some VMs
        p = default()
        p.use_extra_bufts = extra_bufts
        return p

    lib.llama_model_default_params = params
    try:
        llm = llama_cpp.Llama(
            model_path=path,
            n_threads=threads,
            n_threads_batch=threads,
            n_ctx=ctx,
            logits_all=False,
            verbose=False,
        )
    finally:
        lib.llama_model_default_params = default

    def run(ids: list[int], n: int) -> float:
        llm.reset()
        llm.eval(ids)
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t0 = time.perf_counter()
        for _ in range(n):
            llm.eval([t])
            t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        ms = (time.perf_counter() - t0) * 1e3 / n
        settle()  # llama.cpp's OpenMP threads spin on: the next method gets a quiet CPU
        return ms

    return run


def _form(d: Any) -> tuple[str, str]:
    """A decoder's weights form, and its label."""
    if not d.mapped_bytes:
        return "copy", "8-bit copy"
    if d.activations == "int8":
        return "file", "file blocks, int8 activations"
    return "file", "file blocks"


def speed(decider: Decider, args: argparse.Namespace) -> dict[str, Any]:
    from pcd_tools.engine.decode.native_steps import decoder_for

    decoder = decoder_for(decider.engine)
    if decoder is None:
        raise SystemExit("native decoding is unavailable here (decode='auto' fell back to MLX)")
    ids = prompt_ids(decider, TICKETS[0])
    one = [_prefill(decider, ids)]
    eight = [_prefill(decider, prompt_ids(decider, t)) for t in TICKETS[:8]]
    decoders = [decoder]
    if getattr(decider.engine.model.model.embed_tokens, "gguf_encoded", False):  # encoded
        from pcd_tools.engine.decode.native_steps import NativeDecoder

        for weights, act in (("file", "int8"), ("file", "float32"), ("copy", "float32")):
            if (weights, act) != (_form(decoder)[0], decoder.activations):
                decoders.append(  # the other forms too
                    NativeDecoder(
                        decider.engine.model,
                        weights=weights,
                        activations=act,
                        threads=decoder.threads,
                    )
                )
    methods: dict[str, Callable[[], float]] = {}
    if not args.no_mlx:
        methods["mlx float32"] = lambda: mlx_run(decider, ids, args.tokens)
    for d in decoders:
        form = _form(d)[1]
        methods[f"native {form} B=1"] = lambda d=d: native_run(d, one, args.tokens)
        methods[f"native {form} B=8 (per row)"] = lambda d=d: native_run(d, eight, args.tokens)
    skipped = None
    path = decider.loaded.path
    if path.endswith(".gguf"):
        runner = llama_cpp_runner(
            path, decoder.threads, len(ids) + args.tokens + 64, args.llama_extra_bufts
        )
        if isinstance(runner, str):
            skipped = runner
        else:
            methods["llama.cpp"] = lambda: runner(ids, args.tokens)
    else:
        skipped = f"{decider.model_id} is not a GGUF file"
    for fn in methods.values():  # warm-up: caches, pages, thread pools
        fn()
    times: dict[str, list[float]] = {m: [] for m in methods}
    names = list(methods)
    for r in range(args.rounds):
        for m in names[r % len(names) :] + names[: r % len(names)]:
            times[m].append(methods[m]())
    return {
        "prompt_tokens": len(ids),
        "tokens": args.tokens,
        "rounds": args.rounds,
        "threads": decoder.threads,
        "isa": decoder.isa,
        "quantize_ms": decoder.quantize_ms,
        "build_ms": decoder.build_ms,
        "weights_mb": decoder.nbytes / 1e6,
        "file_blocks_mb": max(d.mapped_bytes for d in decoders) / 1e6,
        "copy_mb": max(d.nbytes for d in decoders) / 1e6,
        "ms_per_token": times,
        "llama_cpp_skipped": skipped,
        "llama_cpp_extra_bufts": args.llama_extra_bufts,
    }


def exactness(decider: Decider, n: int) -> dict[str, Any]:
    """decide_many with decode='int8' against decode='mlx' on the same loaded model."""
    mlx = Decider(decider.loaded, decode="mlx")
    texts = (TICKETS * (n // len(TICKETS) + 1))[:n]
    out = {}
    for name, d in (("int8", decider), ("mlx", mlx)):
        d.decide_many(Route, texts[:2], max_new_tokens=24)  # warm the schema prefix
        t0 = time.perf_counter()
        out[name] = d.decide_many(Route, texts, max_new_tokens=24, batch_size=n)
        out[name + "_ms"] = (time.perf_counter() - t0) * 1e3 / n
    dp = max(
        max(
            abs(a.fields["route"].distribution[k] - b.fields["route"].distribution[k])
            for k in a.fields["route"].distribution
        )
        for a, b in zip(out["int8"], out["mlx"])
    )
    differ = sum(a.value.reason != b.value.reason for a, b in zip(out["int8"], out["mlx"]))
    return {
        "contexts": n,
        "max_route_probability_diff": dp,
        "reasons_that_differ": differ,
        "ms_per_decision_int8": out["int8_ms"],
        "ms_per_decision_mlx": out["mlx_ms"],
    }


def report(res: dict[str, Any], ex: dict[str, Any] | None) -> None:
    t = res["ms_per_token"]
    print(
        f"{platform.machine()}, {res['threads']} threads, ISA {res['isa']}, prompt "
        f"{res['prompt_tokens']} tokens, {res['tokens']} tokens x {res['rounds']} rounds, "
        f"load average {os.getloadavg()[0]:.1f}; "
        + (
            f"file blocks read in place: {res['file_blocks_mb']:.0f} MB (an 8-bit copy: "
            f"{res['copy_mb']:.0f} MB), packing {res['quantize_ms']:.0f} ms"
            if res.get("file_blocks_mb")
            else f"packing the 8-bit weights ({res['weights_mb']:.0f} MB) took "
            f"{res['quantize_ms']:.0f} ms"
        )
    )
    print()
    print("| method | ms / token (median) | range | vs llama.cpp |")
    print("|---|---|---|---|")
    ref = t.get("llama.cpp")
    for m, v in t.items():
        ratio = "-"
        if ref:
            ratio = f"{statistics.median(a / b for a, b in zip(v, ref)):.2f}x"
        print(f"| {m} | {statistics.median(v):.1f} | {min(v):.1f}-{max(v):.1f} | {ratio} |")
    if res["llama_cpp_skipped"]:
        print(f"\nllama.cpp: skipped ({res['llama_cpp_skipped']})")
    if ex:
        print(
            f"\nExactness over {ex['contexts']} tickets (decide_many, reason then route): max "
            f"|Δ P(route)| int8 vs mlx = {ex['max_route_probability_diff']:.2e}; generated "
            f"reasons that differ: {ex['reasons_that_differ']}/{ex['contexts']}; ms per "
            f"decision int8 {ex['ms_per_decision_int8']:.0f}, mlx {ex['ms_per_decision_mlx']:.0f}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a GGUF file (default: the embedded model)")
    p.add_argument("--tokens", type=int, default=32, help="greedy steps timed per run")
    p.add_argument("--rounds", type=int, default=5, help="rounds (>= 3), methods alternate")
    p.add_argument("--contexts", type=int, default=10, help="tickets for the exactness check")
    p.add_argument("--no-exactness", action="store_true")
    p.add_argument("--no-mlx", action="store_true", help="leave out MLX float32 steps (slow)")
    p.add_argument("--threads", type=int, default=None, help="default: the usable CPUs")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument(
        "--llama-extra-bufts",
        action="store_true",
        help="let llama.cpp use its extra weight buffers (AMX, repacking); off: AMX faults here",
    )
    args = p.parse_args(argv)
    if args.rounds < 3:
        p.error("--rounds must be at least 3")
    threads = args.threads or thread_budget()
    os.environ["PCD_DECODE_THREADS"] = str(threads)
    decider = Decider.load(args.model, decode="int8")
    res = speed(decider, args)
    ex = None if args.no_exactness else exactness(decider, args.contexts)
    report(res, ex)
    if args.json:
        Path(args.json).write_text(json.dumps({**res, "exactness": ex}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
