"""Load and fault test for `pcd serve` (loopback only, bounded in count and time).

Phases:
1. **sequential**: the request pool sent one at a time (the baseline, and the reference
   answers), and
2. **concurrent**: N clients for T seconds, mixing `/v1/systemone`, `/v1/decide` and
   `/v1/chat/completions` (a `response_format` JSON schema, as the `openai` client sends);
   each response must echo its request id and match the sequential answer of the same
   input. Phases 1 and 2 alternate in `--rounds` rounds, so that both see the same
   background load on a shared machine;
3. **fault**: malformed, oversized, wrongly typed and Unicode-heavy bodies; afterwards the
   server must still answer `/health` and a normal request.

Usage:
    python benchmarks/load_test.py --clients 16 --seconds 60           # starts its own server
    python benchmarks/load_test.py --url http://127.0.0.1:8000 --api-key KEY
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
from typing import Any

import httpx

QUESTIONS = {
    "billing": {"type": "noul", "instructions": "Is this message about billing or payments?"},
    "tone": {
        "type": "choice",
        "instructions": "What is the tone of the message?",
        "criteria": {
            "calm": "neutral or polite",
            "angry": "upset or hostile",
            "excited": "enthusiastic",
        },
    },
    "urgency": {
        "type": "score",
        "instructions": "How urgent is the message?",
        "criteria": ["can wait", "needs attention this week", "needs attention today"],
    },
}
SCHEMA = {
    "instructions": "Triage an inbound customer support ticket.",
    "fields": {
        "priority": {
            "type": "enum",
            "choices": ["P0_CRITICAL", "P1_HIGH", "P2_NORMAL", "P3_LOW"],
            "description": "Urgency tier based on customer business impact",
        },
        "requires_escalation": {
            "type": "boolean",
            "description": "Whether an on-call engineer must be notified",
        },
        "department": {
            "type": "enum",
            "choices": ["ENGINEERING", "BILLING", "BILLING_DISPUTE", "ACCOUNT", "SALES"],
            "description": "Team that should own the ticket",
        },
    },
}
SUBJECTS = [
    "I was charged twice for invoice #{n}; please refund the duplicate payment.",
    "The checkout page returns HTTP 500 for every EU customer since {n}:00 UTC.",
    "Could you add dark mode to the dashboard? Not urgent, just an idea ({n}).",
    "I cannot log in: the password reset e-mail never arrives (ticket {n}).",
    "Thanks a lot, the new release {n} is fantastic and the team loves it!",
    "Our enterprise plan renewal {n} shows the wrong seat count. Please fix before Friday.",
    "Your API dropped {n} webhooks last night and our orders are stuck. This is unacceptable!",
    "How do I export my data to CSV? Asking for report {n}.",
]


CHAT_SCHEMA = {
    "title": "Triage",
    "description": SCHEMA["instructions"],
    "type": "object",
    "properties": {
        "priority": {
            "enum": SCHEMA["fields"]["priority"]["choices"],
            "type": "string",
            "description": SCHEMA["fields"]["priority"]["description"],
        },
        "requires_escalation": {
            "type": "boolean",
            "description": SCHEMA["fields"]["requires_escalation"]["description"],
        },
        "department": {
            "enum": SCHEMA["fields"]["department"]["choices"],
            "type": "string",
            "description": SCHEMA["fields"]["department"]["description"],
        },
    },
    "required": ["priority", "requires_escalation", "department"],
    "additionalProperties": False,
}


def make_pool(size: int) -> list[dict[str, Any]]:
    """Distinct requests, cycling System One, /v1/decide and /v1/chat/completions."""
    pool = []
    for i in range(size):
        text = SUBJECTS[i % len(SUBJECTS)].format(n=100 + 7 * i)
        if i % 3 == 2:
            fmt = {"type": "json_schema", "json_schema": {"name": "Triage", "schema": CHAT_SCHEMA}}
            pool.append(
                {
                    "path": "/v1/chat/completions",
                    "json": {
                        "model": "pcd",
                        "messages": [{"role": "user", "content": text}],
                        "response_format": fmt,
                    },
                }
            )
        elif i % 3 == 0:
            pool.append(
                {
                    "path": "/v1/systemone",
                    "json": {"model": "jev-latest", "state": text, "questions": QUESTIONS},
                }
            )
        else:
            pool.append({"path": "/v1/decide", "json": {"schema": SCHEMA, "context": text}})
    return pool


def probabilities(path: str, body: dict[str, Any]) -> dict[str, float]:
    """Every probability in a response, flattened, for comparing two answers."""
    out: dict[str, float] = {}
    if path == "/v1/systemone":
        for qid, a in body["answers"].items():
            if a["type"] == "noul":
                out[qid] = a["noul"]
            else:
                for k, p in a["probabilities"].items():
                    out[f"{qid}.{k}"] = p
    elif path == "/v1/chat/completions":
        for name, f in body["choices"][0]["pcd"]["fields"].items():
            for k, p in f["distribution"].items():
                out[f"{name}.{k}"] = p
    else:
        for name, t in body["field_telemetry"].items():
            for c in t["top_choices"]:
                out[f"{name}.{c['choice']}"] = c["probability"]
    return out


def mismatch(a: dict[str, float], b: dict[str, float], tol: float) -> float | None:
    """Largest difference if the answers differ (other keys or beyond `tol`), else None."""
    if a.keys() != b.keys():
        return float("inf")
    worst = max(abs(a[k] - b[k]) for k in a)
    return worst if worst > tol else None


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_loopback(url: str) -> None:
    host = urllib.parse.urlparse(url).hostname or ""
    if host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit(f"error: the load test only targets loopback servers; got {host!r}.")


async def send(client: httpx.AsyncClient, item: dict[str, Any], rid: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    rec: dict[str, Any] = {"rid": rid, "path": item["path"]}
    try:
        r = await client.post(item["path"], json=item["json"], headers={"x-request-id": rid})
        rec["status"] = r.status_code
        rec["echo"] = r.headers.get("x-request-id") == rid
        rec["body"] = (
            r.json() if r.headers.get("content-type", "").startswith("application/json") else None
        )
    except httpx.HTTPError as e:
        rec["status"] = None
        rec["error"] = f"{type(e).__name__}: {e}"
    rec["latency"] = time.perf_counter() - t0
    return rec


async def sequential(client, pool, seconds, max_requests, start=0):
    """Pool items one at a time, from `start`, for `seconds`; returns records and wall time."""
    recs = []
    t0 = time.perf_counter()
    i = start
    while i - start < max_requests and time.perf_counter() - t0 < seconds:
        rec = await send(client, pool[i % len(pool)], f"seq-{i}")
        rec["idx"] = i % len(pool)
        recs.append(rec)
        i += 1
    return recs, time.perf_counter() - t0


async def concurrent(client, pool, clients, seconds, max_requests, start=0):
    """`clients` concurrent loops over the pool for `seconds`."""
    counter = iter(range(start, start + max_requests))
    recs: list[dict[str, Any]] = []
    t0 = time.perf_counter()

    async def worker():
        while time.perf_counter() - t0 < seconds:
            i = next(counter, None)
            if i is None:
                return
            rec = await send(client, pool[i % len(pool)], f"load-{i}")
            rec["idx"] = i % len(pool)
            recs.append(rec)

    await asyncio.gather(*(worker() for _ in range(clients)))
    return recs, time.perf_counter() - t0


def fault_cases(max_body: int) -> list[tuple[str, str, bytes, dict[str, str], set[int]]]:
    q = {"a": {"type": "noul", "instructions": "?"}}
    j = lambda o: json.dumps(o).encode()  # noqa: E731
    uni = "Zürich 東京 🚀🔥 مرحبا שלום e\u0301\u0301 \u200d\ufeff\U0001f600 " * 40
    return [
        ("truncated JSON", "/v1/systemone", b'{"state": "x", "questions": {', {}, {400}),
        ("not JSON", "/v1/decide", b"hello there", {}, {400}),
        ("empty body", "/v1/systemone", b"", {}, {400}),
        ("invalid UTF-8", "/v1/systemone", b'{"state": "\xff\xfe"}', {}, {400}),
        (
            "NaN literal",
            "/v1/decide",
            b'{"schema": {}, "context": "x", "temperature": NaN}',
            {},
            {400},
        ),
        ("deep nesting", "/v1/systemone", b"[" * 50_000 + b"]" * 50_000, {}, {400, 413}),
        (
            "oversized body",
            "/v1/systemone",
            b'{"state": "' + b"x" * (max_body + 10) + b'"}',
            {},
            {413},
        ),
        (
            "context too long",
            "/v1/systemone",
            j({"state": "word " * 12_000, "questions": q}),
            {},
            {413},
        ),
        (
            "65 questions",
            "/v1/systemone",
            j(
                {
                    "state": "x",
                    "questions": {
                        f"q{i}": {"type": "noul", "instructions": "?"} for i in range(65)
                    },
                }
            ),
            {},
            {413},
        ),
        (
            "256 choices",
            "/v1/systemone",
            j(
                {
                    "state": "x",
                    "questions": {
                        "c": {"type": "choice", "criteria": [f"c{i}" for i in range(256)]}
                    },
                }
            ),
            {},
            {422},
        ),
        (
            "unknown question type",
            "/v1/systemone",
            j({"state": "x", "questions": {"c": {"type": "essay"}}}),
            {},
            {422},
        ),
        ("state is a number", "/v1/systemone", j({"state": 42, "questions": q}), {}, {422}),
        ("questions is a list", "/v1/systemone", j({"state": "x", "questions": [1]}), {}, {422}),
        (
            "criteria wrong type",
            "/v1/systemone",
            j({"state": "x", "questions": {"c": {"type": "score", "criteria": {"a": 1}}}}),
            {},
            {422},
        ),
        ("body is a list", "/v1/decide", j([1, 2, 3]), {}, {422}),
        (
            "schema with 1 choice",
            "/v1/decide",
            j({"schema": {"p": {"type": "enum", "choices": ["x"]}}, "context": "x"}),
            {},
            {422},
        ),
        (
            "temperature string",
            "/v1/decide",
            j({"schema": SCHEMA, "context": "x", "temperature": "hot"}),
            {},
            {422},
        ),
        ("context is null", "/v1/decide", j({"schema": SCHEMA, "context": None}), {}, {422}),
        (
            "lone surrogate",
            "/v1/systemone",
            b'{"state": "a \\udc80 b", "questions": {"a": {"type": "noul", "instructions": "?"}}}',
            {},
            {422},
        ),
        ("unknown encoding", "/v1/decide", b"{}", {"content-encoding": "br"}, {415}),
        (
            "plain chat, no response_format",
            "/v1/chat/completions",
            j({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
            {},
            {400},
        ),
        (
            "chat schema with a free-text field",
            "/v1/chat/completions",
            j(
                {
                    "model": "m",
                    "messages": [{"role": "user", "content": "hi"}],
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {
                            "name": "T",
                            "schema": {
                                "type": "object",
                                "properties": {"why": {"type": "string"}},
                                "required": ["why"],
                            },
                        },
                    },
                }
            ),
            {},
            {422},
        ),
        (
            "unicode-heavy state",
            "/v1/systemone",
            j({"state": uni, "questions": QUESTIONS}),
            {},
            {200},
        ),
        (
            "unicode question ids",
            "/v1/systemone",
            j(
                {
                    "state": uni[:200],
                    "questions": {
                        "ñandú 🚀": {"type": "noul", "instructions": "¿Es sobre facturación?"},
                        "税": {"type": "choice", "criteria": {"はい": None, "いいえ": "違う"}},
                    },
                }
            ),
            {},
            {200},
        ),
    ]


async def fault_phase(client: httpx.AsyncClient, max_body: int) -> list[dict[str, Any]]:
    out = []
    for name, path, content, headers, expect in fault_cases(max_body):
        try:
            r = await client.post(
                path, content=content, headers={"content-type": "application/json", **headers}
            )
            status = r.status_code
            try:
                body = r.json()
                msg = body.get("error", {}).get("message") if status != 200 else "ok"
            except ValueError:
                msg = None
        except httpx.HTTPError as e:
            status, msg = None, f"{type(e).__name__}: {e}"
        out.append(
            {
                "case": name,
                "status": status,
                "expected": sorted(expect),
                "ok": status in expect and bool(msg),
                "message": (msg or "")[:160],
            }
        )
    return out


def summarise(recs: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    ok = [r for r in recs if r["status"] == 200]
    lat = [r["latency"] * 1e3 for r in ok]
    return {
        "requests": len(recs),
        "ok_200": len(ok),
        "rejected_429": sum(r["status"] == 429 for r in recs),
        "client_errors_4xx": sum(
            r["status"] is not None and 400 <= r["status"] < 500 and r["status"] != 429
            for r in recs
        ),
        "server_errors_5xx": sum(r["status"] is not None and r["status"] >= 500 for r in recs),
        "lost": sum(r["status"] is None for r in recs),
        "wall_s": round(wall, 2),
        "throughput_rps": round(len(ok) / wall, 3) if wall else 0.0,
        "p50_ms": round(pct(lat, 50), 1),
        "p95_ms": round(pct(lat, 95), 1),
        "p99_ms": round(pct(lat, 99), 1),
        "mean_ms": round(statistics.fmean(lat), 1) if lat else float("nan"),
    }


def batch_stats(metrics_text: str) -> dict[str, float]:
    vals = {}
    for line in metrics_text.splitlines():
        for key in (
            "pcd_batch_size_sum",
            "pcd_batch_size_count",
            "pcd_cancelled_total",
            "pcd_rejected_total",
        ):
            if line.startswith(key + " "):
                vals[key] = float(line.split()[1])
    n = vals.get("pcd_batch_size_count", 0)
    return {
        "batches": n,
        "mean_batch_size": round(vals.get("pcd_batch_size_sum", 0) / n, 2) if n else 0.0,
        "cancelled": vals.get("pcd_cancelled_total", 0),
    }


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "pcd_tools",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--max-body-bytes",
        str(args.max_body_bytes),
    ]
    if args.model:
        cmd += ["--model", args.model]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"error: the server exited with code {proc.returncode}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    sys.exit("error: the server did not become ready within 600 s")


async def main_async(args: argparse.Namespace, url: str) -> dict[str, Any]:
    pool = make_pool(args.pool)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(
        max_connections=args.clients + 4, max_keepalive_connections=args.clients + 4
    )
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=args.timeout, limits=limits
    ) as client:
        for item in pool[:2]:  # warm both schema prefixes
            await send(client, item, "warmup")
        # The phases alternate in rounds, so both see the same background load.
        seq_recs: list[dict[str, Any]] = []
        conc_recs: list[dict[str, Any]] = []
        seq_wall = conc_wall = 0.0
        for r in range(args.rounds):
            print(
                f"round {r + 1}/{args.rounds}: sequential {args.seq_seconds / args.rounds:.0f} s, "
                f"then {args.clients} clients for {args.seconds / args.rounds:.0f} s",
                file=sys.stderr,
            )
            recs, wall = await sequential(
                client, pool, args.seq_seconds / args.rounds, args.max_requests, start=len(seq_recs)
            )
            seq_recs += recs
            seq_wall += wall
            recs, wall = await concurrent(
                client,
                pool,
                args.clients,
                args.seconds / args.rounds,
                args.max_requests,
                start=len(conc_recs),
            )
            conc_recs += recs
            conc_wall += wall
        # Reference answers: the sequential ones, plus one sequential request for any input
        # the sequential rounds did not reach (not counted in the throughput).
        refs: dict[int, dict[str, float]] = {}
        for rec in seq_recs:
            if rec["status"] == 200:
                refs.setdefault(rec["idx"], probabilities(rec["path"], rec["body"]))
        for idx in range(len(pool)):
            if idx not in refs:
                rec = await send(client, pool[idx], f"ref-{idx}")
                if rec["status"] == 200:
                    refs[idx] = probabilities(rec["path"], rec["body"])
        echo_bad = sum(1 for r in conc_recs if r["status"] is not None and not r.get("echo"))
        mismatched = []
        for r in conc_recs:
            if r["status"] == 200 and r["idx"] in refs:
                d = mismatch(probabilities(r["path"], r["body"]), refs[r["idx"]], args.tol)
                if d is not None:
                    mismatched.append({"rid": r["rid"], "max_abs_diff": d})
        unchecked = sum(1 for r in conc_recs if r["status"] == 200 and r["idx"] not in refs)
        metrics = (await client.get("/metrics")).text
        print("fault phase ...", file=sys.stderr)
        faults = [] if args.skip_fault else await fault_phase(client, args.max_body_bytes)
        health = (await client.get("/health")).status_code
        after = await send(client, pool[0], "after-fault")
        after_ok = (
            after["status"] == 200
            and mismatch(probabilities(after["path"], after["body"]), refs.get(0, {}), args.tol)
            is None
        )
    seq = summarise(seq_recs, seq_wall)
    conc = summarise(conc_recs, conc_wall)
    return {
        "config": {
            "rounds": args.rounds,
            "seq_seconds": args.seq_seconds,
            "clients": args.clients,
            "seconds": args.seconds,
            "pool": args.pool,
            "tolerance": args.tol,
            "url": url,
        },
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_at_end": os.getloadavg() if hasattr(os, "getloadavg") else None,
        },
        "sequential": seq,
        "concurrent": conc,
        "speedup": round(conc["throughput_rps"] / seq["throughput_rps"], 2)
        if seq["throughput_rps"]
        else None,
        "echo_mismatches": echo_bad,
        "answer_mismatches": len(mismatched),
        "mismatch_examples": mismatched[:5],
        "unchecked": unchecked,
        "server": batch_stats(metrics),
        "fault": {
            "cases": len(faults),
            "failed": [f for f in faults if not f["ok"]],
            "health_after": health,
            "normal_request_after": after_ok,
        },
        "fault_cases": faults,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="a running loopback server (default: start one)")
    p.add_argument("--api-key", default=os.environ.get("PCD_API_KEY"))
    p.add_argument("--model", help="model for the server this script starts")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument(
        "--seq-seconds",
        type=float,
        default=None,
        help="sequential phase length (default: --seconds; always >= 1 pass)",
    )
    p.add_argument("--pool", type=int, default=32, help="distinct requests")
    p.add_argument(
        "--rounds", type=int, default=4, help="alternate the sequential and concurrent phases"
    )
    p.add_argument("--max-requests", type=int, default=5000)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--tol", type=float, default=2e-3, help="probability tolerance")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20)
    p.add_argument("--skip-fault", action="store_true")
    p.add_argument("--out", help="write the JSON report here")
    args = p.parse_args(argv)
    args.seconds = min(args.seconds, 600.0)
    args.seq_seconds = min(
        args.seq_seconds if args.seq_seconds is not None else args.seconds, 600.0
    )
    proc = None
    if args.url:
        check_loopback(args.url)
        url = args.url.rstrip("/")
    else:
        proc, url = start_server(args)
    try:
        report = asyncio.run(main_async(args, url))
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    text = json.dumps(report, indent=2, default=str)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    brief = {k: v for k, v in report.items() if k != "fault_cases"}
    print(json.dumps(brief, indent=2, default=str))
    c = report["concurrent"]
    ok = (
        c["lost"] == 0
        and c["server_errors_5xx"] == 0
        and report["echo_mismatches"] == 0
        and report["answer_mismatches"] == 0
        and not report["fault"]["failed"]
        and report["fault"]["health_after"] == 200
        and report["fault"]["normal_request_after"]
    )
    print("PASS" if ok else "FAIL", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
