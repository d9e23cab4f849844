"""pcd_tools.agents: a small pinned surface, loaded lazily."""

from __future__ import annotations

import subprocess
import sys

import pytest

import pcd_tools.agents

pytestmark = pytest.mark.langchain

EXPECTED_ALL = [
    "Cascade",
    "CascadeError",
    "CascadeResult",
    "ChatModelStage",
    "DeciderStage",
    "DecisionTool",
    "DecisionsStage",
    "HumanStage",
    "LowConfidenceError",
    "PCDDecisionModel",
    "PCDRouter",
    "route_on",
]


def test_all_is_pinned():
    assert sorted(pcd_tools.agents.__all__) == sorted(EXPECTED_ALL)


def test_public_names_come_from_public_modules():
    for name in pcd_tools.agents.__all__:
        module = getattr(pcd_tools.agents, name).__module__
        assert module.startswith("pcd_tools.agents."), (name, module)
        assert not any(p.startswith("_") for p in module.split(".")), (name, module)


def test_import_is_lazy():
    code = (
        "import sys, pcd_tools, pcd_tools.agents; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('mlx', 'langchain_core', 'langgraph', 'langchain')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_low_confidence_error_is_a_pcd_tools_error():
    from pcd_tools.errors import PcdToolsError

    assert issubclass(pcd_tools.agents.LowConfidenceError, PcdToolsError)
    with pytest.raises(AttributeError):
        pcd_tools.agents.NotAThing  # noqa: B018
