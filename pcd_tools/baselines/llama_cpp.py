"""llama.cpp as the peer in `pcd bench`: what a user would run instead on a CPU.

`LlamaCppPeer` runs `llama-cpp-python` (the `peer` extra, built from its sdist: about 12
minutes on 2 cores) on the same GGUF file as the decider, with the same prompt token ids
(`plan.head_ids + context + plan.tail_ids`, exactly what PCD and our baselines see), the
same thread count, and a GBNF grammar built by llama.cpp from the schema's JSON schema
(`baseline.json_schema_of`). Decoding is greedy (`temp=0`) under that grammar until the
end-of-generation token.

- **cold**: the whole prompt is evaluated from an empty KV cache;
- **warm**: the schema part of the prompt (`plan.head_ids`) stays in llama.cpp's KV
  cache and only the context and the rest are evaluated, as llama.cpp does by itself for
  a shared token prefix, and as PCD's warm request and our warm baselines do.

The grammar is built once per schema and not timed (as the outlines index of our
constrained baseline is not). The answer is parsed with the baselines' `build_result`,
so its validity and its agreement with PCD are judged alike.
"""

from __future__ import annotations

import functools
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from ..errors import PcdToolsError

__all__ = [
    "PEER",
    "LlamaCppPeer",
    "PeerRun",
    "PeerUnavailableError",
    "after_brace",
    "bench_peer",
    "peer_available",
    "peer_keys",
    "probe_model",
    "settle",
]

INSTALL = (
    "pip install 'pcd-tools[peer]' (builds llama-cpp-python 0.3.36 from its sdist: about 12 "
    "minutes on 2 cores, needs a C++ compiler and cmake)"
)


class PeerUnavailableError(PcdToolsError, RuntimeError):
    """The llama.cpp peer cannot run: the extra is missing or the model is not a GGUF."""


def settle(max_s: float = 20.0, window_s: float = 0.05) -> float:
    """Wait until this process's other threads stop using the CPU; returns the seconds
    waited.

    llama-cpp-python's CPU backend runs its threads through OpenMP, whose idle threads spin
    (and yield) a fixed number of times before they sleep. On an idle CPU that is over in
    about 0.1 s; if other work starts at once, each yield hands it a time slice and the
    spinning lasts as long as that work: a PCD prefill of the 1.5B right after llama.cpp
    decoded took 13.7 s against 7.2 s (2-core AMD EPYC). ``OMP_WAIT_POLICY=passive`` avoids
    it but costs llama.cpp's own decoding 45% (47 -> 69 ms a token), so the peer keeps its
    defaults, and the benchmarks call this after each llama.cpp call: the next method then
    runs on an idle CPU (7.2-7.3 s), as each would on its own. Quiet is a `window_s` sleep
    during which the whole process used under a tenth of one CPU.
    """
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < max_s:
        c0 = time.process_time()  # CPU time of every thread of this process
        time.sleep(window_s)
        if time.process_time() - c0 < 0.1 * window_s:
            break
    return time.perf_counter() - t0


def peer_available() -> str | None:
    """None when `llama_cpp` imports, else why not (with how to install it)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError as e:
        return f"llama-cpp-python is not installed ({e}); {INSTALL}"
    return None


@dataclass(frozen=True)
class PeerRun:
    """One llama.cpp request.

    Args:
        wall_ms: Wall time from the first prompt token evaluated to the last token.
        prefill_ms: Wall time of evaluating the prompt (the part not cached).
        tokens: Tokens generated (the end-of-generation token not counted).
        text: The generated JSON text.
        result: The baselines' `GenerationResult` of that text (validity, answers).
    """

    wall_ms: float
    prefill_ms: float
    tokens: int
    text: str
    result: Any


_ROOT = 'root ::= "{" space '
_SPACE = 'space ::= " "?'
# Our constrained baseline's whitespace between tokens (`grammar.WHITESPACE`, [\n ]{0,3})
_OUR_SPACE = "space ::= ([\\n ] ([\\n ] [\\n ]?)?)?"


def after_brace(json_schema: str) -> str:
    """llama.cpp's GBNF grammar of `json_schema` (`json_schema_to_gbnf`), from after
    the object's opening brace (the prompt already ends with it), with the whitespace our
    constrained baseline allows (up to three spaces or newlines): the same language as
    the baseline's outlines index.

    Raises:
        PeerUnavailableError: if llama.cpp's grammar has an unexpected shape.
    """
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    gbnf = json_schema_to_gbnf(json_schema)
    lines = gbnf.splitlines()
    roots = [i for i, ln in enumerate(lines) if ln.startswith(_ROOT)]
    spaces = [i for i, ln in enumerate(lines) if ln.strip() == _SPACE]
    if len(roots) != 1 or len(spaces) != 1:
        raise PeerUnavailableError(
            f"llama.cpp's grammar of the schema has no single {_ROOT!r} and {_SPACE!r} "
            "rule; this llama-cpp-python version writes JSON grammars differently (accepted: "
            "0.3.x, as pinned by the peer extra)."
        )
    lines[roots[0]] = "root ::= space " + lines[roots[0]][len(_ROOT) :]
    lines[spaces[0]] = _OUR_SPACE
    return "\n".join(lines) + "\n"


_PROBE = """
import sys, llama_cpp
llama = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=256, n_threads=2, verbose=False)
llama.eval(llama.tokenize(b"Hello world, this is a probe of the batched matmul. " * 4))
llama.eval(llama.tokenize(b" one more"))
print("ok")
"""
REBUILD = (
    'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" pip install '
    "--no-cache-dir --force-reinstall --no-binary llama-cpp-python 'pcd-tools[peer]'"
)
# On an AVX-512 CPU the portable build keeps AVX-512 (VNNI, BF16) and leaves AMX out:
# llama-cpp-python 0.3.36's AMX kernels fault at their first tile instruction on an
# Intel Xeon whose kernel grants AMX (seen 2026-12-07), and AVX2 alone would handicap it.
REBUILD_AVX512 = REBUILD.replace(
    "-DGGML_F16C=ON",
    "-DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON "
    "-DGGML_AMX_INT8=OFF",
)


def rebuild_hint() -> str:
    """The portable rebuild for this CPU: AVX-512 kept where it has AVX-512 VNNI."""
    from ..engine.host.openblas_core import cpu_flags

    return REBUILD_AVX512 if "avx512_vnni" in cpu_flags() else REBUILD


@functools.lru_cache(maxsize=8)
def probe_model(path: str) -> str | None:
    """None when llama.cpp evaluates a few tokens of `path` in a child process, else why
    not. A build for the wrong CPU dies of SIGILL (e.g. `-march=native` on a VM that
    reports AMX it does not enable), which would kill the benchmark itself."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, path], capture_output=True, text=True, timeout=300
    )
    if done.returncode == 0 and done.stdout.strip().endswith("ok"):
        return None
    if done.returncode == -4:
        return (
            "llama.cpp died of an illegal instruction on this CPU (its build targets CPU "
            f"features this machine does not run); rebuild it portable: {rebuild_hint()}"
        )
    return f"llama.cpp could not run the model (exit {done.returncode}): {done.stderr[-400:]}"


class LlamaCppPeer:
    """llama.cpp on the decider's own GGUF file, with its prompt ids and threads.

    Args:
        decider: The `Decider` (its GGUF path, tokenizer, prompt plan and window).
        n_threads: llama.cpp's threads; default the engine's thread budget
            (`engine.host.threads.thread_budget`).
        n_ctx: llama.cpp's context (its KV cache is allocated for it at load); default
            the decider's context window.

    Raises:
        PeerUnavailableError: when `llama_cpp` is missing or the model is not a GGUF file.
    """

    def __init__(self, decider: Any, n_threads: int | None = None, n_ctx: int | None = None):
        why = peer_available()
        if why is not None:
            raise PeerUnavailableError(why)
        path = str(getattr(decider.loaded, "path", "") or "")
        if not path.endswith(".gguf"):
            raise PeerUnavailableError(
                f"the llama.cpp peer needs a GGUF model file; {decider.model_id} was loaded "
                f"from {path or 'memory'!r}. Accepted: Decider.load('model.gguf') or the "
                "embedded model."
            )
        broken = probe_model(path)
        if broken is not None:
            raise PeerUnavailableError(broken)
        import llama_cpp

        from ..engine.host.threads import thread_budget

        self.decider = decider
        self.n_threads = n_threads or thread_budget()
        self.llama = llama_cpp.Llama(
            model_path=path,
            n_ctx=int(n_ctx or decider.engine.context_window),
            n_threads=self.n_threads,
            n_threads_batch=self.n_threads,
            n_batch=512,
            logits_all=False,
            verbose=False,
        )
        self._grammars: dict[str, Any] = {}
        self._eog = {int(self.llama.token_eos())}
        is_eog = getattr(llama_cpp, "llama_vocab_is_eog", None)
        vocab = getattr(getattr(self.llama, "_model", None), "vocab", None)
        self._is_eog = (lambda t: bool(is_eog(vocab, t))) if is_eog and vocab else None

    def grammar(self, schema: Any) -> Any:
        """llama.cpp's grammar of the schema's JSON schema (built once per schema)."""
        import llama_cpp

        from .generation import json_schema_of

        js = json.dumps(json_schema_of(schema), sort_keys=True)
        g = self._grammars.get(js)
        if g is None:
            g = llama_cpp.LlamaGrammar.from_string(after_brace(js), verbose=False)
            self._grammars[js] = g
        return g

    def _ended(self, token: int) -> bool:
        return token in self._eog or (self._is_eog is not None and self._is_eog(token))

    def run(
        self, schema: Any, context: str, *, warm: bool, max_tokens: int | None = None
    ) -> PeerRun:
        """Decides `context` by grammar-constrained greedy decoding.

        Args:
            schema: Anything `compile_schema` accepts.
            context: The text.
            warm: Keep the schema part of the prompt in the KV cache (cold: evaluate all).
            max_tokens: Generation limit (default as our constrained baseline's).

        Returns:
            The run's times, tokens and parsed answer.
        """
        from ..schema import compile_schema
        from .generation import _check_max, build_result, token_spans

        compiled = compile_schema(schema)
        plan = self.decider.engine.plan(compiled)
        head = list(plan.head_ids)
        prompt = head + self.decider.engine.encode_ids(context) + list(plan.tail_ids)
        limit = _check_max(max_tokens, self.decider, compiled)
        grammar = self.grammar(compiled)
        llama = self.llama
        cached = list(llama.input_ids[: llama.n_tokens]) if llama.n_tokens else []
        if warm and cached[: len(head)] != head:  # put the schema part in the cache first
            llama.reset()
            llama.eval(head)
        t0 = time.perf_counter()
        if warm:
            llama.n_tokens = len(head)  # keep the schema part; eval drops the rest
            todo = prompt[len(head) :]
        else:
            llama.reset()
            todo = prompt
        ids: list[int] = []
        t1 = 0.0
        gen = llama.generate(todo, temp=0.0, top_k=1, reset=False, grammar=grammar)
        for tok in gen:
            if not t1:
                t1 = time.perf_counter()
            if self._ended(int(tok)) or len(ids) >= limit:
                break
            ids.append(int(tok))
        gen.close()
        t2 = time.perf_counter()
        t1 = t1 or t2
        tk = self.decider.loaded.tokenizer
        text = tk.decode(ids)
        result = build_result(compiled, text, token_spans(tk, ids), [], 0, (t0, t1, t2))
        settle()  # llama.cpp's threads spin on after it: the next method gets a quiet CPU
        return PeerRun((t2 - t0) * 1e3, (t1 - t0) * 1e3, len(ids), text, result)

    def eval_ms(self, schema: Any, context: str) -> float:
        """Wall time of llama.cpp evaluating the whole PCD prompt (its exact ids) into an
        empty KV cache, nothing sampled: the peer's side of `bare_prefill_ms`, so the
        two cold prefill columns of `pcd bench` time the same work."""
        from ..schema import compile_schema

        plan = self.decider.engine.plan(compile_schema(schema))
        prompt = list(plan.head_ids) + self.decider.engine.encode_ids(context) + list(plan.tail_ids)
        llama = self.llama
        llama.reset()
        t0 = time.perf_counter()
        llama.eval(prompt)
        ms = (time.perf_counter() - t0) * 1e3
        llama.reset()  # the next warm run puts the schema part back first
        settle()
        return ms


# --- in `pcd bench` ------------------------------------------------------------------

PEER = "llamacpp"


def _stats(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


_PEERS: dict[int, Any] = {}


def bench_peer(decider: Any) -> Any:
    """The llama.cpp peer of `decider` (loaded once per decider), or None when it cannot
    run here (a non-GGUF model, a llama.cpp build for another CPU): said once on stderr."""
    key = id(decider)
    if key not in _PEERS:
        _PEERS.clear()  # one model at a time
        try:
            _PEERS[key] = LlamaCppPeer(decider)
        except PeerUnavailableError as e:
            print(f"llama.cpp peer skipped: {e}", file=sys.stderr)
            _PEERS[key] = None
    return _PEERS[key]


def peer_keys(rec: dict[str, list[Any]], out: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's keys: warm and cold times, tokens, validity, agreement with PCD."""
    keys: dict[str, Any] = {}
    keys[f"{PEER}_ms"], keys[f"{PEER}_ms_min"], keys[f"{PEER}_ms_max"] = _stats(rec[PEER])
    keys[f"{PEER}_cold_ms"], keys[f"{PEER}_cold_ms_min"], keys[f"{PEER}_cold_ms_max"] = _stats(
        rec[f"{PEER}_cold"]
    )
    # warm: the context after the cached schema part, to the first token (its grammar
    # step included); cold: the whole prompt, to the first token; bare: the whole prompt
    # evaluated alone, nothing sampled (PCD's `bare_prefill_ms` does the same work)
    keys[f"{PEER}_prefill_ms"] = statistics.median(rec[f"{PEER}_prefill"])
    keys[f"{PEER}_cold_prefill_ms"] = statistics.median(rec[f"{PEER}_cold_prefill"])
    if rec.get(f"{PEER}_bare"):
        bare = _stats(rec[f"{PEER}_bare"])
        keys[f"{PEER}_bare_prefill_ms"], keys[f"{PEER}_bare_prefill_ms_min"] = bare[:2]
        keys[f"{PEER}_bare_prefill_ms_max"] = bare[2]
        if "bare_prefill_ms" in out:
            keys[f"bare_prefill_vs_{PEER}"] = (
                keys[f"{PEER}_bare_prefill_ms"] / out["bare_prefill_ms"]
            )
    keys[f"{PEER}_tokens"] = int(statistics.median(rec[f"{PEER}_tokens"]))
    keys[f"{PEER}_schema_match"] = all(rec[f"{PEER}_match"])
    keys[f"{PEER}_output"] = rec[f"{PEER}_text"][-1]
    values = rec[f"{PEER}_values"][-1]
    answer = out.get("pcd_answer")
    if answer is not None:
        same = sum(values is not None and values.get(k) == v for k, v in answer.items())
        keys[f"{PEER}_agreement"] = same / max(1, len(answer))
    if "warm_pcd_ms" in out:
        keys[f"speedup_vs_{PEER}"] = keys[f"{PEER}_ms"] / out["warm_pcd_ms"]
        keys[f"speedup_vs_{PEER}_cold"] = keys[f"{PEER}_cold_ms"] / out["pcd_ms"]
    return keys
