"""Long inputs: PCD against llama.cpp at each input length (issue 53, item 1).

Agents decide on long inputs (1k-8k tokens). At each length (`--lengths`) the input is a
support / email thread built deterministically (`build_context`) to exactly that many
context tokens under the model's tokenizer (the ids of a longer thread cut at the length,
decoded, and checked by encoding again; the count reached is reported). `--texts` different
threads per length; every round gives each a new leading reference line, so no method sees
a context it has cached. The schema is `small` (one `bool` and one 4-way `Literal`) or
`triage` (the `pcd bench` triage scenario's 28 fields, from the scenarios `pcd bench` reads:
`benchmarks/scenarios` or `--scenarios-dir`), its prefix cached as an agent runs it. Each
round times, in rotating order, on the same context:

- **PCD warm**: `Decider.decide`, the schema part from the prefix cache (`decision.prefix_cache_hit`);
- **PCD cold**: `Decider.decide` after `engine.clear_cache()` (the token plan built again
  before the clock starts, as `pcd bench`'s cold request): the whole prompt is prefilled;
- **PCD floor**: `baselines.generation.warm_prefill_ms`, one plain prefill of the tokens a
  warm request prefills (context and answer start) after the cached schema part's K/V,
  last position's logits only: a warm decision without its fields pass. (Not
  `bare_prefill_ms`, which prefills the whole prompt, schema part included, cold.)
- **llama.cpp eval**: `Llama.eval` of the same tokens (context and answer start) after
  llama.cpp's own KV cache of the schema part (`n_tokens` set back to it: the rest is
  dropped, as after `reset()` and an untimed `eval` of the schema part), same GGUF, same
  threads, `n_batch` 512, `n_ctx` sized for the longest prompt and its answer;
- **llama.cpp decision**: `LlamaCppPeer.run(warm=True)`, `pcd bench`'s llama.cpp column:
  the schema part cached, the rest evaluated, then greedy decoding under a GBNF grammar of
  the schema until the end-of-generation token.

Both sides run on the same fixed thread count (`--threads`, default the thread budget;
`PCD_THREADS` is set to it, so PCD does not fit its threads to busy neighbours). Before the
call after a llama.cpp call, `settle()` waits until its OpenMP threads stop spinning. Run it
on a quiet machine: beside other CPU-bound work llama.cpp's spinning threads lose far more
than PCD (a triage decision of the 135M took 517 s against about 11 s quiet). The first
length starts with `--warmup` untimed rounds (`--warmup-each`: every length). A length
whose prompt does not fit the model's context window is skipped with a note. The report per
length: medians (min-max) in ms; input tokens per second; G op/s of the floor and of
llama.cpp's eval (`bench.flops.arithmetic`: linear maps, causal attention after the
schema part, the head at the last position) and, for an int8 model, their share of the
CPU's int8 peak (`engine.kernels.peak.int8_peak().all_threads`); the per-round ratios
llama.cpp eval / PCD warm and llama.cpp decision / PCD warm; PCD warm's growth from the
previous length; each method's peak RSS at that length (the process's high-water mark,
VmHWM, reset through `/proc/self/clear_refs` before each call and read after it; the max
over the length's calls; where the reset is refused, `ru_maxrss`, the process-wide peak so
far); the decision's answer and llama.cpp's agreement with it; and `attention_ms` where the
decision reports it.

`run` measures a sweep (`SweepOptions`) and returns its JSON-ready dict; `table`
(`long_report`) prints it. Two command lines run it: `pcd bench --lengths 256,1024,2048`
(`pcd_tools.cli.bench`) and the script `benchmarks/long_inputs.py`
(`pcd_tools.cli.long_inputs`, which has every option above):

    python benchmarks/long_inputs.py --model 1.5b --rounds 3 --texts 2 --json out.json
    python benchmarks/long_inputs.py --lengths 256,1024 --rounds 1 --no-peer   # embedded
    python benchmarks/long_inputs.py --from-json out.json
    pcd bench --lengths 256,1024,2048 --runs 3 --json > out.json
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..errors import InvalidArgumentError
from .long_report import METHODS, growth, summarize, table
from .long_text import build_context, thread_messages

__all__ = [
    "DEFAULT_LENGTHS",
    "METHODS",
    "PEER_METHODS",
    "SCHEMAS",
    "TITLES",
    "LongThread",
    "Sweep",
    "SweepOptions",
    "build_context",
    "commit",
    "growth",
    "machine",
    "make_peer",
    "parse_lengths",
    "run",
    "schema_of",
    "summarize",
    "table",
    "thread_messages",
    "versions",
]

ROOT = Path(__file__).resolve().parents[2]  # the repository of an editable install

DEFAULT_LENGTHS = (256, 1024, 2048, 4096, 8192)
SCHEMAS = ("small", "triage")
PEER_METHODS = ("llama_eval", "llama_decision")
TITLES = {
    "pcd_warm": "PCD warm",
    "pcd_cold": "PCD cold",
    "pcd_floor": "PCD floor",
    "llama_eval": "llama.cpp eval",
    "llama_decision": "llama.cpp decision",
}


class LongThread(BaseModel):
    """Route a long customer support email thread."""

    needs_reply_today: bool = Field(
        description="Whether the customer must get an answer from us today"
    )
    topic: Literal["BILLING", "TECHNICAL", "ACCOUNT", "OTHER"] = Field(
        description="Main topic of the thread"
    )


def schema_of(
    name: str, scenarios_dir: str | os.PathLike[str] | None = None, flag: str = "--schema"
) -> Any:
    """The Pydantic model of a sweep's schema: `small` or `triage` (the bench's scenario).

    Args:
        name: `small` or `triage`.
        scenarios_dir: Where `triage` is read from, as `pcd bench` reads its scenarios
            (`scenarios.load_scenarios`); default `scenarios.default_scenarios_dir()`.
        flag: The option that named the schema, for the messages.

    Raises:
        InvalidArgumentError: on another name, or for `triage` when no scenarios package
            with a `triage` scenario is found (the message names `--scenarios-dir`).
    """
    if name == "small":
        return LongThread
    if name == "triage":
        from .scenarios import load_scenarios

        try:
            scenarios = load_scenarios(scenarios_dir)
        except InvalidArgumentError as e:
            raise InvalidArgumentError(
                f"{flag} triage is the triage scenario of `pcd bench`: {e}"
            ) from e
        if "triage" not in scenarios:
            raise InvalidArgumentError(
                f"{flag} triage: the scenarios at {scenarios_dir or 'benchmarks/scenarios'} "
                f"have no triage scenario (they have {sorted(scenarios)}); pass --scenarios-dir "
                "PATH of the repository's benchmarks/scenarios."
            )
        return scenarios["triage"].schema
    raise InvalidArgumentError(f"unknown {flag} {name!r}; accepted: {', '.join(SCHEMAS)}")


def parse_lengths(text: str, flag: str = "--lengths") -> list[int]:
    """The context lengths of `--lengths`: positive whole numbers, comma-separated.

    Args:
        text: The option's value, e.g. `"256,1024,2048"` (spaces around the commas allowed).
        flag: The option, for the message.

    Raises:
        InvalidArgumentError: naming `flag`, what it accepts and what it got, when a part
            is not a whole number, is below 1, or there is none.
    """
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    try:
        lengths = [int(p) for p in parts]
    except ValueError:
        lengths = []
    if not lengths or min(lengths) < 1:
        raise InvalidArgumentError(
            f"{flag} takes context token counts, positive whole numbers separated by commas "
            f"(e.g. 256,1024,2048); got {text!r}."
        )
    return lengths


# --- measuring -------------------------------------------------------------------------------


def _rss_reset() -> bool:
    """Resets this process's RSS high-water mark (VmHWM) to its current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _rss_peak_mb(reset: bool) -> float:
    """VmHWM in MiB after a reset, else the process-wide peak (`ru_maxrss`)."""
    if reset:
        try:
            with open("/proc/self/status") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine() -> dict[str, Any]:
    """The CPU: `platform.processor`, `lscpu`'s model name, the int8 / bf16 flags."""
    name = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        name = next(
            (ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")),
            "",
        )
    except OSError:
        pass
    from ..engine.host.openblas_core import cpu_flags

    flags = cpu_flags()
    keys = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8")
    return {
        "processor": platform.processor() or platform.machine(),
        "model_name": name,
        "cpus": os.cpu_count(),
        "flags": {k: k in flags for k in keys},
    }


def versions() -> dict[str, str | None]:
    """Python, pcd-tools, mlx and llama-cpp-python versions (None: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("pcd-tools", "mlx", "llama-cpp-python"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def commit() -> dict[str, Any]:
    """The commit of the repository the package runs from (an editable install or a
    checkout; None for an installed wheel), and whether its working tree had changes."""

    def git(*a: str) -> str:
        if not (ROOT / ".git").exists():  # not a checkout: a wheel in site-packages
            return ""
        try:
            done = subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True)
        except OSError:  # no git
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain"))}


class Sweep:
    """The methods on one decider, schema and (optional) llama.cpp peer.

    Args:
        decider: The loaded `Decider`.
        schema: The compiled schema.
        peer: A `LlamaCppPeer` on the same GGUF, or None.
    """

    def __init__(self, decider: Any, schema: Any, peer: Any = None):
        self.decider, self.schema, self.peer = decider, schema, peer
        self.engine = decider.engine
        self.plan = self.engine.plan(schema)
        self.head = list(self.plan.head_ids)
        self.tail = list(self.plan.tail_ids)
        self.methods = tuple(m for m in METHODS if peer is not None or m not in PEER_METHODS)
        self._llama_ran = False

    def fits(self, tokens: int) -> str | None:
        """None when a context of `tokens` fits the model's window, else why not."""
        from ..errors import ContextTooLongError

        try:
            self.engine.check_length(self.plan, [0] * tokens)
        except ContextTooLongError as e:
            return f"skipped: {e}"
        return None

    def prepare(self, method: str) -> None:
        """Untimed: the state `method` starts from. After a llama.cpp call, first waits for
        its OpenMP threads to stop spinning (`settle`); PCD cold drops the cached schema
        part (its token plan built again, as `pcd bench` does); PCD warm and the floor have
        it cached; llama.cpp's eval keeps only the schema part in its KV cache."""
        from ..baselines.llama_cpp import settle

        if self._llama_ran:
            settle()
            self._llama_ran = False
        if method == "pcd_cold":
            self.engine.clear_cache()
            self.plan = self.engine.plan(self.schema)
        elif method in ("pcd_warm", "pcd_floor"):
            if self.plan.head_ids not in self.engine.prefix_cache:
                self.decider.decide(self.schema, "A short message.")
        elif method == "llama_eval":
            llama = self.peer.llama
            head = self.head
            if llama.n_tokens < len(head) or list(llama.input_ids[: len(head)]) != head:
                llama.reset()
                llama.eval(head)
            llama.n_tokens = len(head)  # the schema part stays; eval drops the rest

    def run(self, method: str, ctx: str) -> dict[str, Any]:
        """One call of `method` on `ctx` after `prepare(method)`: its own `ms` (the
        decision's `elapsed_ms`, the floor's and llama.cpp's wall times) and what it
        answered."""
        from ..baselines.generation import warm_prefill_ms

        row: dict[str, Any] = {}
        if method in ("pcd_warm", "pcd_cold"):
            d = self.decider.decide(self.schema, ctx)
            row.update(
                ms=d.elapsed_ms,
                prefill_ms=d.prefill_ms,
                fields_ms=d.suffix_eval_ms,
                hit=d.prefix_cache_hit,
                prompt_tokens=d.prompt_tokens,
                threads=self.engine.threads,
                answer={k: f.label for k, f in d.fields.items()},
            )
            attention = getattr(d, "attention_ms", None)  # where the engine reports it
            if attention is not None:
                row["attention_ms"] = float(attention)
        elif method == "pcd_floor":
            ms = warm_prefill_ms(self.decider, self.schema, ctx)
            row.update(ms=ms, threads=self.engine.threads)
        elif method == "llama_eval":
            rest = self.engine.encode_ids(ctx) + self.tail
            self._llama_ran = True
            t0 = time.perf_counter()
            self.peer.llama.eval(rest)
            row["ms"] = (time.perf_counter() - t0) * 1e3
        elif method == "llama_decision":
            self._llama_ran = True
            r = self.peer.run(self.schema, ctx, warm=True)  # settles after itself
            row.update(
                ms=r.wall_ms,
                prefill_ms=r.prefill_ms,
                tokens=r.tokens,
                valid=bool(r.result.schema_match),
                answer=r.result.values,
            )
        else:
            raise ValueError(f"unknown method {method!r}; accepted: {', '.join(METHODS)}")
        return row

    def once(self, method: str, ctx: str) -> dict[str, Any]:
        """`prepare` and `run`, with the peak RSS of the call (`_rss_peak_mb`)."""
        self.prepare(method)
        reset = _rss_reset()
        row = self.run(method, ctx)
        row["peak_rss_mb"] = _rss_peak_mb(reset)
        return row


def make_peer(
    decider: Any, schema: Any, longest: int, threads: int | None = None
) -> tuple[Any, str | None]:
    """The llama.cpp peer on the decider's GGUF, on `threads` (default the thread budget),
    its context sized for the schema part, `longest` context tokens, the answer start and
    the peer's generation limit; or None and why not."""
    from ..baselines.generation import _check_max
    from ..baselines.llama_cpp import LlamaCppPeer, PeerUnavailableError

    plan = decider.engine.plan(schema)
    need = len(plan.head_ids) + longest + len(plan.tail_ids) + _check_max(None, decider, schema)
    try:
        return LlamaCppPeer(decider, n_threads=threads, n_ctx=-(-(need + 8) // 256) * 256), None
    except PeerUnavailableError as e:
        return None, f"llama.cpp skipped: {e}"


@dataclass(frozen=True)
class SweepOptions:
    """What `run` measures (the script's options; `pcd bench --lengths` sets some of them).

    Args:
        lengths: Context tokens per length, in order (each >= 1).
        model: The model source `Decider.load` takes (None: the embedded model); the
            script's names go through `pcd_tools.cli.long_inputs.resolve_model` first,
            `pcd bench`'s through `engine.load.sources.model_source`.
        compute: `Decider.load`'s `compute`.
        schema: `small` or `triage` (`schema_of`).
        rounds: Timed rounds per text and length (>= 1).
        texts: Different texts per length (>= 1).
        warmup: Untimed rounds at the first length (>= 0).
        warmup_each: Warm up at every length.
        threads: Both sides' threads; 0: the thread budget.
        no_peer: Why llama.cpp is left out (printed and kept in the JSON's `peer`); None
            runs it where it can (`make_peer`).
        json: A file the results are written to after each length, or None.
        scenarios_dir: Where the `triage` schema is read from (`schema_of`).
    """

    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    model: str | None = None
    compute: str = "auto"
    schema: str = "small"
    rounds: int = 3
    texts: int = 1
    warmup: int = 1
    warmup_each: bool = False
    threads: int = 0
    no_peer: str | None = None
    json: Path | None = None
    scenarios_dir: str | None = None


def _print(line: str) -> None:
    print(line, flush=True)


def run(args: SweepOptions, log: Callable[[str], None] = _print) -> dict[str, Any]:
    """Measures the sweep of `args`; returns its JSON-ready dict (`table` prints it).

    Args:
        args: The options.
        log: Called with each progress line (a note on llama.cpp, a skipped length, each
            call's time); default printed to stdout.

    Raises:
        InvalidArgumentError: for a schema `schema_of` refuses (before the model loads).
    """
    from dataclasses import asdict

    from ..decide.decider import Decider
    from ..engine.host.threads import thread_budget
    from ..engine.kernels import qgemm
    from ..schema import compile_schema
    from .flops import arithmetic

    model = schema_of(args.schema, args.scenarios_dir)
    threads = args.threads or thread_budget()
    os.environ["PCD_THREADS"] = str(threads)  # fixed, as llama.cpp's: no fitting to neighbours
    source = args.model
    decider = Decider.load(source, compute=args.compute)
    schema = compile_schema(model)
    sweep = Sweep(decider, schema)
    fitting = [t for t in args.lengths if sweep.fits(t) is None]
    peer: Any = None
    peer_note: str | None = "llama.cpp left out: " + (
        args.no_peer or "no length fits the model's window"
    )
    if args.no_peer is None and fitting:
        peer, peer_note = make_peer(decider, schema, max(fitting), threads)
    if peer_note:
        log(peer_note)
    sweep = Sweep(decider, schema, peer)
    ar = arithmetic(decider.loaded.model)
    compute = getattr(decider.loaded, "compute", None)
    peak = peak_path = None
    if compute == "int8" and decider.engine.device == "cpu":
        from ..engine.kernels.peak import int8_peak

        p = int8_peak()  # AMX where the prefill's products run on the tiles
        peak, peak_path = (p.all_threads, p.path) if p is not None else (None, None)
    out: dict[str, Any] = {
        "model": decider.model_id,
        "model_path": str(getattr(decider.loaded, "path", "") or source),
        "compute": compute,
        "schema": args.schema,
        "fields": len(schema.fields),
        "schema_tokens": len(sweep.head),
        "tail_tokens": len(sweep.tail),
        "threads": {"pcd": threads, "llama_cpp": peer.n_threads if peer else None},
        "n_ctx": int(peer.llama.n_ctx()) if peer else None,
        "machine": {**machine(), "isa": qgemm.isa()},
        "versions": versions(),
        **commit(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "rounds": args.rounds,
        "texts": args.texts,
        "warmup": args.warmup,
        "peer": peer_note,
        "methods": list(sweep.methods),
        "arithmetic": asdict(ar) if ar else None,
        "int8_peak_gops": peak,
        "int8_peak_path": peak_path,
        "lengths": [],
    }
    encode, decode = decider.engine.encode_ids, decider.loaded.tokenizer.decode
    k = 0  # rounds so far: the rotation of the order
    for li, tokens in enumerate(args.lengths):
        why = sweep.fits(tokens)
        if why is not None:
            log(f"{tokens} tokens: {why}")
            out["lengths"].append({"tokens": tokens, "skipped": why})
            continue
        if li == 0 or args.warmup_each:  # kernels built, pages in, the grammar built
            for w in range(args.warmup):
                ctx, _ = build_context(encode, decode, tokens, 0, -1 - w)
                for m in sweep.methods:
                    sweep.once(m, ctx)
        rounds = []
        for t in range(args.texts):
            for r in range(args.rounds):
                ctx, n = build_context(encode, decode, tokens, t, r)
                order = (
                    sweep.methods[k % len(sweep.methods) :]
                    + sweep.methods[: k % len(sweep.methods)]
                )
                k += 1
                rec: dict[str, Any] = {
                    "text": t,
                    "round": r,
                    "actual_tokens": n,
                    "order": list(order),
                    "methods": {},
                }
                for m in order:
                    rec["methods"][m] = sweep.once(m, ctx)
                    log(
                        f"{tokens} tokens (text {t}, round {r + 1}) {m}: {rec['methods'][m]['ms']:,.0f} ms"
                    )
                rounds.append(rec)
        row = summarize(tokens, rounds, out)
        row["ru_maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        row["fewer_threads"] = decider.engine.stats.get("fewer_threads", 0)
        out["lengths"].append(row)
        growth(out["lengths"])
        if args.json:  # a long sweep keeps what it measured so far
            args.json.write_text(json.dumps(out, indent=1, default=str))
    return out
