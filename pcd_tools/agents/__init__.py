"""LangChain / LangGraph integration (the `langchain` extra): decision model, tool,
routers, structured output and confidence-gated cascades.

Names load on first use, so `import pcd_tools.agents` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from .cascade import (
        Cascade,
        CascadeError,
        CascadeResult,
        ChatModelStage,
        DeciderStage,
        DecisionsStage,
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
    "DecisionsStage",
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
    "DecisionsStage": "cascade",
    "HumanStage": "cascade",
    "LowConfidenceError": "cascade",
    "PCDDecisionModel": "decision_model",
    "PCDRouter": "router",
    "route_on": "router",
    "DecisionTool": "tools",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__, globals())
