"""`pcd serve`: run the HTTP decision server (`pcd_tools.serve.serve`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ._common import UsageError, add_bind_options, check_at_least, keyed_bind, print_error

HELP = (
    "run the HTTP decision server: /v1/systemone, /v1/decide, /v1/chat/completions "
    "(OpenAI structured outputs), /v1/decisions (OpenAI Decisions)"
)

# uvicorn's log levels (`uvicorn.config.LOG_LEVELS`), so a typo fails before the model loads.
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `pcd serve` options (the dispatcher adds --model, --json and --calibration).

    Args:
        parser: The sub-command's parser.
    """
    add_bind_options(parser, key_guards=" on /v1/* and /metrics")
    parser.add_argument(
        "--max-queue",
        type=int,
        default=256,
        help="requests waiting for the model before 429 (default %(default)s)",
    )
    parser.add_argument(
        "--max-batch", type=int, default=16, help="requests per model batch (default %(default)s)"
    )
    parser.add_argument(
        "--max-batch-tokens",
        type=int,
        default=8192,
        help="prompt tokens per model batch (default %(default)s)",
    )
    parser.add_argument(
        "--batch-wait-ms",
        type=float,
        default=2.0,
        help="how long an idle worker waits for requests arriving together (default %(default)s)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=1 << 20,
        help="largest request body (413 above; default %(default)s)",
    )
    parser.add_argument(
        "--max-questions",
        type=int,
        default=64,
        help="questions per request (413 above; default %(default)s)",
    )
    parser.add_argument("--no-warmup", action="store_true", help="skip the start-up warm-up")
    parser.add_argument(
        "--log-level",
        default="info",
        help=f"uvicorn log level: {', '.join(LOG_LEVELS)} (default %(default)s)",
    )
    ray = parser.add_argument_group("ray serve (the `ray` extra)")
    ray.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        default=None,
        metavar="ADDRESS",
        help="serve on Ray Serve: `auto` (the running cluster, else a local one; the "
        "default), `local` or a cluster address",
    )
    ray.add_argument(
        "--replicas",
        default="1",
        metavar="N|MIN:MAX",
        help="with --ray: a fixed replica count or an autoscaling range (default %(default)s)",
    )
    ray.add_argument(
        "--num-cpus-per-replica",
        type=float,
        default=2.0,
        help="with --ray: CPUs per replica; its threads follow (default %(default)s)",
    )


def check_args(args: argparse.Namespace) -> None:
    """Checks the `pcd serve` limits, port and log level (the bind is checked in `run`).

    Args:
        args: The parsed arguments; `log_level` is lower-cased.

    Raises:
        UsageError: naming the first bad option (`pcd` exits 2).
    """
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0 to 65535; got {args.port}.")
    check_at_least(
        args, 1, "max_queue", "max_batch", "max_batch_tokens", "max_body_bytes", "max_questions"
    )
    check_at_least(args, 0, "batch_wait_ms")
    check_at_least(args, 0.01, "num_cpus_per_replica")
    args.replica_range = _replicas(args.replicas)
    if args.batch_wait_ms == float("inf"):
        raise UsageError(f"--batch-wait-ms must be a finite number >= 0; got {args.batch_wait_ms}.")
    level = str(args.log_level).lower()
    if level not in LOG_LEVELS:
        raise UsageError(f"--log-level must be one of {list(LOG_LEVELS)}; got {args.log_level!r}.")
    args.log_level = level


def _replicas(value: str) -> tuple[int, int]:
    lo, sep, hi = str(value).partition(":")
    try:
        lo_n, hi_n = (int(lo), int(hi)) if sep else (int(lo), int(lo))
    except ValueError:
        raise UsageError(f"--replicas takes N or MIN:MAX (e.g. 2 or 1:4); got {value!r}.") from None
    if lo_n < (0 if sep else 1) or hi_n < max(lo_n, 1):
        raise UsageError(f"--replicas needs N >= 1, or 0 <= MIN <= MAX, MAX >= 1; got {value!r}.")
    return lo_n, hi_n


def _serve_on_ray(args: argparse.Namespace, key: str | None) -> int:
    try:
        import ray.serve  # noqa: F401
    except ImportError:
        print_error(
            "`pcd serve --ray` needs 'ray'; install it with `pip install 'pcd-tools[ray]'`."
        )
        return 2
    from ..ray import run_server

    lo, hi = args.replica_range
    scale: dict[str, Any] = (
        {"num_replicas": lo}
        if lo == hi
        else {"autoscaling_config": {"min_replicas": lo, "max_replicas": hi}}
    )

    def announce(info: dict[str, Any]) -> None:
        print(
            json.dumps(info)
            if args.json
            else f"pcd serve: {info['model']} on Ray Serve at {info['url']} "
            f"(replicas {info['replicas']}, auth {'on' if info['auth'] else 'off'})",
            file=sys.stderr,
        )

    run_server(
        args.model,
        address=args.ray,
        host=args.host,
        port=args.port,
        on_ready=announce,
        api_key=key,
        calibration=args.calibration or None,
        num_cpus_per_replica=args.num_cpus_per_replica,
        max_queue=args.max_queue,
        max_batch=args.max_batch,
        max_batch_tokens=args.max_batch_tokens,
        batch_wait_ms=args.batch_wait_ms,
        max_body_bytes=args.max_body_bytes,
        max_questions=args.max_questions,
        warmup=not args.no_warmup,
        **scale,
    )
    return 0


def run(args: argparse.Namespace) -> int:
    """Checks the options, then serves until stopped.

    Args:
        args: The parsed arguments.

    Returns:
        The exit code: 2 on a refused bind or an option out of range (checked before the
        model loads).
    """
    check_args(args)
    key = keyed_bind(args)
    if args.ray is not None:
        return _serve_on_ray(args, key)
    from ..serve import serve

    def announce(info: dict[str, Any]) -> None:
        print(
            json.dumps(info)
            if args.json
            else f"pcd serve: {info['model']} on {info['device']} at {info['url']} "
            f"(auth {'on' if info['auth'] else 'off'})",
            file=sys.stderr,
        )

    serve(
        args.model,
        host=args.host,
        port=args.port,
        api_key=key,
        allow_remote_without_key=args.allow_remote_without_key,
        calibration=args.calibration or None,
        max_queue=args.max_queue,
        max_batch=args.max_batch,
        max_batch_tokens=args.max_batch_tokens,
        batch_wait_ms=args.batch_wait_ms,
        max_body_bytes=args.max_body_bytes,
        max_questions=args.max_questions,
        warmup=not args.no_warmup,
        log_level=args.log_level,
        on_ready=announce,
    )
    return 0
