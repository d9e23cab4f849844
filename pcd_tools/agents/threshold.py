"""The one check of every confidence threshold the wrappers take, run when they are built.

`Cascade(threshold=, per_field=)`, `DecisionTool(threshold=)` (`decider.as_tool`),
`with_structured_output(threshold=)` (the guard), `PCDRouter` / `route_on(threshold=)` and
the MCP server (`pcd_tools.mcp.server(threshold=)`) all compare a field's probability (or
margin) with a threshold, so a value outside [0, 1] would escalate or refuse everything
instead of failing where it was written. The check lives with the other argument checks
(`pcd_tools.decide.checks.check_threshold`), where every wrapper can reach it.
"""

from __future__ import annotations

from ..decide.checks import check_threshold

__all__ = ["check_threshold"]
