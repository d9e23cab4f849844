"""`pcd mcp` through the SDK's own client, over stdio and streamable HTTP, on mcp 1.x (this
venv) and 2.x (`.venv-mcp2`, made by `make setup`): tests/mcp/client_check.py does the
calls and reports; this file asserts on the report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.mcp, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
MCP2_PYTHON = ROOT / ".venv-mcp2" / "bin" / "python"
TOOLS = [
    "classify",
    "listing_review",
    "listing_review_batch",
    "support_ticket",
    "support_ticket_batch",
    "tag",
    "yes_no",
]


def _python(sdk: int) -> str:
    if sdk == 1:
        return sys.executable
    assert MCP2_PYTHON.exists(), (
        f"{MCP2_PYTHON} is missing: `make setup` makes the mcp 2.x venv these tests use."
    )
    return str(MCP2_PYTHON)


def _run(sdk: int, *args: str) -> dict:
    out = subprocess.run(
        [_python(sdk), "tests/mcp/client_check.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("sdk", "args"),
    [(1, ("stdio",)), (1, ("http", "--key", "s3cret")), (2, ("stdio",)), (2, ("http",))],
    ids=["mcp1-stdio", "mcp1-http-key", "mcp2-stdio", "mcp2-http-nokey"],
)
def test_client_session(sdk: int, args: tuple[str, ...]) -> None:
    r = _run(sdk, *args)
    assert r["mcp"].startswith(f"{sdk}.")
    assert r["tools"] == TOOLS
    assert all(r["annotations"][t] == [True, True] for t in TOOLS)  # readOnly, idempotent
    schemas = r["input_schemas"]
    assert schemas["listing_review"]["required"] == ["text"]
    assert schemas["listing_review"]["properties"]["text"]["type"] == "string"
    assert schemas["listing_review_batch"]["required"] == ["texts"]
    assert set(schemas["classify"]["required"]) == {"text", "labels"}
    assert set(schemas["yes_no"]["required"]) == {"text", "question"}
    assert set(schemas["tag"]["required"]) == {"text", "labels"}
    assert {"min_share", "max_labels", "question"} <= set(schemas["tag"]["properties"])
    desc = r["descriptions"]["listing_review"]
    assert desc.startswith("Review a marketplace listing before it goes live.")
    assert '- category (one of "electronics", "clothing", "furniture"): What is sold' in desc
    # every result validated against its tool's outputSchema (client_check asserts it)
    assert set(r["validated"]) >= {
        "listing_review",
        "listing_review_batch",
        "support_ticket",
        "classify",
        "tag",
        "yes_no",
    }
    # the tools' probabilities are decide()'s on the same model
    assert r["max_dp_vs_decide"] <= 1e-6
    assert r["batch_max_dp"] <= 1e-6 and all(r["batch_values"])
    assert r["classify_max_dp"] <= 1e-6 and r["classify"][0] == r["classify"][1]
    assert r["yes_no_dp"] <= 1e-6 and r["yes_no"][0] == r["yes_no"][1]
    assert r["tag_max_dp"] <= 1e-6 and r["tag"][0] == r["tag"][1] and len(r["tag"][0]) <= 2
    assert r["concurrent_max_dp"] <= 1e-5  # batched with each other: padding rounding
    title, decided = r["generated_title"]
    assert title["value"] == decided and title["probability"] is None
    assert [p[0] for p in r["progress"]] == [1, 2, 3] and {p[1] for p in r["progress"]} == {3}
    errors = r["errors"]
    assert all(flag for flag, _ in errors.values()), errors
    assert "empty or only whitespace" in errors["empty"][1]
    assert "at most 3,000" in errors["too_long"][1] and "3,001" in errors["too_long"][1]
    assert "accepted: 2 or more labels" in errors["one_label"][1]
    assert "repeats 'a'" in errors["duplicate_labels"][1]
    assert "max_labels must be a whole number from 1 to the 3 labels" in errors["tag_most"][1]
    assert "min_share must be a number strictly between 0 and 1" in errors["tag_share"][1]
    assert "non-empty list" in errors["empty_batch"][1]
    assert "text" in errors["missing_text"][1]
    assert r["serves_after_errors"] and r["serves_after_cancel"]
    if args[0] == "http":
        key = "--key" in args
        assert (r["no_key_status"] == 401) is key
        assert (r["wrong_key_status"] == 401) is key
