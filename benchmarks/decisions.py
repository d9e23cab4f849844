"""`POST /v1/decisions` against the Python API on the same questions, and 20 questions
against 4 over the same input.

One live `pcd serve` app (in-process uvicorn, loopback, the embedded model unless
`--model`) and the client run on one machine, warm, one request at a time:

- **overhead**: the same 4 questions (a predicate, two choices, a score) over the same
  ticket, asked through `openai.OpenAI(base_url=...).decisions.create` and through
  `Decider.decide` on the `Schema` the request compiles to. The order alternates per
  ticket (python, http, then http, python, ...) so both see the same background load; the
  ratio is per round (http time / python time), target <= 1.15;
- **questions**: a 20-question request against a 4-question one (its first 4 questions)
  over the same ticket, both through the route, alternating. The questions share one
  prefill of the ticket; each question adds its own answer's tokens. Ratio per round.

The answers of the two paths are checked equal (1e-4) on every ticket.

Usage:
    python benchmarks/decisions.py --rounds 3 --tickets 4
    python benchmarks/decisions.py --rounds 5 --tickets 8 --json decisions.json
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

FOUR: list[dict[str, Any]] = [
    {"type": "predicate", "name": "billing", "instructions": "Is this ticket about billing?"},
    {
        "type": "choice",
        "name": "team",
        "instructions": "Which team should own this ticket?",
        "choices": [
            {"value": "billing", "description": "payments, invoices, refunds"},
            {"value": "engineering", "description": "bugs, outages, integrations"},
            {"value": "accounts", "description": "logins, seats, plans"},
            {"value": "sales", "description": "new business and feature requests"},
        ],
    },
    {
        "type": "choice",
        "name": "tone",
        "instructions": "What is the customer's tone?",
        "choices": [{"value": "calm"}, {"value": "annoyed"}, {"value": "angry"}],
    },
    {
        "type": "score",
        "name": "urgency",
        "instructions": "How urgent is it?",
        "levels": [
            {"label": "can wait"},
            {"label": "this week"},
            {"label": "today", "description": "must be handled today"},
        ],
    },
]
_MORE = [
    "Does the customer ask for money back?",
    "Is a production system down?",
    "Does the ticket mention a deadline?",
    "Is this a feature request?",
    "Is the customer on an enterprise plan?",
    "Does the ticket mention a number or identifier?",
    "Is the customer thanking us?",
    "Does it concern logging in?",
]
TWENTY: list[dict[str, Any]] = [
    *FOUR,
    *({"type": "predicate", "name": f"p{i}", "instructions": q} for i, q in enumerate(_MORE)),
    *(
        {
            "type": "choice",
            "name": f"c{i}",
            "instructions": q,
            "choices": [{"value": "yes"}, {"value": "no"}, {"value": "unclear"}],
        }
        for i, q in enumerate(
            [
                "Will the reply need an engineer?",
                "Will the reply need finance?",
                "Should a manager be told?",
                "Is more information needed from the customer?",
            ]
        )
    ),
    *(
        {
            "type": "score",
            "name": f"s{i}",
            "instructions": q,
            "levels": [{"label": "low"}, {"label": "medium"}, {"label": "high"}],
        }
        for i, q in enumerate(
            [
                "How much business impact does it have?",
                "How frustrated is the customer?",
                "How hard is it to fix?",
                "How likely is the customer to churn?",
            ]
        )
    ),
]
assert len(TWENTY) == 20


def _summary(xs: list[float], scale: float = 1.0) -> dict[str, float]:
    return {
        "median": scale * statistics.median(xs),
        "min": scale * min(xs),
        "max": scale * max(xs),
    }


def _check_same(http: Any, d: Any) -> None:
    """The route's answers equal the Python API's on the compiled schema (1e-4)."""
    for a in http.answers:
        dist = d.fields[a.name].distribution
        if a.type == "predicate":
            got, want = [a.probability], [dist[True]]
        else:  # choice values are the labels; score values the level indices
            got = [p.probability for p in a.probabilities]
            want = [dist[p.value] for p in a.probabilities]
        if max(abs(g - w) for g, w in zip(got, want)) > 1e-4:
            raise AssertionError(f"{a.name}: route {got} != python {want}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model to serve (default: the embedded one)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tickets", type=int, default=4)
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()

    import openai

    from pcd_tools import Decider
    from pcd_tools.serve.app import create_app
    from pcd_tools.serve.decisions import build_decision, parse_decisions
    from tests.serve.live import live_server

    decider = Decider.load(args.model) if args.model else Decider.load()
    texts = [TICKETS[i % len(TICKETS)].format(n=100 + 7 * i) for i in range(args.tickets)]
    schema4 = parse_decisions({"model": "pcd", "input": "x", "questions": FOUR}).schema
    lat: dict[str, list[float]] = {"python": [], "http": [], "http4": [], "http20": []}
    over: list[float] = []
    twenty: list[float] = []
    tokens: dict[str, int] = {}
    with live_server(create_app(decider), timeout=600) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)

        def http(text: str, qs: list[dict[str, Any]]) -> tuple[float, Any]:
            t0 = time.perf_counter()
            r = client.decisions.create(model="pcd", input=text, questions=qs)  # type: ignore[arg-type]
            return time.perf_counter() - t0, r

        def python(text: str) -> tuple[float, Any]:
            t0 = time.perf_counter()
            d = decider.decide(schema4, text)
            return time.perf_counter() - t0, d

        for qs in (FOUR, TWENTY):  # warm: the questions' prefix cache, both paths
            http(texts[0], qs)
        python(texts[0])
        for r in range(args.rounds):
            per = dict.fromkeys(lat, 0.0)
            for i, text in enumerate(texts):
                first_http = (r + i) % 2 == 1
                if first_http:
                    th, rh = http(text, FOUR)
                    tp, d = python(text)
                else:
                    tp, d = python(text)
                    th, rh = http(text, FOUR)
                _check_same(rh, d)
                if first_http:
                    t20, r20 = http(text, TWENTY)
                    t4, _ = http(text, FOUR)
                else:
                    t4, _ = http(text, FOUR)
                    t20, r20 = http(text, TWENTY)
                tokens = {"4": rh.usage.input_tokens, "20": r20.usage.input_tokens}
                for k, t in (("python", tp), ("http", th), ("http4", t4), ("http20", t20)):
                    lat[k].append(t)
                    per[k] += t
            over.append(per["http"] / per["python"])
            twenty.append(per["http20"] / per["http4"])
            n = len(texts)
            print(
                f"round {r + 1}: python {1000 * per['python'] / n:.1f} ms, /v1/decisions "
                f"{1000 * per['http'] / n:.1f} ms (ratio {over[-1]:.3f}); 20 questions "
                f"{1000 * per['http20'] / n:.1f} ms, 4 questions {1000 * per['http4'] / n:.1f} ms "
                f"(ratio {twenty[-1]:.3f})",
                flush=True,
            )
    # The route's own work, without the model: parse and compile the request (a warm
    # schema cache, as above) and write the answer.
    body = {"model": "pcd", "input": texts[0], "questions": FOUR}
    d = decider.decide(schema4, texts[0])
    own: list[float] = []
    for _ in range(200):
        t0 = time.perf_counter()
        req = parse_decisions(body)
        json.dumps(
            build_decision(
                req,
                d,
                model="m",
                input_tokens=d.prompt_tokens,
                cached_tokens=0,
                cache_write_tokens=0,
            )
        )
        own.append(time.perf_counter() - t0)
    result = {
        "model": decider.model_id,
        "machine": f"{platform.machine()}, {platform.platform()}",
        "rounds": args.rounds,
        "tickets": args.tickets,
        "latency_ms": {k: _summary(v, 1000.0) for k, v in lat.items()},
        "ratio_http_over_python": _summary(over),
        "ratio_20_over_4_questions": _summary(twenty),
        "input_tokens": tokens,
        "route_own_ms_median": 1000 * statistics.median(own),
    }
    print(f"\n{decider.model_id}, {args.rounds} rounds x {args.tickets} tickets, one at a time")
    print("| path | latency median (range) |")
    print("|---|---|")
    names = {
        "python": "Decider.decide, 4 questions",
        "http": "/v1/decisions, 4 questions (overhead pair)",
        "http4": "/v1/decisions, 4 questions (questions pair)",
        "http20": "/v1/decisions, 20 questions",
    }
    for k, s in result["latency_ms"].items():
        print(f"| {names[k]} | {s['median']:.1f} ms ({s['min']:.1f}-{s['max']:.1f}) |")
    for key, label in (
        ("ratio_http_over_python", "/v1/decisions / Python API, per round"),
        ("ratio_20_over_4_questions", "20 questions / 4 questions, per round"),
    ):
        q = result[key]
        print(f"{label}: {q['median']:.3f} ({q['min']:.3f}-{q['max']:.3f})")
    print(
        f"input tokens: 4 questions {tokens['4']}, 20 questions {tokens['20']}; the route's "
        f"own work (parse, compile, answer; no model), median of 200: "
        f"{result['route_own_ms_median']:.3f} ms"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
