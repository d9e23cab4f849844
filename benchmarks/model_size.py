"""Model size and memory: load time, RSS and request times from the embedded model to a 7B.

For each model, each measurement in a fresh process (so that one model's pages and
allocations never count against another's), on the CPU:

- **load s**: `Decider.load(path, dtype=...)` with the file in the page cache;
- **RSS after load** (`VmRSS`), and the **peak RSS during a triage request**: the
  high-water mark (`VmHWM`, reset after the load through `/proc/self/clear_refs`) of the
  first, cold `triage` request;
- **cold and warm ms** of the `fraud` and `triage` scenarios (`pcd_tools.bench.scenarios`):
  cold = the schema prefix not cached (its token plan is), warm = cached; the scenarios
  alternate within each run; medians and ranges over the runs;
- the **prefill rate** of the cold request (its prefill FLOPs, `engine.flops`, over its
  prefill time) as a fraction of this CPU's **sgemm rate** (float32 GEMM, 512 x 2048 by
  2048 x 2048, through the bound BLAS on the engine's threads), measured in the same
  process right after its requests (on a shared machine the rate moves from minute to
  minute); once per run also at larger shapes, beside the **memory bandwidth** (one-thread
  copy of 256 MiB);
- for the file's encoding (`dtype="quantized"`: matrices kept as the file stores them,
  memory-mapped; what `dtype="auto"` loads unless dense float32 copies take at most 1 GiB,
  as for the embedded model; "auto"/"encoded" in the JSON and tables) and
  `dtype="float32"` (dense float32 weights), float32 only where it fits in RAM (not for
  the 3B and 7B shapes, whose dense weights would take 13 and 30 GB); the two modes'
  probabilities are compared (issue 30: within 1e-5);
- llama.cpp beside it (the `peer` extra: `pcd_tools.baselines.llama_cpp.LlamaCppPeer` on
  the same file, prompt ids and threads, 4096-token context, grammar-constrained greedy
  decoding): its load s, the RSS its `Llama` adds, and its cold and warm ms. Skipped with a
  message when `llama_cpp` does not import.

The models: the embedded SmolLM2-135M; Qwen2.5-Coder-0.5B and 1.5B-Instruct Q4_K_M (fetch
them with `python ../shared/models/fetch.py NAME`; a missing one is skipped with that
command); and two llama-architecture files of Qwen2.5-3B and Qwen2.5-7B shape with random
4-bit weights, written by this script into the models cache ($PCD_MODELS_DIR, else
~/.cache/pcd-tools/models; reused when present, never part of the repository). Their
matrices are valid random Q4_K blocks (finite fp16 scales), the output head Q6_K, as a
Q4_K_M file holds them; their tokenizer is copied from the 0.5B file (the Qwen2.5
vocabulary, so the embedding and head have the real size), or from the embedded model
when the 0.5B is not there. Random weights are for speed and memory only: their answers
mean nothing. The writer streams one tensor at a time (the largest, the 7B's head, is
0.45 GB), so it never holds the model in memory.

Usage:

    python benchmarks/model_size.py                          # every model, default runs
    python benchmarks/model_size.py --models embedded,0.5b --runs 5
    python benchmarks/model_size.py --json benchmarks/results/model_size.json
    python benchmarks/model_size.py --from-json benchmarks/results/model_size.json   # print tables
    python benchmarks/model_size.py --json all.json --merge big.json small.json
    python benchmarks/model_size.py --json run.json --peer-only     # add llama.cpp later
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCENARIOS = ("fraud", "triage")
SHORT_CONTEXT = "I was charged twice for my subscription this month; please refund one payment."
PEER_CTX = 4096


@dataclass(frozen=True)
class Shape:
    """A llama-architecture model shape for `write_random_gguf`.

    Args:
        name: Short name (`3b`, `7b`, `tiny`).
        hidden: Embedding width (a multiple of 256: whole Q4_K blocks).
        layers: Transformer blocks.
        ffn: MLP width (a multiple of 256).
        heads: Query heads.
        kv_heads: Key/value heads.
        tied: No separate output head (the embedding is the head).
        about: What the shape copies.
    """

    name: str
    hidden: int
    layers: int
    ffn: int
    heads: int
    kv_heads: int
    tied: bool
    about: str


SHAPES = {
    "tiny": Shape("tiny", 256, 2, 512, 4, 2, False, "test shape"),
    "3b": Shape("3b", 2048, 36, 11008, 16, 2, True, "Qwen2.5-3B: d=2048, 36 layers, tied head"),
    "7b": Shape("7b", 3584, 28, 18944, 28, 4, False, "Qwen2.5-7B: d=3584, 28 layers"),
}

# ggml block layouts: bytes per block of 256 weights, and where the fp16 scales sit.
_Q4_K, _Q6_K = 144, 210


def models_dir() -> Path:
    """The models cache: $PCD_MODELS_DIR, else ~/.cache/pcd-tools/models (as fetch.py)."""
    return Path(os.environ.get("PCD_MODELS_DIR", str(Path.home() / ".cache/pcd-tools/models")))


def _random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """File bytes of a random [rows, cols] Q4_K or Q6_K matrix: random quants and sub-block
    scales, fp16 super-block scales drawn so weights stay around +-0.1 (finite; a forward
    pass over 28 random layers neither overflows nor saturates)."""
    size = _Q4_K if kind == "Q4_K" else _Q6_K
    nb = rows * cols // 256
    b = np.frombuffer(rng.bytes(nb * size), dtype=np.uint8).reshape(nb, size).copy()
    if kind == "Q4_K":  # d, dmin (fp16) first, then 12 bytes of 6-bit scales, 128 of quants
        d = rng.uniform(1e-4, 4e-4, (nb, 2)).astype(np.float16)
        b[:, 0:4] = d.view(np.uint8).reshape(nb, 4)
    else:  # ql[128], qh[64], scales[16] (int8), d (fp16) last
        d = rng.uniform(1e-5, 4e-5, (nb, 1)).astype(np.float16)  # int8 sub-scales: smaller d
        b[:, 208:210] = d.view(np.uint8).reshape(nb, 2)
    return b.reshape(rows, cols // 256 * size)


def _tensor_plan(shape: Shape, vocab: int) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, type, shape: (out, in) for a matrix, (n,) for a vector) in llama.cpp's order."""
    s = shape
    head_dim = s.hidden // s.heads
    plan: list[tuple[str, str, tuple[int, ...]]] = [
        ("token_embd.weight", "Q4_K", (vocab, s.hidden))
    ]
    for i in range(s.layers):
        p = f"blk.{i}."
        plan += [
            (p + "attn_norm.weight", "F32", (s.hidden,)),
            (p + "attn_q.weight", "Q4_K", (s.heads * head_dim, s.hidden)),
            (p + "attn_k.weight", "Q4_K", (s.kv_heads * head_dim, s.hidden)),
            (p + "attn_v.weight", "Q4_K", (s.kv_heads * head_dim, s.hidden)),
            (p + "attn_output.weight", "Q4_K", (s.hidden, s.heads * head_dim)),
            (p + "ffn_norm.weight", "F32", (s.hidden,)),
            (p + "ffn_gate.weight", "Q4_K", (s.ffn, s.hidden)),
            (p + "ffn_up.weight", "Q4_K", (s.ffn, s.hidden)),
            (p + "ffn_down.weight", "Q4_K", (s.hidden, s.ffn)),
        ]
    plan.append(("output_norm.weight", "F32", (s.hidden,)))
    if not s.tied:
        plan.append(("output.weight", "Q6_K", (vocab, s.hidden)))
    return plan


def write_random_gguf(
    path: str | os.PathLike[str],
    shape: Shape,
    tokenizer_from: str | os.PathLike[str],
    seed: int = 0,
) -> Path:
    """Writes a llama-architecture GGUF of `shape` with random 4-bit weights, streamed.

    The tensor infos go first, then each tensor's bytes are drawn and written one at a
    time, so memory holds at most one tensor. The file is written under a temporary name
    and renamed when complete, so an interrupted run never leaves a file that looks whole.

    Args:
        path: Where to write the `.gguf` file.
        shape: The model shape (`SHAPES`).
        tokenizer_from: A GGUF file whose `tokenizer.*` metadata (vocabulary, merges,
            special tokens, chat template) is copied; its vocabulary size is the model's.
        seed: The random seed of the weights.

    Returns:
        The path written.

    Raises:
        InvalidArgumentError: if a width of the shape is not a multiple of 256.
    """
    import gguf

    reader = gguf.GGUFReader(os.fspath(tokenizer_from))
    tok_fields = {k: f for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    vocab = len(tok_fields["tokenizer.ggml.tokens"].contents())
    from pcd_tools.errors import InvalidArgumentError

    for width in (shape.hidden, shape.ffn):
        if width % 256:
            raise InvalidArgumentError(
                f"shape {shape.name!r}: hidden and ffn widths must be whole Q4_K blocks "
                f"(multiples of 256); got {width}."
            )
    out = Path(path)
    tmp = out.with_name(out.name + ".part")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(f"random-llama-{shape.name}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    w.add_context_length(32768)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1_000_000.0)
    w.add_vocab_size(vocab)
    for key, field in tok_fields.items():
        vtype = gguf.GGUFValueType(field.types[0])
        sub = gguf.GGUFValueType(field.types[1]) if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub)
    del reader, tok_fields
    plan = _tensor_plan(shape, vocab)
    T = gguf.GGMLQuantizationType
    for name, kind, dims in plan:
        if kind == "F32":
            w.add_tensor_info(name, dims, np.dtype(np.float32), 4 * dims[0])
        else:
            rows, cols = dims
            size = _Q4_K if kind == "Q4_K" else _Q6_K
            byte_shape = (rows, cols // 256 * size)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), rows * byte_shape[1], T[kind])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for _name, kind, dims in plan:
        if kind == "F32":
            w.write_tensor_data((1.0 + 0.1 * rng.standard_normal(dims[0])).astype(np.float32))
        else:
            w.write_tensor_data(_random_blocks(kind, dims[0], dims[1], rng))
    w.close()
    tmp.replace(out)
    return out


# --- the models -----------------------------------------------------------------------------

REAL = {
    "0.5b": ("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
    "1.5b": ("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
}
ALL_MODELS = ("embedded", "0.5b", "1.5b", "3b", "7b")
FLOAT32_MODELS = ("embedded", "0.5b", "1.5b")


def model_file(name: str, log: Any = print) -> Path | None:
    """The GGUF of a model name (writing a random one if needed); None with a message when
    a real model has not been fetched."""
    from pcd_tools.engine.load.sources import embedded_model_path

    if name == "embedded":
        return embedded_model_path()
    if name in REAL:
        fetch_name, file = REAL[name]
        path = models_dir() / file
        if path.is_file():
            return path
        log(
            f"{name}: {path} not found; fetch it with `python ../shared/models/fetch.py {fetch_name}`"
        )
        return None
    shape = SHAPES[name]
    qwen = models_dir() / REAL["0.5b"][1]
    tok, tag = (qwen, "qwen2tok") if qwen.is_file() else (embedded_model_path(), "smollm2tok")
    path = models_dir() / f"random-llama-{name}-q4_k-{tag}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        write_random_gguf(path, shape, tok)
        log(
            f"{name}: wrote {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.0f} s"
        )
    return path


# --- the children -----------------------------------------------------------------------------


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # VmHWM := VmRSS
        return True
    except OSError:
        return False


def _distributions(result: Any) -> dict[str, list[float]]:
    return {k: [float(p) for p in f.distribution.values()] for k, f in result.fields.items()}


def child_pcd(
    path: str, dtype: str, runs: int, warmup: int, first: str = "triage"
) -> dict[str, Any]:
    """One model in this process: load and RSS, then per run a cold and a warm request of
    each scenario (`first` first: the peak RSS is the very first, cold request's), the
    prefill rate and the probabilities. The first run's cold requests include the first
    touch of the weights (encoded: page faults on the mapped file).

    After the load and after every request it prints what it has so far as one JSON line,
    so that a process stopped at its time limit still reports what it measured.
    """
    from pcd_tools.bench.flops import arithmetic
    from pcd_tools.bench.run import _cold_decide
    from pcd_tools.bench.scenarios import load_scenarios
    from pcd_tools.decide.decider import Decider
    from pcd_tools.schema import compile_schema

    scenarios = load_scenarios()
    compiled = {n: compile_schema(scenarios[n].schema) for n in SCENARIOS}
    rss0 = _status_kb("VmRSS")
    t0 = time.perf_counter()
    # "int8": the file's encoding with the int8 kernels (`compute="int8"`)
    decider = (
        Decider.load(path, dtype="quantized", compute="int8")
        if dtype == "int8"
        else Decider.load(path, dtype=dtype, compute="float32")  # auto may pick int8
    )
    load_s = time.perf_counter() - t0
    out: dict[str, Any] = {
        "load_s": load_s,
        "rss_before_load_mb": rss0 / 1024,
        "rss_after_load_mb": _status_kb("VmRSS") / 1024,
        "dtype": decider.loaded.dtype,
        "model_id": decider.model_id,
        "first_scenario": first,
    }
    ar = arithmetic(decider.engine.passes.model)
    rec: dict[str, dict[str, list[Any]]] = {n: {} for n in SCENARIOS}

    def emit() -> None:
        for n in SCENARIOS:
            d = rec[n]
            if not d.get("cold"):
                continue
            sc: dict[str, Any] = {
                "cold_ms": d["cold"],
                "warm_ms": d.get("warm", []),
                "prefill_ms": d["prefill"],
                "cold_cpu_ms": d["cold_cpu"],
                "warm_cpu_ms": d.get("warm_cpu", []),
                "prompt_tokens": d["prompt_tokens"][0],
                "answer": d["answer"][0],
                "distributions": d["dist"][0],
            }
            if ar is not None:
                sc["prefill_gflop"] = ar.prefill(sc["prompt_tokens"]) / 1e9
                sc["prefill_gflops_per_s"] = [
                    sc["prefill_gflop"] / (ms / 1e3) for ms in d["prefill"]
                ]
            out[n] = sc
        out["peak_rss_all_mb"] = _status_kb("VmHWM") / 1024
        print(json.dumps(out), flush=True)

    emit()
    if first == "short":  # one short decision first: the biggest models answer in minutes
        from typing import Literal

        from pydantic import BaseModel

        class Route(BaseModel):
            team: Literal["billing", "technical", "sales"]

        reset = _reset_hwm()
        c0 = time.process_time()
        short = decider.decide(Route, SHORT_CONTEXT)
        out["short"] = {
            "ms": short.elapsed_ms,
            "cpu_ms": (time.process_time() - c0) * 1e3,
            "prompt_tokens": short.prompt_tokens,
            "answer": short.fields["team"].label,
            "distribution": _distributions(short)["team"],
        }
        out["peak_rss_first_mb"] = _status_kb("VmHWM") / 1024 if reset else None
        emit()
        first = "fraud"
    order = (first, *[n for n in SCENARIOS if n != first])
    for r in range(warmup + runs):
        for n in order:
            sc = scenarios[n]
            is_first = r == 0 and n == first and "peak_rss_first_mb" not in out
            reset = is_first and _reset_hwm()
            c0 = time.process_time()
            cold = _cold_decide(decider, compiled[n], sc.context)
            c1 = time.process_time()
            if is_first:
                out["peak_rss_first_mb"] = _status_kb("VmHWM") / 1024 if reset else None
                if n == "triage":
                    out["peak_rss_triage_mb"] = out["peak_rss_first_mb"]
                out["first_request_ms"] = cold.elapsed_ms
            d = rec[n]
            if r >= warmup:
                # CPU seconds of the process (all threads): on a shared machine, the work
                d.setdefault("cold_cpu", []).append((c1 - c0) * 1e3)
                d.setdefault("cold", []).append(cold.elapsed_ms)
                d.setdefault("prefill", []).append(cold.prefill_ms)
                d["prompt_tokens"] = [cold.prompt_tokens]
                d["answer"] = [{k: f.label for k, f in cold.fields.items()}]
                d["dist"] = [_distributions(cold)]
                emit()
            warm = decider.decide(compiled[n], sc.context)
            c2 = time.process_time()
            if r >= warmup:
                d.setdefault("warm_cpu", []).append((c2 - c1) * 1e3)
                d.setdefault("warm", []).append(warm.elapsed_ms)
                d["answer"] = [{k: f.label for k, f in warm.fields.items()}]
                d["dist"] = [_distributions(warm)]
                emit()
    out["sgemm_gflops"] = _sgemm_rates(rounds=5)  # this CPU's GEMM rate, at this moment
    out["complete"] = True
    return out


def _sgemm_rates(rounds: int, rows: int = 512, k: int = 2048, cols: int = 2048) -> list[float]:
    """float32 `x @ W.T` through the bound BLAS on the engine's threads, GFLOP/s per round."""
    from pcd_tools.engine.host.blas import import_mlx

    mx = import_mlx()
    with mx.stream(mx.cpu):
        a = mx.random.normal((rows, k))
        b = mx.random.normal((cols, k))
        mx.eval(a, b, a @ b.T)
        rates = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            mx.eval(a @ b.T)
            rates.append(2.0 * rows * k * cols / (time.perf_counter() - t0) / 1e9)
    return rates


def child_peer(path: str, runs: int, warmup: int) -> dict[str, Any]:
    """llama.cpp on `path` in this process: its load time and the RSS its `Llama` adds
    (the decider, loaded first in the file's encoding, only gives the prompt ids), then
    its cold and warm times of each scenario."""
    from pcd_tools.baselines.llama_cpp import LlamaCppPeer, PeerUnavailableError, peer_available
    from pcd_tools.bench.scenarios import load_scenarios
    from pcd_tools.decide.decider import Decider

    why = peer_available()
    if why is not None:
        return {"skipped": why}
    from pcd_tools.baselines.llama_cpp import probe_model

    broken = probe_model(path)
    if broken is not None:
        return {"skipped": broken}
    scenarios = load_scenarios()
    decider = Decider.load(path)
    rss0 = _status_kb("VmRSS")
    t0 = time.perf_counter()
    try:
        peer = LlamaCppPeer(decider, n_ctx=PEER_CTX)
    except PeerUnavailableError as e:
        return {"skipped": str(e)}
    out: dict[str, Any] = {
        "load_s": time.perf_counter() - t0,
        "rss_added_by_load_mb": (_status_kb("VmRSS") - rss0) / 1024,
        "n_ctx": PEER_CTX,
        "threads": peer.n_threads,
    }
    rss1 = _status_kb("VmRSS")
    rec: dict[str, dict[str, list[Any]]] = {n: {} for n in SCENARIOS}
    for r in range(warmup + runs):
        for n in SCENARIOS:
            sc = scenarios[n]
            cold = peer.run(sc.schema, sc.context, warm=False)
            warm = peer.run(sc.schema, sc.context, warm=True)
            if r < warmup:
                continue
            rec[n].setdefault("cold", []).append(cold.wall_ms)
            rec[n].setdefault("warm", []).append(warm.wall_ms)
            rec[n]["answer"] = [warm.result.values]
    for n in SCENARIOS:
        out[n] = {
            "cold_ms": rec[n]["cold"],
            "warm_ms": rec[n]["warm"],
            "answer": rec[n]["answer"][0],
        }
    out["rss_added_by_requests_mb"] = (_status_kb("VmRSS") - rss1) / 1024
    return out


def _spawn(kind: str, timeout: float | None = None, **kw: Any) -> dict[str, Any]:
    """Runs one child; its last JSON line is its result. At `timeout` seconds the child is
    stopped and what it printed last (load, RSS, the requests done) is kept, marked."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        json.dumps({"kind": kind, **kw}),
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    stopped = False
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        stopped = True
    lines = [ln for ln in stdout.strip().splitlines() if ln.startswith("{")]
    if not lines:
        return {"error": f"exit {proc.returncode}: {stderr[-1500:]}"}
    out = dict(json.loads(lines[-1]))
    if stopped:
        out["stopped_after_s"] = timeout
    elif proc.returncode != 0:
        out["error"] = f"exit {proc.returncode}: {stderr[-1500:]}"
    return out


# --- the machine ------------------------------------------------------------------------------


def machine(rounds: int = 7) -> dict[str, Any]:
    """Memory bandwidth (one-thread copy) and float32 GEMM rate (512 rows through the
    bound BLAS on the engine's threads), medians and ranges over `rounds`."""
    from pcd_tools.engine.host.blas import blas_status, import_mlx, setup_blas
    from pcd_tools.engine.host.cpus import usable_cpus

    setup_blas()
    mx = import_mlx()
    n = 64 * 1024 * 1024  # 256 MiB of float32
    src = np.ones(n, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    bw = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        bw.append(2 * src.nbytes / (time.perf_counter() - t0) / 1e9)  # read + write
    del src, dst
    rates: dict[str, list[float]] = {}
    with mx.stream(mx.cpu):
        for rows, k, cols in ((512, 2048, 2048), (512, 2048, 8192)):
            a = mx.random.normal((rows, k))
            b = mx.random.normal((cols, k))
            mx.eval(a, b, a @ b.T)
            r = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                mx.eval(a @ b.T)
                r.append(2.0 * rows * k * cols / (time.perf_counter() - t0) / 1e9)
            rates[f"{rows}x{k}x{cols}"] = r
    best = max(rates, key=lambda s: statistics.median(rates[s]))
    return {
        "cpu": _cpu_name(),
        "usable_cpus": usable_cpus(),
        "blas": blas_status(measure=False).name,
        "copy_gb_per_s": bw,
        "sgemm_gflops": rates,
        "sgemm_peak_shape": best,
        "sgemm_peak_gflops": statistics.median(rates[best]),
        "load_average": os.getloadavg()[0],
    }


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _mem_total_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 1024**2
    return float("nan")


# --- the run ------------------------------------------------------------------------------------

# model -> (timed runs per process, warm-up runs, processes per dtype). The 2-core machine
# this was written on takes minutes per 7B request: the big models get one run.
DEFAULT_RUNS = {
    "embedded": (3, 0, 2),
    "0.5b": (2, 0, 1),
    "1.5b": (2, 0, 1),
    "3b": (1, 0, 1),
    "7b": (1, 0, 1),
}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measures the machine, then every model (its processes interleaved by dtype)."""
    print(
        f"machine: measuring memory bandwidth and sgemm ({time.strftime('%H:%M:%S')})", flush=True
    )
    result: dict[str, Any] = {"machine": machine(), "mem_total_gb": _mem_total_gb(), "models": {}}
    m = result["machine"]
    print(
        f"  copy {statistics.median(m['copy_gb_per_s']):.1f} GB/s, sgemm "
        f"{m['sgemm_peak_gflops']:.1f} GFLOP/s ({m['sgemm_peak_shape']}), {m['blas']}",
        flush=True,
    )
    from pcd_tools.baselines.llama_cpp import peer_available

    why = None if args.no_peer else peer_available()
    if args.no_peer:
        why = "--no-peer"
    result["peer_skipped"] = why
    if why:
        print(f"llama.cpp skipped: {why}", flush=True)
    for name in args.models.split(","):
        path = model_file(name)
        if path is None:
            result["models"][name] = {"skipped": "not fetched"}
            continue
        runs, warmup, procs = DEFAULT_RUNS[name]
        runs = args.runs or runs
        warmup = warmup if args.warmup < 0 else args.warmup
        procs = args.processes or procs
        dtypes = ["auto", "float32"] if name in FLOAT32_MODELS else ["auto"]
        if args.dtypes:  # int8 (compute="int8" on the encoded weights) only when asked
            dtypes = [d for d in (*dtypes, "int8") if d in args.dtypes.split(",")]
        entry: dict[str, Any] = {
            "file": str(path),
            "file_bytes": path.stat().st_size,
            "random_weights": name in SHAPES,
            "about": SHAPES[name].about if name in SHAPES else None,
            "float32": "measured"
            if "float32" in dtypes
            else "skipped: dense float32 weights do not fit in RAM",
            "runs": runs,
            "warmup": warmup,
            "processes": procs,
        }
        for dtype in dtypes:
            entry[dtype] = []
        entry["llamacpp"] = []
        for p in range(procs):
            for dtype in dtypes:
                print(
                    f"{name}: dtype={dtype} process {p + 1}/{procs} ({time.strftime('%H:%M:%S')})",
                    flush=True,
                )
                entry[dtype].append(
                    _spawn(
                        "pcd",
                        timeout=args.timeout or None,
                        path=str(path),
                        dtype="quantized" if dtype == "auto" else dtype,
                        runs=runs,
                        warmup=warmup,
                        first=args.first,
                    )
                )
                _say(entry[dtype][-1])
            if not why:
                print(
                    f"{name}: llama.cpp process {p + 1}/{procs} ({time.strftime('%H:%M:%S')})",
                    flush=True,
                )
                entry["llamacpp"].append(
                    _spawn("peer", args.timeout or None, path=str(path), runs=runs, warmup=warmup)
                )
                _say(entry["llamacpp"][-1])
        result["models"][name] = entry
        if args.json:  # after every model: a long run keeps what it measured
            args.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


def run_peer_only(args: argparse.Namespace) -> dict[str, Any]:
    """Adds llama.cpp's figures to an earlier run's JSON (`--json`), for a peer built after
    that run began; the note says so."""
    from pcd_tools.baselines.llama_cpp import peer_available

    result = json.loads(args.json.read_text())
    why = peer_available()
    if why:
        raise SystemExit(f"llama.cpp cannot run: {why}")
    result["peer_skipped"] = None
    result["peer_note"] = (
        f"llama.cpp measured after PCD, in a second run ({time.strftime('%Y-%m-%d %H:%M')} "
        "UTC), on the same machine and files"
    )
    for name in args.models.split(","):
        e = result["models"].get(name)
        if not e or "skipped" in e:
            continue
        runs, warmup, procs = DEFAULT_RUNS[name]
        runs, procs = args.runs or runs, args.processes or procs
        warmup = warmup if args.warmup < 0 else args.warmup
        e["llamacpp"] = []
        for p in range(procs):
            print(
                f"{name}: llama.cpp process {p + 1}/{procs} ({time.strftime('%H:%M:%S')})",
                flush=True,
            )
            e["llamacpp"].append(
                _spawn("peer", args.timeout or None, path=e["file"], runs=runs, warmup=warmup)
            )
            _say(e["llamacpp"][-1])
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


def merge(paths: list[Path]) -> dict[str, Any]:
    """One result of several runs' JSON (e.g. the big models and the small ones run side by
    side): the models of all (one model's processes from several runs are pooled), and
    each run's machine figures with the models it measured."""
    out: dict[str, Any] = {"models": {}, "machines": []}
    for path in paths:
        r = json.loads(path.read_text())
        for name, e in r["models"].items():
            have = out["models"].get(name)
            if have is None or "skipped" in have:
                out["models"][name] = e
                continue
            for key in ("auto", "float32", "int8", "llamacpp"):  # a model's modes from two runs
                a, b = _procs(have, key), _procs(e, key)
                if a or b:
                    have[key] = a + b
        for m in r.get("machines") or [dict(r["machine"], models=sorted(r["models"]))]:
            out["machines"].append(m)
        out["mem_total_gb"] = r["mem_total_gb"]
        for key in ("peer_skipped", "peer_note"):
            if r.get(key):
                out[key] = r[key]
    out["machine"] = out["machines"][0]
    return out


def _say(r: dict[str, Any]) -> None:
    """One process's figures on one line, as they come."""
    try:
        if "error" in r or "skipped" in r:
            print("   ", r.get("error") or r.get("skipped"), flush=True)
            return
        bits = [f"load {r['load_s']:.2f} s"]
        if "rss_after_load_mb" in r:
            bits.append(f"RSS {r['rss_after_load_mb']:.0f} MB")
            if r.get("peak_rss_first_mb") is not None:
                bits.append(f"peak {r['peak_rss_first_mb']:.0f} MB ({r['first_scenario']})")
        else:
            bits.append(f"RSS +{r['rss_added_by_load_mb']:.0f} MB")
        for n in SCENARIOS:
            if n in r:
                bits.append(f"{n} cold {_med(r[n]['cold_ms'])} warm {_med(r[n]['warm_ms'])} ms")
        if "stopped_after_s" in r:
            bits.append(f"stopped after {r['stopped_after_s']:.0f} s")
        print("   ", "; ".join(bits), flush=True)
    except (KeyError, TypeError, ValueError) as e:  # never lose a run to its progress line
        print("    (progress line failed:", e, ")", flush=True)


# --- tables -------------------------------------------------------------------------------------


def _med(xs: list[float]) -> str:
    if not xs:
        return "-"
    m, lo, hi = statistics.median(xs), min(xs), max(xs)
    f = (lambda v: f"{v:.0f}") if m >= 100 else (lambda v: f"{v:.2f}" if m < 10 else f"{v:.1f}")
    return f(m) if len(xs) == 1 or lo == hi else f"{f(m)} [{f(lo)}-{f(hi)}]"


def _first_peak(p: dict[str, Any]) -> tuple[float, str]:
    """The peak RSS of a process's first request, and its scenario (0 when none ended)."""
    value = p.get("peak_rss_first_mb") or p.get("peak_rss_triage_mb") or 0.0
    return float(value), str(p.get("first_scenario", "triage"))


def _vals(procs: list[dict[str, Any]], scenario: str, key: str) -> list[float]:
    """A figure's values over processes, from those that got to the scenario."""
    return [x for p in procs if scenario in p for x in p[scenario].get(key, [])]


def _procs(e: dict[str, Any], mode: str) -> list[dict[str, Any]]:
    """A model's processes of one mode (`float32` holds a string where it was skipped)."""
    value = e.get(mode)
    return list(value) if isinstance(value, list) else []


def _ok(procs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in procs if "error" not in p and "skipped" not in p]


def max_prob_diff(a: dict[str, list[float]], b: dict[str, list[float]]) -> float:
    """The largest difference of any candidate's probability between two results."""
    return max(max(abs(x - y) for x, y in zip(a[k], b[k])) for k in a)


def _ordered(result: dict[str, Any]) -> list[tuple[str, Any]]:
    return sorted(result["models"].items(), key=lambda kv: ALL_MODELS.index(kv[0]))


def tables(result: dict[str, Any]) -> str:
    """The run's tables in Markdown."""
    machines = result.get("machines") or [dict(result["machine"], models=list(result["models"]))]
    lines = []
    for m in machines:
        lines.append(
            f"CPU: {m['cpu']}, {m['usable_cpus']} usable CPUs, {result['mem_total_gb']:.0f} GB "
            f"RAM, {m['blas']}, load average {m['load_average']:.1f} (run of "
            f"{', '.join(m['models'])}): memory bandwidth (one-thread copy, read + write) "
            f"{_med(m['copy_gb_per_s'])} GB/s; sgemm (float32, 512 rows) "
            + ", ".join(f"{s}: {_med(v)}" for s, v in m["sgemm_gflops"].items())
            + " GFLOP/s"
        )
    peak_of = {name: m["sgemm_peak_gflops"] for m in machines for name in m["models"]}
    lines += [
        "",
        "| model | file MiB | dtype | load s | RSS after load MiB | RSS / file | peak RSS, first request (triage) MiB "
        "| fraud cold ms | fraud warm ms | triage cold ms | triage warm ms | prefill GFLOP/s (of sgemm peak) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for name, e in _ordered(result):
        if "skipped" in e:
            notes.append(f"{name}: skipped ({e['skipped']})")
            continue
        label = name + (" (random weights)" if e["random_weights"] else "")
        file_mib = e["file_bytes"] / 2**20  # MiB, as the RSS figures (/proc: KiB / 1024)
        for dtype in ("auto", "float32", "int8", "llamacpp"):
            procs = _ok(_procs(e, dtype))
            bad = [p for p in _procs(e, dtype) if p not in procs]
            for p in bad:
                notes.append(f"{name} {dtype}: {p.get('error') or p.get('skipped')}")
            if not procs:
                if dtype == "float32" and isinstance(e.get("float32"), str):
                    lines.append(
                        f"| {label} | {file_mib:.0f} | float32 | {e['float32']} |" + " |" * 8
                    )
                continue
            for p in procs:
                if "short" in p:
                    sh = p["short"]
                    notes.append(
                        f"{name} {dtype}: first request, a one-field decision on one sentence "
                        f"({sh['prompt_tokens']} tokens): {sh['ms'] / 1e3:.1f} s wall, "
                        f"{sh['cpu_ms'] / 1e3:.1f} CPU-s, answer {sh['answer']!r}, peak RSS "
                        f"{p.get('peak_rss_first_mb') or 0:.0f} MiB"
                    )
            cold = {n: _vals(procs, n, "cold_ms") for n in SCENARIOS}
            warm = {n: _vals(procs, n, "warm_ms") for n in SCENARIOS}
            for p in procs:
                if "stopped_after_s" in p:
                    done = [
                        f"{n} {k}"
                        for n in SCENARIOS
                        for k in ("cold", "warm")
                        if _vals([p], n, f"{k}_ms")
                    ]
                    notes.append(
                        f"{name} {dtype}: the process was stopped at its limit of "
                        f"{p['stopped_after_s']:.0f} s; measured before that: load, RSS"
                        + "".join(f", {d}" for d in done)
                    )
            load = [p["load_s"] for p in procs]
            if dtype == "llamacpp":
                rss = [p["rss_added_by_load_mb"] for p in procs]
                peak_rss = "-"
                rate = "-"
                shown = "llama.cpp"
                rss_s = f"+{_med(rss)}"
                ratio = "-"
            else:
                rss = [p["rss_after_load_mb"] for p in procs]
                peaks = [_first_peak(p) for p in procs if _first_peak(p)[0]]
                peak_rss = _med([v for v, _ in peaks])
                if peaks and peaks[0][1] != "triage":
                    peak_rss += f" ({peaks[0][1]})"
                g = _vals(procs, "triage", "prefill_gflops_per_s") or _vals(
                    procs, "fraud", "prefill_gflops_per_s"
                )
                own = [x for p in procs for x in p.get("sgemm_gflops", [])]
                peak = statistics.median(own) if own else peak_of.get(name, 0.0)
                rate = f"{_med(g)} ({statistics.median(g) / peak:.0%})" if g and peak else "-"
                if g and not _vals(procs, "triage", "prefill_gflops_per_s"):
                    rate += " (fraud)"
                shown = {"auto": "encoded", "int8": "encoded, int8"}.get(dtype, dtype)
                rss_s = _med(rss)
                ratio = f"{statistics.median(rss) / file_mib:.2f}x"
            lines.append(
                f"| {label} | {file_mib:.0f} | {shown} | {_med(load)} | {rss_s} | {ratio} | {peak_rss} | "
                f"{_med(cold['fraud'])} | {_med(warm['fraud'])} | {_med(cold['triage'])} | "
                f"{_med(warm['triage'])} | {rate} |"
            )
    cpu_rows = []
    for name, e in _ordered(result):
        for dtype in ("auto", "float32", "int8"):
            procs = [p for p in _ok(_procs(e, dtype)) if "cold_cpu_ms" in p.get("fraud", {})]
            if procs:
                cells = [
                    _med(_vals(procs, n, f"{kind}_cpu_ms"))
                    for n in SCENARIOS
                    for kind in ("cold", "warm")
                ]
                cpu_rows.append(f"| {name} | {dtype} | " + " | ".join(cells) + " |")
    if cpu_rows:
        lines += [
            "",
            "CPU time of the same requests (the process's CPU seconds over all its threads: "
            "on a shared machine, the work itself):",
            "",
            "| model | dtype | fraud cold CPU ms | fraud warm CPU ms | triage cold CPU ms "
            "| triage warm CPU ms |",
            "|---|---|---|---|---|---|",
            *cpu_rows,
        ]
    lines += ["", "Targets (issue 30):", ""]
    lines += [
        "| model | RSS after load <= 1.3x file + 300 MiB | peak RSS, triage <= 1.5x file + 600 MiB "
        "| warm encoded / float32 (<= 1.15x) | max probability difference encoded vs float32 (<= 1e-5) "
        "| load encoded / llama.cpp (<= 1.5x) |",
        "|---|---|---|---|---|---|",
    ]
    for name, e in _ordered(result):
        if "skipped" in e:
            continue
        auto = _ok(_procs(e, "auto"))
        if not auto:
            continue
        f = e["file_bytes"] / 2**20
        rss = statistics.median([p["rss_after_load_mb"] for p in auto])
        cells = [
            f"{rss:.0f} of {1.3 * f + 300:.0f} MiB: {'met' if rss <= 1.3 * f + 300 else 'NOT met'}",
        ]
        firsts = [_first_peak(p) for p in auto if _first_peak(p)[0]]
        if firsts:
            pk = statistics.median([v for v, _ in firsts])
            what = firsts[0][1]
            cells.append(
                f"{pk:.0f} of {1.5 * f + 600:.0f} MiB: {'met' if pk <= 1.5 * f + 600 else 'NOT met'}"
                + ("" if what == "triage" else f" (a {what} request; triage not measured)")
            )
        else:
            cells.append("- (no request finished)")
        dense = _ok(_procs(e, "float32"))
        if dense:
            ratios = []
            for n in SCENARIOS:
                wa, wb = _vals(auto, n, "warm_ms"), _vals(dense, n, "warm_ms")
                if wa and wb:
                    ratios.append(f"{n} {statistics.median(wa) / statistics.median(wb):.2f}x")
            diff = max(
                (
                    max_prob_diff(p[n]["distributions"], q[n]["distributions"])
                    for p in auto
                    for q in dense
                    for n in SCENARIOS
                    if "distributions" in p.get(n, {}) and "distributions" in q.get(n, {})
                ),
                default=float("nan"),
            )
            cells += [", ".join(ratios), f"{diff:.1e}"]
        else:
            cells += ["- (no float32)", "-"]
        peer = _ok(_procs(e, "llamacpp"))
        if peer:
            a = statistics.median([p["load_s"] for p in auto])
            b = statistics.median([p["load_s"] for p in peer])
            cells.append(f"{a:.2f} / {b:.2f} s = {a / b:.2f}x")
        else:
            cells.append("- (no llama.cpp)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for name, e in _ordered(result):  # issue 31: int8 compute against float32 (encoded)
        fast, ref = _ok(_procs(e, "int8")), _ok(_procs(e, "auto"))
        if not fast or not ref:
            continue
        ratios = [
            f"{n} warm {statistics.median(_vals(fast, n, 'warm_ms')) / statistics.median(_vals(ref, n, 'warm_ms')):.2f}x"
            for n in SCENARIOS
            if _vals(fast, n, "warm_ms") and _vals(ref, n, "warm_ms")
        ]
        diff = max(
            (
                max_prob_diff(p[n]["distributions"], q[n]["distributions"])
                for p in fast
                for q in ref
                for n in SCENARIOS
                if "distributions" in p.get(n, {}) and "distributions" in q.get(n, {})
            ),
            default=float("nan"),
        )
        notes.append(
            f"{name}: compute='int8' against float32 on the encoded weights: "
            + ", ".join(ratios)
            + f"; max probability difference {diff:.3f}"
        )
    if result.get("peer_note"):
        notes.append(result["peer_note"])
    if result.get("peer_skipped"):
        notes.append(f"llama.cpp: skipped ({result['peer_skipped']})")
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines)


def main() -> None:
    """Parse the arguments; run (or a child's part of it); print the tables."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--models", default=",".join(ALL_MODELS), help=f"comma-separated, of {ALL_MODELS}"
    )
    ap.add_argument(
        "--runs", type=int, default=0, help="timed runs per process (default per model)"
    )
    ap.add_argument(
        "--warmup", type=int, default=-1, help="warm-up runs per process (default per model)"
    )
    ap.add_argument(
        "--processes", type=int, default=0, help="processes per dtype (default per model)"
    )
    ap.add_argument("--no-peer", action="store_true", help="leave llama.cpp out")
    ap.add_argument(
        "--dtypes",
        default="",
        help="only these of auto,float32,int8 (default auto,float32; int8: compute='int8')",
    )
    ap.add_argument(
        "--first",
        default="triage",
        choices=(*SCENARIOS, "short"),
        help="the scenario of each process's first request, whose peak RSS is reported "
        "(short: a one-field decision on one sentence, then fraud, then triage)",
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=0,
        help="stop each process after this many seconds, keeping what it measured",
    )
    ap.add_argument("--json", type=Path, help="write the results here (after every model)")
    ap.add_argument(
        "--peer-only", action="store_true", help="add llama.cpp's figures to the run in --json"
    )
    ap.add_argument("--from-json", type=Path, help="print the tables of an earlier run")
    ap.add_argument(
        "--merge", type=Path, nargs="+", help="merge these runs' JSON into --json, print tables"
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        req = json.loads(args.child)
        kind = req.pop("kind")
        from pcd_tools.engine.host.blas import setup_blas

        setup_blas()
        out = child_pcd(**req) if kind == "pcd" else child_peer(**req)
        print(json.dumps(out))
        return
    if args.merge:
        merged = merge(args.merge)
        if args.json:
            args.json.write_text(json.dumps(merged, indent=1) + "\n")
        print(tables(merged))
        return
    if args.from_json:
        print(tables(json.loads(args.from_json.read_text())))
        return
    unknown = [m for m in args.models.split(",") if m not in ALL_MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; accepted: {', '.join(ALL_MODELS)}")
    if args.peer_only:
        if not args.json or not args.json.is_file():
            ap.error("--peer-only needs --json naming an earlier run's output")
        print(tables(run_peer_only(args)))
        return
    print(tables(run(args)))


if __name__ == "__main__":
    main()
