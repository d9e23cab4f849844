"""LangChain / LangGraph integration (the `langchain` extra): decision model, tool,
routers, structured output and confidence-gated cascades.

Names load on first use, so `import pcd_tools.agents` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cascade import (
        Cascade,
        CascadeError,
        CascadeResult,
        ChatModelStage,
        DeciderStage,
        HumanStage,
        LowConfidenceError,
    )
    from .decision_model import PCDDecisionModel
    from .router import PCDRouter, route_on
    from .tools import DecisionTool

__all__ = [
    "Cascade",
    "CascadeError",
    "CascadeResult",
    "ChatModelStage",
    "DeciderStage",
    "DecisionTool",
    "HumanStage",
    "LowConfidenceError",
    "PCDDecisionModel",
    "PCDRouter",
    "route_on",
]

_LAZY = {
    "Cascade": "cascade",
    "CascadeError": "cascade",
    "CascadeResult": "cascade",
    "ChatModelStage": "cascade",
    "DeciderStage": "cascade",
    "HumanStage": "cascade",
    "LowConfidenceError": "cascade",
    "PCDDecisionModel": "decision_model",
    "PCDRouter": "router",
    "route_on": "router",
    "DecisionTool": "tools",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'pcd_tools.agents' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
