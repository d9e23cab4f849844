"""The official `mcp` SDK, 1.x or 2.x: the few names pcd-tools needs from either.

mcp 1.x (`langchain-mcp-adapters` 0.3 pins `mcp<2`) calls its high-level server
`mcp.server.fastmcp.FastMCP` and takes the HTTP settings in its constructor; 2.x calls it
`mcp.server.mcpserver.MCPServer` and takes them in `streamable_http_app(...)`. Everything
else pcd-tools uses (`add_tool`, `Context.report_progress`, `run_stdio_async`,
`CallToolResult` and `ToolAnnotations` built with their wire names) is the same in both.
"""

from __future__ import annotations

from typing import Any

from ..errors import PcdToolsError

__all__ = [
    "MAJOR",
    "CallToolResult",
    "Context",
    "TextContent",
    "ToolAnnotations",
    "ToolError",
    "http_app",
    "new_server",
    "sdk_version",
]


class McpUnavailableError(PcdToolsError, ImportError):
    """The `mcp` SDK is not installed."""


def sdk_version() -> str:
    """The installed `mcp` version."""
    from importlib.metadata import version

    return version("mcp")


try:
    import mcp.types as _types
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise McpUnavailableError(
        "pcd_tools.mcp needs the official MCP SDK: pip install 'pcd-tools[mcp]' "
        f"(mcp >= 1.26, 1.x or 2.x); import failed: {exc}",
        name="mcp",
    ) from exc

MAJOR = int(sdk_version().split(".")[0])

if MAJOR >= 2:
    from mcp.server.mcpserver import Context as Context  # type: ignore[no-redef, import-not-found, unused-ignore]
    from mcp.server.mcpserver import MCPServer as _Server  # type: ignore[import-not-found, unused-ignore]
    from mcp.server.mcpserver.exceptions import ToolError as ToolError  # type: ignore[import-not-found, no-redef, unused-ignore]
else:
    from mcp.server.fastmcp import Context as Context  # type: ignore[no-redef, unused-ignore]
    from mcp.server.fastmcp import FastMCP as _Server  # type: ignore[no-redef, unused-ignore]
    from mcp.server.fastmcp.exceptions import ToolError as ToolError  # type: ignore[no-redef, unused-ignore]

CallToolResult = _types.CallToolResult
TextContent = _types.TextContent
ToolAnnotations = _types.ToolAnnotations


def new_server(name: str, instructions: str | None) -> Any:
    """The SDK's high-level server (`FastMCP` on 1.x, `MCPServer` on 2.x), with no tools.

    On 1.x the HTTP settings live in the server; they are given to `http_app` instead
    (the constructor's defaults, `/mcp` and localhost, are what `http_app` asks for).
    """
    return _Server(name=name, instructions=instructions, log_level="WARNING")


def http_app(server: Any, *, host: str, path: str = "/mcp") -> Any:
    """The server's streamable HTTP Starlette app at `path`.

    A loopback `host` keeps the SDK's DNS-rebinding protection (Host and Origin must be
    loopback); any other bind address turns it off, since the clients then name the
    machine by its own address (the API key protects it instead).
    """
    from mcp.server.transport_security import TransportSecuritySettings

    local = host in ("127.0.0.1", "localhost", "::1")
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=local,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"] if local else [],
        allowed_origins=(
            ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"] if local else []
        ),
    )
    if MAJOR >= 2:
        return server.streamable_http_app(
            streamable_http_path=path, transport_security=security, host=host
        )
    server.settings.streamable_http_path = path
    server.settings.transport_security = security
    server.settings.host = host
    return server.streamable_http_app()
