"""Long inputs: PCD against llama.cpp at each input length (issue 53, item 1).

Agents decide on long inputs (1k-8k tokens). At each length (`--lengths`) the input is a
support / email thread built deterministically (`build_context`) to exactly that many
context tokens under the model's tokenizer (the ids of a longer thread cut at the length,
decoded, and checked by encoding again; the count reached is reported). `--texts` different
threads per length; every round gives each a new leading reference line, so no method sees
a context it has cached. The schema is `small` (one `bool` and one 4-way `Literal`) or
`triage` (the `pcd bench` triage scenario's 28 fields), its prefix cached as an agent runs
it. Each round times, in rotating order, on the same context:

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

Usage:
    python benchmarks/long_inputs.py --model 1.5b --rounds 3 --texts 2 --json out.json
    python benchmarks/long_inputs.py --lengths 256,1024 --rounds 1 --no-peer   # embedded
    python benchmarks/long_inputs.py --from-json out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

METHODS = ("pcd_warm", "pcd_cold", "pcd_floor", "llama_eval", "llama_decision")
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


def schema_of(name: str) -> Any:
    """The Pydantic model of `--schema`: `small` or `triage` (the bench's scenario)."""
    if name == "small":
        return LongThread
    if name == "triage":
        from pcd_tools.bench.scenarios import load_scenarios

        return load_scenarios(ROOT / "benchmarks" / "scenarios")["triage"].schema
    raise SystemExit(f"unknown --schema {name!r}; accepted: small, triage")


# --- the input text --------------------------------------------------------------------------

PEOPLE = [
    ("Dana Whitfield", "northwind-logistics.com"),
    ("Marek Novak", "brightlane.eu"),
    ("Priya Raman", "tessera-health.com"),
    ("Tom Okafor", "kestrel-retail.co.uk"),
    ("Lucia Ferreira", "solvia-energy.pt"),
    ("Ben Hartley", "quarry-media.com"),
    ("Aiko Tanaka", "hoshi-labs.jp"),
    ("Sam Delgado", "copperfield-bank.com"),
]
AGENTS = ["Jordan (Support)", "Elena (Tier 2)", "Chris (Billing)", "Maya (Solutions Engineer)"]
PRODUCTS = ["dashboard exports", "the REST API", "SSO login", "the data pipeline", "webhooks"]
SUBJECTS = [
    "Scheduled exports failing since the last release",
    "Invoice INV-{n} charged twice",
    "Users stuck in an SSO redirect loop",
    "API requests returning 429 well under our quota",
    "Nightly pipeline finishing hours late",
    "Question about renewing our contract",
    "Webhook deliveries retried and duplicated",
]
BODIES = [
    "We noticed that {product} stopped working for part of our team on {day}. About {k} of "
    "our {m} users are affected, mostly in the {region} office. Nothing changed on our side "
    "as far as I can tell: same browsers, same network, same accounts.",
    "I attached the request IDs you asked for: {ids}. All of them failed between {t1} and "
    "{t2} UTC. The error message says '{error}', which does not tell us much.",
    "Our finance team sees two charges of ${amount} on the card ending in {card} for the same "
    "billing period. Could you confirm whether one of them will be refunded, and when?",
    "This is now blocking our month-end reporting. Our CFO expects the numbers on {day} and we "
    "cannot produce them without {product}. Please treat this as urgent.",
    "For context, we are on the Enterprise plan with {m} seats and a 99.9% uptime SLA. Our "
    "account manager is {agent_first}, in case you need to loop them in.",
    "We tried the workaround from your status page (clearing the cache and signing in again) "
    "but it only helped for about {k} minutes before the problem came back.",
    "Separately, we would like to know whether {product} can be configured per workspace. "
    "It is not urgent, but it came up in our quarterly review.",
    "Our security team asks whether any customer data was exposed while this was happening, "
    "and whether you can share an incident report once it is resolved.",
    "I am also copying {cc}, who owns the integration on our side and can answer technical "
    "questions faster than I can.",
]
REPLIES = [
    "Thanks for the details, {name_first}. I have reproduced the issue with {product} on our "
    "side and escalated it to engineering as ticket #{n}. I will update you as soon as I hear "
    "back, at the latest by {day}.",
    "Could you send us the exact time of one failed attempt and the workspace ID? With those "
    "we can pull the server logs for your account. In the meantime, retrying after {k} "
    "minutes should work for most requests.",
    "I checked your billing history: the second charge of ${amount} is a pre-authorisation "
    "that our payment provider releases within {k} business days. If it is still there on "
    "{day}, reply here and I will refund it manually.",
    "Our engineers found the cause: a configuration change on {day} lowered a limit for "
    "accounts in the {region} region. A fix is rolling out now and should reach your "
    "workspace within {k} hours.",
    "I understand the impact on your reporting. I have raised the priority, and {agent_first} "
    "from our solutions team will join the thread to help with a temporary export.",
]
NOTES = [
    "Internal note: customer confirmed on a call that {k} dashboards are affected. Logs show "
    "'{error}' from worker {worker}. Linked to incident INC-{n}.",
    "Log excerpt ({day}):\n  {t1}Z WARN  {worker} job={n} retry=1 status=503\n  {t2}Z ERROR "
    '{worker} job={n} retry=3 status=500 msg="{error}"',
]
ERRORS = [
    "upstream connect error or disconnect/reset before headers",
    "export job exceeded the 600 s limit",
    "SAML response signature mismatch",
    "rate limit exceeded for key",
    "deadlock detected while writing partition",
]
REGIONS = ["Frankfurt", "Dublin", "Virginia", "Singapore", "Sao Paulo"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]


def _fill(template: str, rng: random.Random, who: tuple[str, str]) -> str:
    other = rng.choice(PEOPLE)
    return template.format(
        product=rng.choice(PRODUCTS),
        day=rng.choice(DAYS),
        k=rng.randint(2, 40),
        m=rng.choice([50, 120, 300, 850, 2400]),
        n=rng.randint(10000, 99999),
        region=rng.choice(REGIONS),
        ids=", ".join(f"req_{rng.randrange(16**8):08x}" for _ in range(rng.randint(2, 4))),
        t1=f"{rng.randint(0, 11):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}",
        t2=f"{rng.randint(12, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}",
        error=rng.choice(ERRORS),
        amount=f"{rng.randint(200, 9000):,}.{rng.randint(0, 99):02d}",
        card=rng.randint(1000, 9999),
        agent_first=rng.choice(AGENTS).split()[0],
        name_first=who[0].split()[0],
        cc=f"{other[0]} <{other[0].split()[0].lower()}@{who[1]}>",
        worker=f"export-worker-{rng.randint(1, 9)}",
    )


def thread_messages(text: int) -> Iterator[str]:
    """An endless, deterministic email thread (text number `text`): customer messages,
    agent replies and internal notes in turn, each with headers and a quoted line."""
    rng = random.Random(1009 * text + 17)
    who = PEOPLE[text % len(PEOPLE)]
    subject = rng.choice(SUBJECTS).format(n=rng.randint(10000, 99999))
    ticket = rng.randint(100000, 999999)
    start = datetime.datetime(2025, 10, 1 + text % 20, 8, 30)
    last = ""
    i = 0
    while True:
        kind = ("customer", "agent", "customer", "note")[i % 4] if i else "customer"
        when = start + datetime.timedelta(hours=5 * i, minutes=(37 * i) % 60)
        stamp = when.strftime("%a, %d %b %Y %H:%M")
        if kind == "customer":
            first = who[0].split()[0]
            head = f"From: {who[0]} <{first.lower()}@{who[1]}>\nTo: support@acme-analytics.io"
            paras = [_fill(b, rng, who) for b in rng.sample(BODIES, rng.randint(2, 3))]
            body = "Hi team,\n\n" + "\n\n".join(paras) + f"\n\nThanks,\n{first}"
        elif kind == "agent":
            agent = rng.choice(AGENTS)
            head = f"From: {agent} <support@acme-analytics.io>\nTo: {who[0]}"
            body = f"Hi {who[0].split()[0]},\n\n{_fill(rng.choice(REPLIES), rng, who)}\n\nBest regards,\n{agent}"
        else:
            head = "From: Acme Support (internal)\nTo: tier2@acme-analytics.io"
            body = _fill(rng.choice(NOTES), rng, who)
        said = [p for p in last.split("\n\n")[1:-1] if p]  # the last message's own words
        first_sentence = re.match(r"(.+?[.?!])(\s|$)", said[0], re.S) if said else None
        quote = f"\n\n> {first_sentence.group(1)}" if first_sentence else ""
        msg = f"{head}\nDate: {stamp}\nSubject: {'Re: ' if i else ''}[#{ticket}] {subject}\n\n{body}{quote}\n\n"
        last = body
        i += 1
        yield msg


def build_context(
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    tokens: int,
    text: int = 0,
    round_: int = 0,
) -> tuple[str, int]:
    """A support thread of exactly `tokens` context tokens under `encode` (when the
    tokenizer allows; else the nearest count found).

    Args:
        encode: The model's tokenizer, text to ids (no BOS: `engine.encode_ids`).
        decode: Ids to text.
        tokens: The length wanted.
        text: Which thread (different texts per length).
        round_: The leading reference line's number (a new context every round).

    Returns:
        The text and its token count, `len(encode(text))`.
    """
    lead = f"Ticket export LT-{text:02d}-{round_ + 1:03d} (forwarded to the routing agent)\n\n"
    parts = [lead]
    msgs = thread_messages(text)
    chars, want = len(lead), 5 * (tokens + 16)  # about 4 characters a token
    while True:  # enough text, with room to cut
        while chars < want:
            parts.append(next(msgs))
            chars += len(parts[-1])
        ids = encode("".join(parts))
        if len(ids) >= tokens + 16:
            break
        want *= 2
    best: tuple[int, str] | None = None
    for d in (0, -1, 1, -2, 2, -3, 3, -4, 4, -6, 6, -8, 8):  # a cut that re-encodes exactly
        candidate = decode(ids[: tokens + d])
        n = len(encode(candidate))
        if n == tokens:
            return candidate, n
        if best is None or abs(n - tokens) < abs(best[0] - tokens):
            best = (n, candidate)
    assert best is not None
    return best[1], best[0]


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
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
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
    """The repository's commit, and whether its working tree had changes."""

    def git(*a: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True)
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
        from pcd_tools.errors import ContextTooLongError

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
        from pcd_tools.baselines.llama_cpp import settle

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
        from pcd_tools.baselines.generation import warm_prefill_ms

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
    from pcd_tools.baselines.generation import _check_max
    from pcd_tools.baselines.llama_cpp import LlamaCppPeer, PeerUnavailableError

    plan = decider.engine.plan(schema)
    need = len(plan.head_ids) + longest + len(plan.tail_ids) + _check_max(None, decider, schema)
    try:
        return LlamaCppPeer(decider, n_threads=threads, n_ctx=-(-(need + 8) // 256) * 256), None
    except PeerUnavailableError as e:
        return None, f"llama.cpp skipped: {e}"


def _stats(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def summarize(
    tokens: int, rounds: list[dict[str, Any]], sweep_info: dict[str, Any]
) -> dict[str, Any]:
    """One length's summary from its raw rounds (`rounds[i]["methods"][m]` rows)."""
    from pcd_tools.bench.flops import Arithmetic

    ar, peak = sweep_info.get("arithmetic"), sweep_info.get("int8_peak_gops")
    cached, tail = sweep_info["schema_tokens"], sweep_info["tail_tokens"]
    out: dict[str, Any] = {"tokens": tokens, "rounds": rounds, "methods": {}, "ratios": {}}
    out["actual_tokens"] = sorted({r["actual_tokens"] for r in rounds})
    n = statistics.median(r["actual_tokens"] for r in rounds)
    # the floor's and llama.cpp eval's work: context and answer start after the schema part
    ops = Arithmetic(**ar).prefill(int(n) + tail, cached, head_positions=1) if ar else None
    out["prefill_gop"] = ops / 1e9 if ops else None
    names = [m for m in METHODS if all(m in r["methods"] for r in rounds)]
    for m in names:
        rows = [r["methods"][m] for r in rounds]
        ms = [x["ms"] for x in rows]
        st: dict[str, Any] = {"ms": ms, **{f"ms_{k}": v for k, v in _stats(ms).items()}}
        st["tokens_per_s"] = n / (st["ms_median"] / 1e3)
        if ops and m in ("pcd_floor", "llama_eval"):
            st["gops"] = ops / 1e9 / (st["ms_median"] / 1e3)
            if peak:
                st["peak_share"] = st["gops"] / peak
        st["peak_rss_mb"] = max(x["peak_rss_mb"] for x in rows)
        att = [x["attention_ms"] for x in rows if "attention_ms" in x]
        if att:
            st["attention_ms"] = statistics.median(att)
        out["methods"][m] = st
    if "pcd_warm" in names:
        warm = [r["methods"]["pcd_warm"] for r in rounds]
        out["answers"] = [w["answer"] for w in warm]
        out["warm_hits"] = all(w["hit"] for w in warm)
        for m in ("llama_eval", "llama_decision"):
            if m in names:
                ratios = [r["methods"][m]["ms"] / r["methods"]["pcd_warm"]["ms"] for r in rounds]
                out["ratios"][f"{m}/pcd_warm"] = _stats(ratios)
        if "llama_decision" in names:
            same, total = 0, 0
            for r in rounds:
                a, b = r["methods"]["pcd_warm"]["answer"], r["methods"]["llama_decision"]["answer"]
                same += sum(b is not None and b.get(k) == v for k, v in a.items())
                total += len(a)
            out["llama_agreement"] = same / max(1, total)
            out["llama_valid"] = all(r["methods"]["llama_decision"]["valid"] for r in rounds)
    return out


def growth(lengths: list[dict[str, Any]]) -> None:
    """Adds each length's time growth from the previous measured length (PCD warm, the
    floor, llama.cpp's eval and decision), beside the growth of the tokens."""
    prev = None
    for row in lengths:
        if "methods" not in row:
            continue
        if prev is not None:
            row["growth"] = {"tokens": row["tokens"] / prev["tokens"]}
            for m, st in row["methods"].items():
                if m in prev["methods"]:
                    row["growth"][m] = st["ms_median"] / prev["methods"][m]["ms_median"]
        prev = row


def run(args: argparse.Namespace) -> dict[str, Any]:
    from dataclasses import asdict

    from pcd_tools import Decider
    from pcd_tools.bench.flops import arithmetic
    from pcd_tools.engine.host.threads import thread_budget
    from pcd_tools.engine.kernels import qgemm
    from pcd_tools.schema import compile_schema

    threads = args.threads or thread_budget()
    os.environ["PCD_THREADS"] = str(threads)  # fixed, as llama.cpp's: no fitting to neighbours
    source = resolve_model(args.model)
    decider = Decider.load(source, compute=args.compute)
    schema = compile_schema(schema_of(args.schema))
    sweep = Sweep(decider, schema)
    fitting = [t for t in args.lengths if sweep.fits(t) is None]
    peer: Any = None
    peer_note: str | None = "llama.cpp left out: " + (
        "--no-peer" if args.no_peer else "no length fits the model's window"
    )
    if not args.no_peer and fitting:
        peer, peer_note = make_peer(decider, schema, max(fitting), threads)
    if peer_note:
        print(peer_note, flush=True)
    sweep = Sweep(decider, schema, peer)
    ar = arithmetic(decider.loaded.model)
    compute = getattr(decider.loaded, "compute", None)
    peak = None
    if compute == "int8" and decider.engine.device == "cpu":
        from pcd_tools.engine.kernels.peak import int8_peak

        p = int8_peak()
        peak = p.all_threads if p is not None else None
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
        "lengths": [],
    }
    encode, decode = decider.engine.encode_ids, decider.loaded.tokenizer.decode
    k = 0  # rounds so far: the rotation of the order
    for li, tokens in enumerate(args.lengths):
        why = sweep.fits(tokens)
        if why is not None:
            print(f"{tokens} tokens: {why}", flush=True)
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
                    print(
                        f"{tokens} tokens (text {t}, round {r + 1}) {m}: {rec['methods'][m]['ms']:,.0f} ms",
                        flush=True,
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


def resolve_model(name: str | None) -> str | None:
    """A GGUF path, `embedded` / `0.5b` / `1.5b` (the shared models), or any source
    `Decider.load` takes; None loads the embedded model."""
    if not name or name == "embedded":
        return None
    if Path(name).exists():
        return name
    if name in ("0.5b", "1.5b"):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from model_size import model_file

        path = model_file(name)
        if path is None:
            raise SystemExit(f"no model {name!r}: fetch it first (see above)")
        return str(path)
    return name


# --- the table ---------------------------------------------------------------------------------


def _ms(st: dict[str, Any] | None) -> str:
    if not st:
        return "-"
    return f"{st['ms_median']:,.0f} ({st['ms_min']:,.0f}-{st['ms_max']:,.0f})"


def _ratio(r: dict[str, float] | None) -> str:
    return f"**{r['median']:.2f}x** ({r['min']:.2f}-{r['max']:.2f})" if r else "-"


def _gops(st: dict[str, Any] | None) -> str:
    if not st or "gops" not in st:
        return "-"
    share = f" ({st['peak_share']:.0%})" if "peak_share" in st else ""
    return f"{st['gops']:,.0f}{share}"


def _answer(row: dict[str, Any]) -> str:
    answers = row.get("answers") or []
    if not answers:
        return "-"
    if len(answers[0]) <= 3:
        seen: list[str] = []
        for a in answers:
            s = "/".join(str(v) for v in a.values())
            if s not in seen:
                seen.append(s)
        text = "; ".join(seen)
    else:
        text = f"{len(answers[0])} fields"
    if "llama_agreement" in row:
        text += f" ({row['llama_agreement']:.0%} same in llama.cpp"
        text += ")" if row.get("llama_valid", True) else ", some invalid)"
    return text


def table(out: dict[str, Any]) -> str:
    m = out["machine"]
    flags = ", ".join(k for k, v in m["flags"].items() if v) or "none of the listed"
    peak = f"; int8 peak {out['int8_peak_gops']:,.0f} G op/s" if out.get("int8_peak_gops") else ""
    commit_s = (out.get("commit") or "?")[:10] + (" (dirty)" if out.get("dirty") else "")
    lines = [
        f"{out['model']} ({out['compute']}), schema {out['schema']} ({out['fields']} fields, "
        f"{out['schema_tokens']} cached tokens), threads PCD {out['threads']['pcd']} / llama.cpp "
        f"{out['threads']['llama_cpp'] or '-'}; {m['model_name'] or m['processor']} ({flags}){peak}; "
        f"{commit_s}, {out['when']}; {out['texts']} text(s) x {out['rounds']} round(s) per length",
    ]
    if out.get("peer"):
        lines.append(f"({out['peer']})")
    lines += [
        "",
        "ms, median (min-max):",
        "",
        "| context tokens | PCD warm | PCD cold | PCD floor | llama.cpp eval | llama.cpp decision "
        "| eval / PCD warm | decision / PCD warm | PCD warm growth (tokens) | answer |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    rates = [
        "",
        "rates and memory:",
        "",
        "| context tokens | tokens/s: PCD warm, floor, llama.cpp eval, decision | G op/s (of int8 peak): "
        "PCD floor | llama.cpp eval | PCD warm attention ms | peak RSS MiB: warm, cold, floor, eval, decision |",
        "|---|---|---|---|---|---|",
    ]
    for row in out["lengths"]:
        if "methods" not in row:
            lines.append(f"| {row['tokens']:,} | {row['skipped']} |" + " |" * 8)
            continue
        ms = row["methods"]
        tok = ", ".join(f"{a:,}" for a in row["actual_tokens"])
        g = row.get("growth")
        grow = f"{g['pcd_warm']:.2f}x ({g['tokens']:.2f}x)" if g and "pcd_warm" in g else "-"
        lines.append(
            f"| {tok} | {_ms(ms.get('pcd_warm'))} | {_ms(ms.get('pcd_cold'))} | "
            f"{_ms(ms.get('pcd_floor'))} | {_ms(ms.get('llama_eval'))} | "
            f"{_ms(ms.get('llama_decision'))} | {_ratio(row['ratios'].get('llama_eval/pcd_warm'))} | "
            f"{_ratio(row['ratios'].get('llama_decision/pcd_warm'))} | {grow} | {_answer(row)} |"
        )

        tps = ", ".join(
            f"{ms[m]['tokens_per_s']:,.0f}" if m in ms else "-"
            for m in ("pcd_warm", "pcd_floor", "llama_eval", "llama_decision")
        )
        att = ms.get("pcd_warm", {}).get("attention_ms")
        rss = ", ".join(
            f"{ms[m]['peak_rss_mb']:,.0f}" if m in ms else "-"
            for m in ("pcd_warm", "pcd_cold", "pcd_floor", "llama_eval", "llama_decision")
        )
        rates.append(
            f"| {tok} | {tps} | {_gops(ms.get('pcd_floor'))} | {_gops(ms.get('llama_eval'))} | "
            f"{f'{att:,.0f}' if att is not None else '-'} | {rss} |"
        )
    return "\n".join(lines + rates)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="embedded", help="GGUF path, embedded, 0.5b or 1.5b")
    ap.add_argument("--compute", default="auto", help="Decider.load's compute (default auto)")
    ap.add_argument(
        "--lengths", default="256,1024,2048,4096,8192", help="context tokens, comma-separated"
    )
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per text and length")
    ap.add_argument("--texts", type=int, default=1, help="different texts per length")
    ap.add_argument("--schema", choices=("small", "triage"), default="small")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds at the first length")
    ap.add_argument("--warmup-each", action="store_true", help="warm up at every length")
    ap.add_argument(
        "--threads", type=int, default=0, help="both sides' threads (default the thread budget)"
    )
    ap.add_argument("--no-peer", action="store_true", help="leave llama.cpp out")
    ap.add_argument("--json", type=Path, help="write the results (after each length)")
    ap.add_argument("--from-json", type=Path, help="print the tables of an earlier --json")
    args = ap.parse_args(argv)
    if args.from_json:
        print(table(json.loads(args.from_json.read_text())))
        return 0
    try:
        args.lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--lengths takes whole numbers, comma-separated; got {args.lengths!r}")
    if (
        not args.lengths
        or min(args.lengths) < 1
        or args.rounds < 1
        or args.texts < 1
        or args.warmup < 0
        or args.threads < 0
    ):
        ap.error("--lengths, --rounds and --texts must be >= 1, --warmup and --threads >= 0")
    out = run(args)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    print(table(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
