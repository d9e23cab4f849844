"""The agents guide's blocks (docs/agents.md) run as written; the examples run on the embedded
model."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pcd_tools import Decider
from tests.conftest import tiny_decider
from tests.docs.blocks import named_blocks

pytestmark = pytest.mark.langchain

ROOT = Path(__file__).resolve().parents[2]


def guide_blocks() -> list[str]:
    blocks = named_blocks("docs/agents.md")
    assert all(b.lang == "python" for b in blocks.values())
    return [b.src for b in blocks.values()]


def test_agents_guide_blocks_execute(monkeypatch, capsys):
    blocks = guide_blocks()
    # schema, router, tool, guard, cascade, prediction sets and the fitted cascade (the
    # last two need the embedded model and the labelled tickets: tests/docs/test_doc_blocks.py
    # runs them)
    assert len(blocks) == 7
    blocks = blocks[:5]
    tiny = tiny_decider(0)
    # the README loads the embedded model; the tiny model keeps this test fast
    monkeypatch.setattr(Decider, "load", classmethod(lambda cls, *a, **k: tiny))
    ns: dict = {"__name__": "readme"}
    for block in blocks:
        exec(compile(block, "docs/agents.md", "exec", dont_inherit=True), ns)
    out = ns["out"]
    assert out["reply"].endswith("will handle it")
    assert out["pcd_decision"]["route"] in {"billing", "engineering", "accounts", "human"}
    assert ns["msg"].artifact.model_id == "tiny-llama-0"
    assert isinstance(ns["ticket"], ns["Ticket"])
    assert set(ns["result"].decided_by) == {"topic", "urgent"}
    assert capsys.readouterr().out.count("\n") >= 4


def _run_example(name: str, stdin: str = "") -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.integration
def test_example_langgraph_router():
    out = _run_example("langgraph_router.py")
    assert "classify -> ['account', 'billing', 'human', 'technical']" in out
    assert out.count("picked up") == 3
    # each team's node read `urgent` from the stored decision (fields="all")
    assert len(re.findall(r"\[\w+, (?:URGENT|normal)\] picked up", out)) == 3


@pytest.mark.integration
def test_example_tool_agent():
    out = _run_example("tool_agent.py")
    assert out.startswith('tool content : {"values":')
    assert "agent reply  : Priority" in out


@pytest.mark.integration
def test_example_cascade_human_reads_stdin_and_defaults():
    out = _run_example("cascade_human.py", stdin="2\n")
    assert "result     :" in out and "decided by" in out
    assert "latency ms :" in out
