"""`server(decider, schemas)`: the SDK's MCP server with one tool per schema, and its HTTP app.

The server is the SDK's own object (`FastMCP` on mcp 1.x, `MCPServer` on 2.x), so users
add tools of their own with `@srv.tool()` or mount `http_app(srv)` in an ASGI app.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Sequence
from typing import Any

from ..decide.checks import check_temperature, check_threshold
from ..errors import InvalidArgumentError
from ..schema import Schema, compile_schema
from . import _sdk
from .generic import generic_tools
from .tools import (
    MAX_BATCH_TEXTS,
    MAX_TEXT_CHARS,
    READ_ONLY,
    Limits,
    ToolSpec,
    schema_tools,
)

__all__ = ["http_app", "server", "tool_specs"]

INSTRUCTIONS = (
    "Tools that decide bounded questions about a text by scoring every allowed answer "
    "with a local language model ({model}). Each returns the answer with its probability "
    "and an action: 'act' when every probability is at least {threshold:g}, else 'review' "
    "(hand the case to a person or a larger model)."
)


def _calibrated(decider: Any, schemas: list[Schema], calibration: Any) -> dict[str, Any]:
    """The decider each schema's tool uses: `decider`, or for the schema `calibration` was
    fitted for, `decider.with_calibration(calibration)`."""
    if getattr(decider, "calibration", None) is not None:
        raise InvalidArgumentError(
            "server(decider=...) carries a fitted calibration, which fits one schema only; "
            "pass an uncalibrated decider and the file as server(calibration=...), so the "
            "tool of the schema it was fitted for uses it and the other tools use none."
        )
    deciders = {s.name: decider for s in schemas}
    if calibration is None:
        return deciders
    from ..answers.calibration import Calibration, CalibrationMismatchError

    cal = (
        Calibration.load(calibration)
        if isinstance(calibration, (str, os.PathLike))
        else calibration
    )
    fitted = [s for s in schemas if s.fingerprint() == cal.schema_fingerprint]
    if not fitted:
        served = {s.name: s.fingerprint() for s in schemas}
        raise CalibrationMismatchError(
            f"calibration {cal.path or ''!s} was fitted for schema {cal.schema_name!r} "
            f"(fingerprint {cal.schema_fingerprint}), which none of the served schemas is: "
            f"{served}. Serve that schema, or fit a calibration for one of these."
        )
    calibrated = decider.with_calibration(cal)
    for s in fitted:
        deciders[s.name] = calibrated
    return deciders


def tool_specs(
    decider: Any,
    schemas: Sequence[Any] = (),
    *,
    threshold: float = 0.8,
    calibration: Any = None,
    generic: bool = True,
    temperature: float = 1.0,
    max_text_chars: int = MAX_TEXT_CHARS,
    max_batch_texts: int = MAX_BATCH_TEXTS,
) -> list[ToolSpec]:
    """The tools `server` registers (see there), before any SDK object is made."""
    threshold = check_threshold(threshold, "server(threshold=)")
    for value, what in ((max_text_chars, "max_text_chars"), (max_batch_texts, "max_batch_texts")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgumentError(f"{what} must be an int >= 1; got {value!r}.")
    temperature = check_temperature(temperature)
    compiled = [compile_schema(s) for s in schemas]
    if not compiled and not generic:
        raise InvalidArgumentError("no tools to serve: give a schema, or keep generic=True.")
    deciders = _calibrated(decider, compiled, calibration)
    limits = Limits(max_text_chars, max_batch_texts)
    kw = {"temperature": temperature}
    specs: list[ToolSpec] = []
    for s in compiled:
        specs += schema_tools(
            deciders[s.name], s, threshold=threshold, limits=limits, decide_kwargs=kw
        )
    if generic:
        specs += generic_tools(decider, threshold=threshold, limits=limits, decide_kwargs=kw)
    seen: dict[str, str] = {}
    for spec in specs:
        if spec.name in seen:
            raise InvalidArgumentError(
                f"two tools would be named {spec.name!r} ({seen[spec.name]} and {spec.title}); "
                "rename a schema class, or pass generic=False if it clashes with classify, "
                "tag or yes_no."
            )
        seen[spec.name] = spec.title
    return specs


def server(
    decider: Any,
    schemas: Sequence[Any] = (),
    *,
    threshold: float = 0.8,
    calibration: Any = None,
    generic: bool = True,
    temperature: float = 1.0,
    name: str = "pcd-tools",
    instructions: str | None = None,
    max_text_chars: int = MAX_TEXT_CHARS,
    max_batch_texts: int = MAX_BATCH_TEXTS,
) -> Any:
    """An MCP server whose tools decide `schemas` on `decider`.

    Tools (all annotated `readOnlyHint` and `idempotentHint`):

    - per schema, `<class name in snake_case>(text)`: `{"value", "confidence", "fields",
      "action"}` as structured content (its `outputSchema` is exact) plus the value as a
      JSON text block; `action` is `"review"` when a scored field's probability is below
      `threshold` (`Decision.low_confidence`, the rule of `Decider.as_tool` and `Cascade`);
    - `<name>_batch(texts)`: `{"results": [...]}` through `adecide_many`, with progress
      notifications after each text and cancellation of the texts not yet started;
    - with `generic=True`, `classify(text, labels, question?)`, `tag(text, labels,
      question?, min_share?, max_labels?)` and `yes_no(text, question)`
      for questions an agent forms at run time.

    Concurrent calls queue on the decider's engine worker and are scored together in
    batches, as `adecide` does. A bad call (an empty or too-long text, labels out of
    range, a context longer than the model's window) answers `isError: true` with the
    typed error's message; the server keeps serving.

    Args:
        decider: The `Decider` (without a fitted calibration: pass that as `calibration`).
        schemas: Pydantic models (or anything `compile_schema` accepts), one tool each.
        threshold: The probability below which a field asks for review.
        calibration: A fitted `Calibration` or its file, applied to the tools of the
            schema it was fitted for.
        generic: Also serve `classify` and `yes_no`.
        temperature: Softmax temperature of every decision.
        name: The server's name in the MCP handshake.
        instructions: The server's instructions to the client (default: what the tools
            do, naming the model).
        max_text_chars: The longest text a call may send (characters; the model's own
            window applies too).
        max_batch_texts: The most texts a batch call may send.

    Returns:
        The SDK's server object: `mcp.server.fastmcp.FastMCP` (mcp 1.x) or
        `mcp.server.mcpserver.MCPServer` (2.x). `srv.run_stdio_async()` serves stdio;
        `http_app(srv)` gives the streamable-HTTP ASGI app.

    Raises:
        SchemaError: for a schema that cannot be scored.
        InvalidArgumentError: for a bad option, two tools of one name, or a decider that
            carries a calibration.
        CalibrationMismatchError: for a calibration fitted for none of the schemas.
    """
    specs = tool_specs(
        decider,
        schemas,
        threshold=threshold,
        calibration=calibration,
        generic=generic,
        temperature=temperature,
        max_text_chars=max_text_chars,
        max_batch_texts=max_batch_texts,
    )
    model = getattr(decider, "model_id", "a local model")
    srv = _sdk.new_server(
        name, instructions or INSTRUCTIONS.format(model=model, threshold=threshold)
    )
    for spec in specs:
        srv.add_tool(
            spec.fn,
            name=spec.name,
            title=spec.title,
            description=spec.description,
            annotations=READ_ONLY,
            structured_output=True,
        )
    return srv


class _BearerKey:
    """ASGI middleware: every HTTP request needs `Authorization: Bearer <key>` (401 else)."""

    def __init__(self, app: Any, key: str):
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            scheme, _, token = given.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
                body = json.dumps(
                    {
                        "error": "unauthorized",
                        "message": "missing or wrong API key: send 'Authorization: Bearer <key>'.",
                    }
                ).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b'Bearer realm="pcd-tools"'),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def http_app(
    srv: Any, *, api_key: str | None = None, host: str = "127.0.0.1", path: str = "/mcp"
) -> Any:
    """The streamable-HTTP ASGI app of `srv` at `path`; with `api_key`, every request
    needs `Authorization: Bearer <api_key>` and others get 401.

    Args:
        srv: The server from `server(...)`.
        api_key: The key to require (None: none).
        host: The address it will be bound to: a loopback one keeps the SDK's DNS
            rebinding protection (Host and Origin headers must be loopback).
        path: Where the MCP endpoint is.
    """
    app = _sdk.http_app(srv, host=host, path=path)
    return _BearerKey(app, api_key) if api_key else app
