"""`pcd mcp`: serve decision schemas as MCP tools (`pcd_tools.mcp.server`), stdio or HTTP."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

from ._common import (
    UsageError,
    add_bind_options,
    check_at_least,
    check_temperature,
    keyed_bind,
)

HELP = "serve schemas as MCP tools (stdio, or streamable HTTP with --http)"

EPILOG = """\
Tools: one per --schema (the class name in snake_case, e.g. ListingReview ->
listing_review(text)), its batch form <name>_batch(texts), and classify(text, labels,
question?) and yes_no(text, question) unless --no-generic. Each returns the answer, its
probability and distribution, and action: "review" below --threshold, else "act".

MCP clients start the stdio server with, e.g. (Claude Desktop, Cursor):
  {"mcpServers": {"pcd": {"command": "pcd",
     "args": ["mcp", "--schema", "myapp.schemas:Route", "--model", "/models/qwen.gguf"]}}}
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `pcd mcp` options (the dispatcher adds --model, --json and --calibration).

    Args:
        parser: The sub-command's parser.
    """
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--schema",
        action="append",
        default=[],
        metavar="MODULE:CLASS",
        help="a Pydantic model to serve as a tool, imported from the working directory "
        "(repeat for more; e.g. examples.router:Route)",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=0.8,
        help="probability below which a result says action=review (default %(default)s)",
    )
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--no-generic", action="store_true", help="leave out the classify and yes_no tools"
    )
    parser.add_argument(
        "--max-text-chars",
        type=int,
        default=200_000,
        help="longest text a call may send (default %(default)s)",
    )
    parser.add_argument(
        "--max-batch", type=int, default=256, help="texts per batch call (default %(default)s)"
    )
    http = parser.add_argument_group("streamable HTTP (default: stdio)")
    http.add_argument("--http", action="store_true", help="serve streamable HTTP at /mcp")
    add_bind_options(http, key_guards="")


def load_schema(spec: str) -> Any:
    """The class named by `MODULE:CLASS`, imported with the working directory on the path.

    Raises:
        UsageError: for a malformed spec, a module that cannot be imported or a missing
            attribute.
    """
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise UsageError(
            f"--schema {spec!r}: accepted: MODULE:CLASS, e.g. examples.router:Route "
            "(the module imported from the working directory)."
        )
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise UsageError(f"--schema {spec!r}: cannot import module {module!r}: {e}.") from e
    obj: Any = mod
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            names = sorted(n for n in dir(mod) if not n.startswith("_"))
            raise UsageError(
                f"--schema {spec!r}: module {module!r} has no {attr!r}; it defines {names}."
            ) from None
    return obj


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Sends whatever is written to standard output (Python or native code) to standard
    error: under stdio, standard output carries the protocol and nothing else."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def run(args: argparse.Namespace) -> int:
    """Checks the options, loads the model and serves until stopped (or stdin closes).

    Args:
        args: The parsed arguments.

    Returns:
        The exit code: 2 on a bad option, schema or refused bind (all checked before the
        model loads).
    """
    check_temperature(args.temperature)
    check_at_least(args, 1, "max_text_chars", "max_batch", "port")
    if not 0.0 <= args.threshold <= 1.0:
        raise UsageError(f"--threshold is a probability in [0, 1]; got {args.threshold}.")
    key = keyed_bind(args) if args.http else None
    with stdout_to_stderr():
        schemas = [load_schema(s) for s in args.schema]
        from ..decide.decider import Decider
        from ..engine.load.sources import model_source
        from ..mcp import server

        decider = Decider.load(model_source(args.model))
        srv = server(
            decider,
            schemas,
            threshold=args.threshold,
            calibration=args.calibration or None,
            generic=not args.no_generic,
            temperature=args.temperature,
            max_text_chars=args.max_text_chars,
            max_batch_texts=args.max_batch,
        )
        import anyio

        tools = [t.name for t in anyio.run(srv.list_tools)]
        where = f"http://{args.host}:{args.port}/mcp" if args.http else "stdio"
        info = {
            "model": decider.model_id,
            "tools": tools,
            "transport": "streamable-http" if args.http else "stdio",
            "url": where if args.http else None,
            "auth": bool(key),
        }
        print(
            json.dumps(info)
            if args.json
            else f"pcd mcp: {decider.model_id} on {where}, tools {', '.join(tools)}"
            + (f" (auth {'on' if key else 'off'})" if args.http else ""),
            file=sys.stderr,
            flush=True,
        )
    if not args.http:
        anyio.run(srv.run_stdio_async)
        return 0
    import uvicorn

    from ..mcp import http_app

    app = http_app(srv, api_key=key, host=args.host)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
