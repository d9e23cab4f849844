"""What an MCP tool call costs over calling `decide` in the same process.

On the embedded model (or `--model`), for a three-field scored schema (team / urgency /
needs_human of `examples/router.py`, without its generated summary) and the twelve sample
emails, each round times, in rotating order:

- **decide**: `Decider.decide` in this process, warm (the schema's prefix cached);
- **mcp stdio**: the tool called through the SDK's client over stdio (`pcd mcp`);
- **mcp http**: the same over streamable HTTP with a bearer key;
- and per batch of the twelve emails: `decide_many` against the `_batch` tool (stdio).

The servers run in subprocesses with the same thread settings; the table gives the median
and range over rounds of the per-call time, and the MCP overhead per call (median of the
per-round differences). Usage:

    python benchmarks/mcp_overhead.py [--model M.gguf] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client
from pydantic import BaseModel, Field

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.router import EMAILS, Route  # noqa: E402


class RouteScored(BaseModel):
    """Route an incoming customer-support email to the team that owns it, and say how
    urgent it is and whether a person must read it first."""

    team: Literal["billing", "technical", "account", "shipping", "sales"] = Field(
        description=Route.model_fields["team"].description
    )
    urgency: Literal["low", "normal", "high"] = Field(
        description=Route.model_fields["urgency"].description
    )
    needs_human: bool = Field(description=Route.model_fields["needs_human"].description)


TEXTS = [t for t, _ in EMAILS]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _args(model: str | None) -> list[str]:
    args = ["-m", "pcd_tools", "mcp", "--schema", "benchmarks.mcp_overhead:RouteScored"]
    return args + (["--model", model] if model else [])


async def _per_call(session: ClientSession) -> float:
    t = time.perf_counter()
    for text in TEXTS:
        await session.call_tool("route_scored", {"text": text})
    return (time.perf_counter() - t) * 1000 / len(TEXTS)


async def _batch(session: ClientSession) -> float:
    t = time.perf_counter()
    await session.call_tool("route_scored_batch", {"texts": TEXTS})
    return (time.perf_counter() - t) * 1000


async def run(model: str | None, rounds: int) -> dict[str, list[float]]:
    from pcd_tools import Decider

    decider = Decider.load(model)
    decider.decide_many(RouteScored, TEXTS)  # warm: prefix cached, kernels built
    env = {**os.environ, "PCD_API_KEY": "bench"}
    port = _free_port()
    http = subprocess.Popen(
        [sys.executable, *_args(model), "--http", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stderr=subprocess.DEVNULL,
    )
    times: dict[str, list[float]] = {
        k: [] for k in ("decide", "stdio", "http", "decide_many", "batch")
    }
    params = StdioServerParameters(
        command=sys.executable, args=_args(model), cwd=str(ROOT), env=env
    )
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.3)
        headers = {"Authorization": "Bearer bench"}
        async with (
            stdio_client(params) as (r1, w1),
            ClientSession(r1, w1) as stdio,
            streamablehttp_client(f"http://127.0.0.1:{port}/mcp", headers=headers) as (r2, w2, _),
            ClientSession(r2, w2) as web,
        ):
            await stdio.initialize()
            await web.initialize()
            await _per_call(stdio)  # warm both servers
            await _per_call(web)
            for i in range(rounds):
                names = ["decide", "stdio", "http", "decide_many", "batch"]
                for what in names[i % len(names) :] + names[: i % len(names)]:
                    if what == "decide":
                        t = time.perf_counter()
                        for text in TEXTS:
                            decider.decide(RouteScored, text)
                        times[what].append((time.perf_counter() - t) * 1000 / len(TEXTS))
                    elif what == "decide_many":
                        t = time.perf_counter()
                        decider.decide_many(RouteScored, TEXTS)
                        times[what].append((time.perf_counter() - t) * 1000)
                    elif what == "batch":
                        times[what].append(await _batch(stdio))
                    else:
                        times[what].append(await _per_call(stdio if what == "stdio" else web))
    finally:
        http.terminate()
        http.wait(timeout=30)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    times = anyio.run(run, a.model, a.rounds)

    def cell(v: list[float]) -> str:
        return f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"

    print("| path | ms (median, range) | over decide |")
    print("|---|---|---|")
    for k, base in (
        ("decide", None),
        ("stdio", "decide"),
        ("http", "decide"),
        ("decide_many", None),
        ("batch", "decide_many"),
    ):
        over = (
            ""
            if base is None
            else (f"{statistics.median(x - y for x, y in zip(times[k], times[base])):+.1f} ms")
        )
        unit = " per call" if k in ("decide", "stdio", "http") else " per 12 texts"
        print(f"| {k}{unit} | {cell(times[k])} | {over} |")
    if a.json:
        Path(a.json).write_text(
            json.dumps({"model": a.model or "embedded", "times_ms": times}, indent=1)
        )


if __name__ == "__main__":
    main()
