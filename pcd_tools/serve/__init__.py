"""`pcd serve`: an HTTP decision server (System One compatible, plus `/v1/decide`).

This module stays cheap to import: FastAPI and uvicorn load inside `run()` and in
`pcd_tools.serve.app`.

Example:
    `pcd serve --port 8000` then
    `curl -s localhost:8000/v1/systemone -d '{"state": "...", "questions": {...}}'`
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
from typing import Any

__all__ = ["add_arguments", "create_app", "is_loopback", "run"]

API_KEY_ENV = "PCD_API_KEY"


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module 'pcd_tools.serve' has no attribute {name!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `pcd serve` options (cli.py adds --model, --json and --calibration)."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"require `Authorization: Bearer KEY` on /v1/* and /metrics (default: ${API_KEY_ENV})",
    )
    parser.add_argument(
        "--allow-remote-without-key",
        action="store_true",
        help="bind a non-loopback address without an API key (refused otherwise)",
    )
    parser.add_argument(
        "--max-queue", type=int, default=256, help="requests waiting for the model before 429"
    )
    parser.add_argument("--max-batch", type=int, default=16, help="requests per model batch")
    parser.add_argument(
        "--max-batch-tokens", type=int, default=8192, help="prompt tokens per model batch"
    )
    parser.add_argument(
        "--batch-wait-ms",
        type=float,
        default=2.0,
        help="how long an idle worker waits for requests arriving together",
    )
    parser.add_argument(
        "--max-body-bytes", type=int, default=1 << 20, help="largest request body (413 above)"
    )
    parser.add_argument(
        "--max-questions", type=int, default=64, help="questions per request (413 above)"
    )
    parser.add_argument("--no-warmup", action="store_true", help="skip the start-up warm-up")
    parser.add_argument("--log-level", default="info", help="uvicorn log level")


def is_loopback(host: str) -> bool:
    """Whether `host` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    """Runs `pcd serve`; returns the exit code."""
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    if not is_loopback(args.host) and not key and not args.allow_remote_without_key:
        print(
            f"error: refusing to bind {args.host!r} without an API key: anyone who can reach "
            f"it could use the model. Set --api-key or ${API_KEY_ENV}, bind 127.0.0.1, or pass "
            "--allow-remote-without-key.",
            file=sys.stderr,
        )
        return 2
    for name in ("port", "max_queue", "max_batch", "max_body_bytes", "max_questions"):
        v = getattr(args, name)
        if v < (0 if name == "port" else 1):
            print(f"error: --{name.replace('_', '-')} must be >= 1; got {v}.", file=sys.stderr)
            return 2
    try:
        import uvicorn

        from .app import create_app
    except ImportError as e:
        print(
            f"error: `pcd serve` needs {e.name!r}; install it with `pip install 'pcd-tools[serve]'`.",
            file=sys.stderr,
        )
        return 2
    from ..decider import Decider

    kw: dict[str, Any] = {}
    if getattr(args, "calibration", None):
        kw["calibration"] = args.calibration
    decider = Decider.load(getattr(args, "model", None), **kw)
    app = create_app(
        decider,
        api_key=key,
        max_queue=args.max_queue,
        max_batch=args.max_batch,
        max_batch_tokens=args.max_batch_tokens,
        batch_wait_ms=args.batch_wait_ms,
        max_body_bytes=args.max_body_bytes,
        max_questions=args.max_questions,
        warmup=not args.no_warmup,
    )
    info = {
        "event": "serving",
        "url": f"http://{args.host}:{args.port}",
        "model": decider.model_id,
        "device": decider.device,
        "auth": bool(key),
    }
    print(
        json.dumps(info)
        if getattr(args, "json", False)
        else f"pcd serve: {decider.model_id} on {decider.device} at {info['url']} "
        f"(auth {'on' if key else 'off'})",
        file=sys.stderr,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
