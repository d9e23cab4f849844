"""The support-email router of `examples/router.py` three ways, on one model:

1. **accuracy of the ported schema**: the team of the twelve sample emails from
   `decider.decide(RouteScored, text)` (the Python API), from `/v1/decisions` with
   `decisions_request(RouteScored, text)` (the docstring as a developer message), and from
   `/v1/decisions` with the same questions and the text as a plain string `input` (the
   port that loses the task instruction); the largest |dp| between the first two;
2. **what a router pays**: `route_on(..., fields="route")` (only `team` decided) against
   `fields="all"` (every field, the generated summary included) on `Route`, per email,
   median and range over `--rounds`, alternating; and whether `team`'s probability is the
   same under both (it must be: a part of a schema is asked under the whole's prompt).

`RouteScored` is `Route` without its generated summary (the Decisions API has no free
text). Usage:

    python benchmarks/agent_port.py [--model M.gguf] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.mcp_overhead import RouteScored  # noqa: E402
from examples.router import EMAILS, Route  # noqa: E402


def accuracy(decider: Any) -> dict[str, Any]:
    from fastapi.testclient import TestClient

    from pcd_tools.schema import decisions_request
    from pcd_tools.serve.app import create_app

    right = {"python": 0, "ported": 0, "string_input": 0}
    dp = 0.0
    with TestClient(create_app(decider)) as client:
        for text, team in EMAILS:
            d = decider.decide(RouteScored, text)
            right["python"] += d.value.team == team
            body = {"model": "pcd", **decisions_request(RouteScored, text)}
            ans = client.post("/v1/decisions", json=body).json()["answers"]
            right["ported"] += ans[0]["choice"] == team
            dist = {x["value"]: x["probability"] for x in ans[0]["probabilities"]}
            dp = max(dp, *(abs(dist[k] - p) for k, p in d.fields["team"].distribution.items()))
            bare = {**body, "input": text}
            ans = client.post("/v1/decisions", json=bare).json()["answers"]
            right["string_input"] += ans[0]["choice"] == team
    return {"n": len(EMAILS), "team_right": right, "max_dp_ported_vs_python": dp}


def router_cost(decider: Any, rounds: int) -> dict[str, Any]:
    from pcd_tools.agents import route_on

    routes = {t: t for t in ("billing", "technical", "account", "shipping", "sales")}
    routers = {
        k: route_on(decider, Route, field="team", routes=routes, fields=k) for k in ("route", "all")
    }
    texts = [t for t, _ in EMAILS]
    for r in routers.values():  # warm: prefix cached, plans compiled
        r.node({"input": texts[0]})
    times: dict[str, list[float]] = {k: [] for k in routers}
    probs: dict[str, list[float]] = {k: [] for k in routers}
    for i in range(rounds):
        for k in ["route", "all"] if i % 2 == 0 else ["all", "route"]:
            t = time.perf_counter()
            recs = [routers[k].node({"input": x})["pcd_decision"] for x in texts]
            times[k].append((time.perf_counter() - t) * 1000 / len(texts))
            probs[k] = [rec["probability"] for rec in recs]
    return {
        "ms_per_email": times,
        "max_dp_team_route_vs_all": max(abs(a - b) for a, b in zip(probs["route"], probs["all"])),
        "fields_in_state": {
            k: sorted(routers[k].node({"input": texts[0]})["pcd_decision"]["decision"]["fields"])
            for k in routers
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    from pcd_tools import Decider

    decider = Decider.load(a.model)
    out = {"model": decider.model_id, "compute": decider.loaded.compute}
    out["accuracy"] = accuracy(decider)
    out["router"] = router_cost(decider, a.rounds)
    acc = out["accuracy"]
    print(f"model {out['model']} ({out['compute']}), {acc['n']} emails, team right:")
    for k, v in acc["team_right"].items():
        print(f"  {k:>13}: {v}/{acc['n']}")
    print(f"  max |dp| ported vs Python API: {acc['max_dp_ported_vs_python']:.2e}")
    r = out["router"]
    for k, v in r["ms_per_email"].items():
        print(
            f"route_on fields={k!r}: {statistics.median(v):.0f} ms/email "
            f"({min(v):.0f}-{max(v):.0f}); state fields {r['fields_in_state'][k]}"
        )
    print(f"  max |dp| of team, 'route' vs 'all': {r['max_dp_team_route_vs_all']:.2e}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
