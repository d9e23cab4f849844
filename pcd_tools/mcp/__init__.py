"""Decision schemas as Model Context Protocol tools (the `mcp` extra, official SDK 1.x or 2.x).

    from pcd_tools import Decider
    from pcd_tools.mcp import server

    srv = server(Decider.load("model.gguf"), [Route, Triage], threshold=0.8)
    srv.run()                       # stdio, as `pcd mcp --schema mod:Route` does

`server` returns the SDK's own server object (`FastMCP` on mcp 1.x, `MCPServer` on 2.x):
add tools of your own to it, or serve it over streamable HTTP with `http_app(srv,
api_key=...)` in any ASGI server. The tools and their results are described in
`pcd_tools.mcp.app.server`.

`import pcd_tools.mcp` is light; the SDK loads on first use of these names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from .app import http_app, server, tool_specs
    from .tools import ToolInputError, tool_name

__all__ = ["ToolInputError", "http_app", "server", "tool_name", "tool_specs"]

_LAZY = {
    "http_app": "app",
    "server": "app",
    "tool_specs": "app",
    "ToolInputError": "tools",
    "tool_name": "tools",
}

__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__, globals())
