"""Drives `pcd mcp` with the SDK's own client, over stdio or streamable HTTP, and prints
what it found as one JSON object on stdout (tests/mcp/test_protocol.py asserts on it).

    python tests/mcp/client_check.py stdio
    python tests/mcp/client_check.py http [--key KEY]

It runs under whichever `mcp` the interpreter has (1.x in .venv, 2.x in .venv-mcp2), the
server in a subprocess of the same interpreter. Every probability is compared with
`Decider.decide` on the same model in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

import anyio
import jsonschema
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

ROOT = Path(__file__).resolve().parents[2]
# Threads per request stay fixed (as tests/conftest.py sets them), in the server too, so
# both processes reduce in the same order and their probabilities agree to the bit.
os.environ.setdefault("PCD_ADAPTIVE_THREADS", "0")
MAJOR = int(version("mcp").split(".")[0])
SCHEMAS = ["tests.mcp.schemas:ListingReview", "tests.mcp.schemas:SupportTicket"]
TEXTS = [
    "Selling a vintage red lamp, handmade, like new.",
    "Brand new laptop, still sealed in its box.",
    "Old wool jumper, a few holes, green.",
]
MAX_CHARS = 3000


def server_args(extra: list[str]) -> list[str]:
    args = ["-m", "pcd_tools", "mcp", "--max-text-chars", str(MAX_CHARS), "--threshold", "0.6"]
    for s in SCHEMAS:
        args += ["--schema", s]
    return args + extra


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def http_session(url: str, key: str | None):
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if MAJOR >= 2:
        import httpx2 as httpx
    else:
        import httpx
    async with (
        httpx.AsyncClient(headers=headers, timeout=120) as client,
        streamable_http_client(url, http_client=client) as streams,
        ClientSession(streams[0], streams[1]) as session,
    ):
        await session.initialize()
        yield session


@asynccontextmanager
async def stdio_session():
    params = StdioServerParameters(
        command=sys.executable, args=server_args([]), cwd=str(ROOT), env=dict(os.environ)
    )
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def structured(result: Any) -> Any:
    return getattr(result, "structuredContent", None) or getattr(result, "structured_content", None)


def is_error(result: Any) -> bool:
    flag = getattr(result, "isError", None)
    return bool(flag if flag is not None else getattr(result, "is_error", False))


def error_text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


async def exercise(session: ClientSession, report: dict[str, Any]) -> None:
    from pcd_tools import Decider
    from tests.mcp.schemas import ListingReview, SupportTicket

    listed = (await session.list_tools()).tools
    tools = {t.name: t for t in listed}
    report["tools"] = sorted(tools)
    report["annotations"] = {
        n: [
            bool(
                getattr(t.annotations, "readOnlyHint", None)
                or getattr(t.annotations, "read_only_hint", None)
            ),
            bool(
                getattr(t.annotations, "idempotentHint", None)
                or getattr(t.annotations, "idempotent_hint", None)
            ),
        ]
        for n, t in tools.items()
    }
    schema_of = {
        n: (getattr(t, "outputSchema", None) or getattr(t, "output_schema", None))
        for n, t in tools.items()
    }
    report["input_schemas"] = {
        n: (getattr(t, "inputSchema", None) or getattr(t, "input_schema", None))
        for n, t in tools.items()
    }
    report["descriptions"] = {n: t.description for n, t in tools.items()}

    def check(name: str, result: Any) -> dict[str, Any]:
        assert not is_error(result), f"{name}: {error_text(result)}"
        data = structured(result)
        jsonschema.validate(data, schema_of[name])
        report.setdefault("validated", []).append(name)
        return data

    decider = Decider.load()
    # one tool per schema: probabilities equal decide(); the text block is the value
    diffs = []
    for text in TEXTS:
        r = await session.call_tool("listing_review", {"text": text})
        data = check("listing_review", r)
        assert json.loads(r.content[0].text) == data["value"], (r.content[0].text, data)
        d = decider.decide(ListingReview, text)
        for name, f in d.fields.items():
            got = data["fields"][name]
            assert got["value"] == f.label, (name, got, f.label)
            for label, p in f.distribution.items():
                key = label if isinstance(label, str) else json.dumps(label)
                diffs.append(abs(got["distribution"][key] - p))
        assert data["action"] == ("review" if d.confidence < 0.6 else "act")
        assert abs(data["confidence"] - d.confidence) < 1e-6, (data, d.confidence, d.fields)
    report["max_dp_vs_decide"] = max(diffs)

    r = await session.call_tool("support_ticket", {"text": "Checkout is down for everyone!"})
    data = check("support_ticket", r)
    d = decider.decide(SupportTicket, "Checkout is down for everyone!")
    report["generated_title"] = [data["fields"]["title"], d.fields["title"].label]
    assert data["fields"]["title"]["probability"] is None

    # batch: progress after each text, results equal the single calls
    progress: list[tuple[float, float | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None = None) -> None:
        progress.append((done, total))

    r = await session.call_tool(
        "listing_review_batch", {"texts": TEXTS}, progress_callback=on_progress
    )
    data = check("listing_review_batch", r)
    singles = [decider.decide(ListingReview, t) for t in TEXTS]
    together = decider.decide_many(ListingReview, TEXTS)
    report["batch_max_dp"] = max(
        abs(res["fields"][n]["probability"] - s.fields[n].probability)
        for res, s in zip(data["results"], together)
        for n in ("category", "prohibited", "colour", "condition", "tags")
    )
    report["batch_values"] = [
        r["value"] == s.value.model_dump(mode="json") for r, s in zip(data["results"], singles)
    ]
    report["progress"] = progress

    # generic tools
    labels = ["billing", "technical", "account"]
    text = "I was charged twice for March."
    r = await session.call_tool("classify", {"text": text, "labels": labels})
    data = check("classify", r)
    from pcd_tools.mcp.generic import classify_schema, yes_no_schema

    d = decider.decide(classify_schema(tuple(labels), None), text)
    report["classify"] = [data["label"], d.fields["label"].label]
    report["classify_max_dp"] = max(
        abs(data["distribution"][k] - p) for k, p in d.fields["label"].distribution.items()
    )
    q = "Does the customer ask for money back?"
    r = await session.call_tool("yes_no", {"text": text, "question": q})
    data = check("yes_no", r)
    d = decider.decide(yes_no_schema(q), text)
    report["yes_no"] = [data["answer"], d.fields["answer"].value]
    report["yes_no_dp"] = abs(data["probability"] - d.fields["answer"].probability)

    r = await session.call_tool(
        "tag", {"text": text, "labels": labels, "max_labels": 2, "min_share": 0.05}
    )
    data = check("tag", r)
    from pcd_tools.mcp.generic import tag_schema

    d = decider.decide(tag_schema(tuple(labels), None, 0.05, 2), text)
    report["tag"] = [data["labels"], d.fields["labels"].label]
    report["tag_max_dp"] = max(
        abs(data["distribution"][k] - p) for k, p in d.fields["labels"].distribution.items()
    )

    # bad input: isError with the typed error's message, and the server keeps serving
    bad = {
        "empty": ("listing_review", {"text": "   "}),
        "too_long": ("listing_review", {"text": "x" * (MAX_CHARS + 1)}),
        "one_label": ("classify", {"text": text, "labels": ["a"]}),
        "duplicate_labels": ("classify", {"text": text, "labels": ["a", "a"]}),
        "tag_most": ("tag", {"text": text, "labels": labels, "max_labels": 0}),
        "tag_share": ("tag", {"text": text, "labels": labels, "min_share": 1.5}),
        "empty_batch": ("listing_review_batch", {"texts": []}),
        "missing_text": ("listing_review", {}),
    }
    report["errors"] = {}
    for key, (name, args) in bad.items():
        r = await session.call_tool(name, args)
        report["errors"][key] = [is_error(r), error_text(r)]
    r = await session.call_tool("listing_review", {"text": TEXTS[0]})
    check("listing_review", r)
    report["serves_after_errors"] = True

    # concurrent calls are answered (batched on the engine's queue) and equal decide()
    results: dict[int, Any] = {}

    async def one(i: int) -> None:
        results[i] = structured(await session.call_tool("listing_review", {"text": TEXTS[i]}))

    async with anyio.create_task_group() as tg:
        for i in range(len(TEXTS)):
            tg.start_soon(one, i)
    report["concurrent_max_dp"] = max(
        abs(
            results[i]["fields"]["category"]["probability"]
            - singles[i].fields["category"].probability
        )
        for i in range(len(TEXTS))
    )

    # a cancelled batch call: the server goes on serving
    with anyio.move_on_after(0.3):
        await session.call_tool("listing_review_batch", {"texts": TEXTS * 20})
    r = await session.call_tool("yes_no", {"text": text, "question": q})
    check("yes_no", r)
    report["serves_after_cancel"] = True


async def main_stdio() -> dict[str, Any]:
    report: dict[str, Any] = {"mcp": version("mcp"), "transport": "stdio"}
    async with stdio_session() as session:
        await exercise(session, report)
    return report


async def main_http(key: str | None) -> dict[str, Any]:
    report: dict[str, Any] = {"mcp": version("mcp"), "transport": "http"}
    port = free_port()
    env = dict(os.environ)
    env.pop("PCD_API_KEY", None)
    extra = ["--http", "--port", str(port)] + (["--api-key", key] if key else [])
    proc = subprocess.Popen(
        [sys.executable, *server_args(extra)],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"server did not start: {proc.stderr.read()}") from None
                time.sleep(0.2)
        import httpx as plain

        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        hdrs = {"Accept": "application/json, text/event-stream"}
        report["no_key_status"] = plain.post(url, json=body, headers=hdrs).status_code
        report["wrong_key_status"] = plain.post(
            url, json=body, headers={**hdrs, "Authorization": "Bearer nope"}
        ).status_code
        async with http_session(url, key) as session:
            await exercise(session, report)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return report


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("transport", choices=["stdio", "http"])
    p.add_argument("--key", default=None)
    a = p.parse_args()
    sys.path.insert(0, str(ROOT))
    report = anyio.run(main_stdio) if a.transport == "stdio" else anyio.run(main_http, a.key)
    print(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
