"""Every Python block of the README runs as written, and shows what it really prints.

A line's `# -> text` comment (on the statement, or on comment lines right after it) is
the output that statement prints on the embedded model; the test runs each top-level
statement, captures what it prints and compares, line by line. Two blocks cannot run
exactly as written here, and the test says how it bends them:

- the "for real work" block loads model files that CI does not have: `Decider.load` is
  replaced by a stand-in that checks each call against the real signature and returns
  the embedded model;
- the `typesafe-sdk`, OpenAI-client and OpenAI Decisions blocks talk to `http://127.0.0.1:8000`: the test
  serves the embedded model on a free port and points that address there.

The "Scale out" section's Ray Data block runs in `tests/ray/test_readme_scale_out.py`.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from examples.router import Route
from pcd_tools import Decider
from tests.serve.live import live_server

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def _section(start: str, end: str) -> str:
    return README.split(start)[1].split(end)[0]


QUICK = _blocks(README.split("<!-- agents:start -->")[0])
AGENTS = _blocks(_section("<!-- agents:start -->", "<!-- agents:end -->"))
SERVE = _blocks(_section("<!-- serve:start -->", "<!-- serve:end -->"))
MCP_SECTION = _section("<!-- mcp:start -->", "<!-- mcp:end -->")
MCP = _blocks(MCP_SECTION)
# Run by tests/ray/test_readme_scale_out.py (it needs the ray extra and a Ray instance).
SCALE = _blocks(_section("<!-- scale:start -->", "<!-- scale:end -->"))


_NUMBER = re.compile(r"-?\d+\.(\d+)(?:e[-+]?\d+)?")


def same_output(got: str, expected: str) -> bool:
    """`got` prints what the README shows: the same text, and the same decimal numbers
    to the float32 noise of the machine's BLAS kernels (SkylakeX, Haswell and others sum
    in different orders): within one unit of the last digit shown, and within 1e-5."""
    if _NUMBER.sub("#", got) != _NUMBER.sub("#", expected):
        return False
    for g, e in zip(_NUMBER.finditer(got), _NUMBER.finditer(expected)):
        if len(g.group(1)) != len(e.group(1)):  # printed to another precision
            return False
        unit = 10.0 ** -len(e.group(1))
        if abs(float(g.group(0)) - float(e.group(0))) > max(1e-5, 1.01 * unit):
            return False
    return True


def run_checked(src: str, ns: dict[str, Any], label: str) -> list[str]:
    """Runs `src` statement by statement in `ns`; checks every `# ->` output."""
    lines = src.splitlines()
    body = ast.parse(src).body
    checked = []
    for i, node in enumerate(body):
        stop = body[i + 1].lineno - 1 if i + 1 < len(body) else len(lines)
        segment = lines[node.lineno - 1 : stop]
        expected = [ln.split("# -> ", 1)[1].rstrip() for ln in segment if "# -> " in ln]
        code = compile(ast.Module([node], []), f"README.md ({label})", "exec", dont_inherit=True)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code, ns)
        if expected:
            got = [ln.rstrip() for ln in out.getvalue().splitlines()]
            assert len(got) == len(expected) and all(
                same_output(g, e) for g, e in zip(got, expected)
            ), f"{label}, line {node.lineno}: printed {got}, README shows {expected}"
            checked.extend(expected)
    return checked


def test_printed_numbers_match_to_float_noise_and_nothing_more():
    shown = "{'billing': 0.595776, 'engineering': 0.126916, 'sales': 0.277308}"
    assert same_output("{'billing': 0.595773, 'engineering': 0.126918, 'sales': 0.277309}", shown)
    assert not same_output(
        "{'billing': 0.595676, 'engineering': 0.126916, 'sales': 0.277308}", shown
    )
    assert not same_output("{'billing': 0.5958, 'engineering': 0.126916, 'sales': 0.277308}", shown)
    assert not same_output(
        "{'billing': 0.595776, 'engineering': 0.126916, 'support': 0.277308}", shown
    )
    assert same_output("P2_NORMAL 0.82", "P2_NORMAL 0.81")  # a rounding flip at 2 digits
    assert not same_output("P2_NORMAL 0.83", "P2_NORMAL 0.81")
    assert not same_output("P1_HIGH 0.81", "P2_NORMAL 0.81")


def test_the_readme_blocks_are_all_run_here():
    assert len(_blocks(README)) == len(QUICK) + len(AGENTS) + len(SERVE) + len(MCP) + len(SCALE)
    assert len(QUICK) == 6 and len(AGENTS) == 7 and len(SERVE) == 3 and len(SCALE) == 1
    assert len(MCP) == 2


def test_quick_start_runs_as_written(real, monkeypatch):
    ns: dict[str, Any] = {"__name__": "readme"}
    checked = run_checked(QUICK[0], ns, "quick start")
    assert len(checked) >= 5
    assert ns["d"].fields["priority"].label in {"P0_CRITICAL", "P1_HIGH", "P2_NORMAL", "P3_LOW"}

    # The "for real work" block: each load must be a valid call of the real `Decider.load`.
    signature = inspect.signature(Decider.load.__func__)
    loads: list[inspect.BoundArguments] = []

    def stand_in(cls: type, *args: Any, **kwargs: Any) -> Decider:
        loads.append(signature.bind(cls, *args, **kwargs))
        return real

    monkeypatch.setattr(Decider, "load", classmethod(stand_in))
    run_checked(QUICK[1], ns, "for real work")
    sources = [b.arguments["source"] for b in loads]
    assert len(sources) == 3
    assert sources[0].endswith(".gguf") and sources[2].endswith(".gguf")
    assert sources[1].startswith("mlx-community/")
    assert loads[2].arguments["calibration"] == "cal.json"
    assert ns["d"].orders == 2


def test_schemas_section_runs_as_written(real):
    ns: dict[str, Any] = {"__name__": "readme", "decider": real}
    checked = run_checked(QUICK[2], ns, "schemas")
    assert len(checked) == 4
    table = ns["d"].joint[("category", "subcategory")]
    assert sum(table.values()) == pytest.approx(1.0)


def test_free_text_section_runs_as_written(real):
    from typing import Literal

    from pydantic import BaseModel, Field

    ns: dict[str, Any] = {
        "__name__": "readme",
        "decider": real,
        "BaseModel": BaseModel,
        "Field": Field,
        "Literal": Literal,
    }
    checked = run_checked(QUICK[3], ns, "free text")
    assert len(checked) == 4
    d = ns["d"]
    assert len(d.value.reasoning) <= 80 and len(d.value.reply_draft) <= 80
    total = d.prefill_ms + d.suffix_eval_ms + d.generate_ms
    assert total == pytest.approx(d.elapsed_ms, rel=0.05)


def test_pruning_section_runs_as_written(real):
    from pydantic import BaseModel, Field

    ns: dict[str, Any] = {"__name__": "readme", "decider": real, "BaseModel": BaseModel}
    ns["Field"] = Field
    checked = run_checked(QUICK[4], ns, "pruning")
    assert len(checked) == 1
    f = ns["d"].fields["minutes"]
    whole = real.decide(
        ns["Meeting"], "Standup took 15 minutes today.", scoring="constrained", pruning="off"
    )
    lo, hi = f.probability_bounds
    assert lo - 1e-4 <= whole.fields["minutes"].probability <= hi + 1e-4
    assert whole.fields["minutes"].value == f.value


def test_without_labels_section_runs_as_written(real):
    # the quick start defines Triage, decider and tickets; run it on the session's model
    ns: dict[str, Any] = {"__name__": "readme", "real": real}
    quick = QUICK[0].replace("pcd_tools.Decider.load()", "real")
    assert quick != QUICK[0]
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(quick, "README.md (quick start)", "exec", dont_inherit=True), ns)
    checked = run_checked(QUICK[5], ns, "without labels")
    assert len(checked) == 3


@pytest.mark.langchain
def test_agents_section_runs_on_the_embedded_model(real, monkeypatch):
    # `Decider.load()` in the README is the embedded model; reuse the session's copy.
    monkeypatch.setattr(Decider, "load", classmethod(lambda cls, *a, **k: real))
    ns: dict[str, Any] = {"__name__": "readme"}
    for i, block in enumerate(AGENTS):
        run_checked(block, ns, f"agents block {i + 1}")
    assert ns["out"]["pcd_decision"]["route"] in {"billing", "engineering", "accounts", "human"}
    assert ns["result"].value.topic in {"payment", "bug", "login"}


@pytest.mark.serve
def test_typesafe_client_block_against_a_live_server(real):
    pytest.importorskip("typesafe_sdk")
    from pcd_tools.serve.app import create_app

    with live_server(create_app(real, api_key="s3cret"), timeout=300) as url:
        src = SERVE[0].replace("http://127.0.0.1:8000", url)
        assert src != SERVE[0]
        checked = run_checked(src, {"__name__": "readme"}, "typesafe-sdk")
    assert len(checked) == 2


@pytest.mark.serve
@pytest.mark.langchain
def test_openai_client_block_against_a_live_server(real):
    pytest.importorskip("openai")
    pytest.importorskip("langchain_openai")
    from pcd_tools.serve.app import create_app

    with live_server(create_app(real, api_key="s3cret"), timeout=300) as url:
        src = SERVE[1].replace("http://127.0.0.1:8000", url)
        assert src != SERVE[1]
        checked = run_checked(src, {"__name__": "readme"}, "openai client")
    assert len(checked) == 3


@pytest.mark.serve
@pytest.mark.langchain
def test_openai_decisions_block_against_a_live_server(real):
    pytest.importorskip("openai")
    pytest.importorskip("langchain_openai.decisions")
    from pcd_tools.serve.app import create_app

    with live_server(create_app(real, api_key="s3cret"), timeout=300) as url:
        src = SERVE[2].replace("http://127.0.0.1:8000", url)
        assert src != SERVE[2]
        ns: dict[str, Any] = {"__name__": "readme"}
        checked = run_checked(src, ns, "openai decisions")
    assert len(checked) == 6
    assert [a.type for a in ns["r"].answers] == ["predicate", "choice", "score"]


@pytest.mark.mcp
@pytest.mark.langchain
def test_mcp_langgraph_block_starts_pcd_mcp(real):
    # `pcd` is the console script; the test runs the same command through this interpreter.
    src = MCP[0].replace(
        '"command": "pcd", "args": ["mcp",',
        f'"command": {sys.executable!r}, "args": ["-m", "pcd_tools", "mcp",',
    )
    assert src != MCP[0]
    ns: dict[str, Any] = {"__name__": "readme"}
    checked = run_checked(src, ns, "mcp langgraph")
    assert len(checked) == 2
    d = real.decide(Route, "I was charged twice in March.")
    assert ns["result"]["value"]["team"] == d.value.team


@pytest.mark.mcp
def test_mcp_python_block_runs_as_written(real, monkeypatch):
    monkeypatch.setattr(Decider, "load", classmethod(lambda cls, *a, **k: real))
    ns: dict[str, Any] = {"__name__": "readme"}
    assert len(run_checked(MCP[1], ns, "mcp server")) == 1
    assert callable(ns["app"])


@pytest.mark.mcp
def test_mcp_client_config_snippet_is_valid_json():
    block = re.findall(r"```json\n(.*?)```", MCP_SECTION, flags=re.S)[0]
    servers = json.loads(block)["mcpServers"]
    assert servers["pcd"]["command"] == "pcd" and servers["pcd"]["args"][0] == "mcp"
    assert servers["pcd-http"]["url"].endswith("/mcp")
