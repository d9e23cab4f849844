"""Latency of `/v1/chat/completions` against `/v1/decide` on the same decision.

One live `pcd serve` app (in-process uvicorn, loopback, the embedded model unless
`--model`) answers the same triage decision through both routes:

- **decide**: `POST /v1/decide` with the schema as a dict and the ticket as `context`;
- **chat**: `POST /v1/chat/completions` with the same schema as a `response_format` JSON
  schema (what `client.chat.completions.parse(response_format=Model)` sends) and the
  ticket as the one user message.

Both give the same prompt, hence the same model work: the difference is the route's own
cost (reading messages, compiling the JSON schema, the OpenAI-shaped answer). Requests
alternate (decide, chat, decide, chat, ...) over the same tickets so that both see the
same background load, one at a time, warm. The ratio is per pair (chat / decide); the
table gives medians and ranges over rounds.

Usage:
    python benchmarks/chat_overhead.py --rounds 5 --tickets 8
    python benchmarks/chat_overhead.py --rounds 3 --json chat_overhead.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TICKETS = [
    "I was charged twice for invoice #{n}; please refund the duplicate payment.",
    "The checkout page returns HTTP 500 for every EU customer since {n}:00 UTC.",
    "Could you add dark mode to the dashboard? Not urgent, just an idea ({n}).",
    "I cannot log in: the password reset e-mail never arrives (ticket {n}).",
    "Our enterprise plan renewal {n} shows the wrong seat count. Please fix before Friday.",
    "Your API dropped {n} webhooks last night and our orders are stuck.",
    "How do I export my data to CSV? Asking for report {n}.",
    "Thanks, release {n} is fantastic and the team loves it!",
]
INSTRUCTIONS = "Triage an inbound customer support ticket."
FIELDS = {
    "priority": (["P0_CRITICAL", "P1_HIGH", "P2_NORMAL", "P3_LOW"], "Urgency tier"),
    "department": (["ENGINEERING", "BILLING", "ACCOUNT", "SALES"], "Team that owns it"),
}


def decide_body(text: str) -> dict[str, Any]:
    fields: dict[str, Any] = {
        k: {"type": "enum", "choices": c, "description": d} for k, (c, d) in FIELDS.items()
    }
    fields["escalate"] = {"type": "boolean", "description": "Page the on-call engineer?"}
    return {
        "schema": {"name": "Triage", "instructions": INSTRUCTIONS, "fields": fields},
        "context": text,
    }


def chat_body(text: str) -> dict[str, Any]:
    props: dict[str, Any] = {
        k: {"enum": c, "type": "string", "description": d} for k, (c, d) in FIELDS.items()
    }
    props["escalate"] = {"type": "boolean", "description": "Page the on-call engineer?"}
    schema = {
        "title": "Triage",
        "description": INSTRUCTIONS,
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": False,
    }
    return {
        "model": "pcd",
        "messages": [{"role": "user", "content": text}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "Triage", "schema": schema, "strict": True},
        },
    }


def answers(path: str, body: dict[str, Any]) -> dict[str, Any]:
    if path == "/v1/decide":
        return {k: v["value"] for k, v in body["parsed_json"].items()}
    return dict(json.loads(body["choices"][0]["message"]["content"]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model to serve (default: the embedded one)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tickets", type=int, default=8)
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()

    from pcd_tools import Decider
    from pcd_tools.serve.app import create_app
    from tests.serve.live import live_server

    decider = Decider.load(args.model) if args.model else Decider.load()
    texts = [TICKETS[i % len(TICKETS)].format(n=100 + 7 * i) for i in range(args.tickets)]
    routes = {"decide": ("/v1/decide", decide_body), "chat": ("/v1/chat/completions", chat_body)}
    lat: dict[str, list[float]] = {"decide": [], "chat": []}
    ratios: list[float] = []
    with live_server(create_app(decider)) as url, httpx.Client(base_url=url, timeout=120) as c:
        for path, make in routes.values():  # warm both routes (prefix cache, plans)
            c.post(path, json=make(texts[0])).raise_for_status()
        for r in range(args.rounds):
            per = {"decide": 0.0, "chat": 0.0}
            for text in texts:
                got = {}
                for name, (path, make) in routes.items():
                    t0 = time.perf_counter()
                    resp = c.post(path, json=make(text))
                    dt = time.perf_counter() - t0
                    resp.raise_for_status()
                    got[name] = answers(path, resp.json())
                    lat[name].append(dt)
                    per[name] += dt
                assert got["decide"] == got["chat"], (text, got)
            ratios.append(per["chat"] / per["decide"])
            print(
                f"round {r + 1}: decide {1000 * per['decide'] / len(texts):.1f} ms, chat "
                f"{1000 * per['chat'] / len(texts):.1f} ms per request, ratio {ratios[-1]:.3f}",
                flush=True,
            )
    # The route's own work, without the model: read the request, compile its schema (a
    # warm cache, as in the loop above) and write the answer, for the same decision.
    from pcd_tools.serve.native import parse_decide
    from pcd_tools.serve.openai_chat import parse_chat
    from pcd_tools.serve.openai_reply import build_completion

    tok = decider.engine.tokenizer
    decision = decider.decide(parse_decide(decide_body(texts[0])).schema, texts[0])
    own: dict[str, list[float]] = {"decide": [], "chat": []}
    for _ in range(200):
        t0 = time.perf_counter()
        parse_decide(decide_body(texts[0]))
        json.dumps(decision.to_response())
        t1 = time.perf_counter()
        req = parse_chat(chat_body(texts[0]), tok)
        json.dumps(build_completion(req, decision, model="m", tokenizer=tok).body())
        t2 = time.perf_counter()
        own["decide"].append(t1 - t0)
        own["chat"].append(t2 - t1)
    own_ms = {k: 1000 * statistics.median(v) for k, v in own.items()}
    stats = {
        k: {
            "median_ms": 1000 * statistics.median(v),
            "min_ms": 1000 * min(v),
            "max_ms": 1000 * max(v),
        }
        for k, v in lat.items()
    }
    result = {
        "route_own_ms": own_ms,
        "model": decider.model_id,
        "machine": f"{platform.machine()}, {platform.platform()}",
        "rounds": args.rounds,
        "tickets": args.tickets,
        "latency": stats,
        "ratio_chat_over_decide": {
            "median": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
        },
    }
    print(f"\n{decider.model_id}, {args.rounds} rounds x {args.tickets} tickets, one at a time")
    print("| route | latency median (range) |")
    print("|---|---|")
    for k, s in stats.items():
        print(f"| {k} | {s['median_ms']:.1f} ms ({s['min_ms']:.1f}-{s['max_ms']:.1f}) |")
    print(
        f"each route's own work (parse, compile, answer; no model), median of 200: decide "
        f"{own_ms['decide']:.3f} ms, chat {own_ms['chat']:.3f} ms; the difference is "
        f"{100 * (own_ms['chat'] - own_ms['decide']) / stats['decide']['median_ms']:.3f}% "
        "of a decide request above"
    )
    q = result["ratio_chat_over_decide"]
    print(f"chat / decide, per round: {q['median']:.3f} ({q['min']:.3f}-{q['max']:.3f})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
