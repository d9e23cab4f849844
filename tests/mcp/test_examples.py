"""The MCP examples run as written: `examples/mcp_client.py` against `pcd mcp --schema
examples.router:Route`, and `examples/router.py` on the embedded model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.mcp.test_protocol import _python

pytestmark = [pytest.mark.mcp, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, python: str = sys.executable) -> str:
    out = subprocess.run(
        [python, f"examples/{script}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.parametrize("sdk", [1, 2], ids=["mcp1", "mcp2"])
def test_mcp_client_example(sdk: int) -> None:
    out = _run("mcp_client.py", _python(sdk)).splitlines()
    assert out[0] == "tools: route, route_batch, classify, tag, yes_no"
    assert out[1].startswith("route: team=") and " action=" in out[1]
    assert out[2:4] == ["  progress 1/2", "  progress 2/2"]
    assert out[4].startswith("route_batch: [")
    assert out[5].startswith("classify: ") and out[6].startswith("yes_no: ")
    assert out[7] == (
        "bad input: True Error executing tool classify: labels has 1 item(s); "
        "accepted: 2 or more labels (a large set is scored exactly by certified pruned "
        "search)."
    )


def test_router_example_decides_the_sample_emails() -> None:
    out = _run("router.py").splitlines()
    assert len(out) == 13 and out[-1].startswith("team right on ") and out[-1].endswith("/12")
