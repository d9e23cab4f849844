"""Helpers shared by the `pcd` sub-commands: common options, loading, printing."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

__all__ = [
    "UsageError",
    "add_bind_options",
    "add_common",
    "check_at_least",
    "check_calibration",
    "check_file",
    "check_temperature",
    "keyed_bind",
    "load_decider",
    "make_console",
    "print_decision",
    "print_error",
]


class UsageError(Exception):
    """A bad command-line argument, found before any model loads.

    `pcd_tools.cli.main` prints `error: <message>` and exits 2. The message names the
    flag, what it accepts and what it got.
    """


def check_temperature(value: float, flag: str = "--temperature") -> None:
    """Refuses a temperature that is not a finite number > 0.

    Args:
        value: The parsed value.
        flag: The option, for the message.

    Raises:
        UsageError: when `value` is 0, negative, infinite or NaN.
    """
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{flag} must be a finite number > 0 (e.g. 1.0); got {value}.")


def check_at_least(args: argparse.Namespace, lowest: int | float, *dests: str) -> None:
    """Refuses a numeric option below `lowest` (options left at `None` are skipped).

    Args:
        args: The parsed arguments.
        lowest: The smallest accepted value.
        *dests: The options' argparse destinations (`max_queue` for `--max-queue`).

    Raises:
        UsageError: naming the first option below `lowest`.
    """
    for dest in dests:
        v = getattr(args, dest)
        if v is not None and not v >= lowest:
            raise UsageError(f"--{dest.replace('_', '-')} must be >= {lowest}; got {v}.")


def check_file(path: str, flag: str) -> None:
    """Refuses a path that is not a readable file.

    Args:
        path: The path given.
        flag: The option, for the message.

    Raises:
        UsageError: when `path` does not exist, is a folder, or cannot be read.
    """
    if not os.path.exists(path):
        raise UsageError(f"{flag} {path!r}: no such file.")
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path!r} is a folder; accepted: a file.")
    if not os.access(path, os.R_OK):
        raise UsageError(f"{flag} {path!r}: permission denied (the file cannot be read).")


def check_calibration(args: argparse.Namespace) -> None:
    """Checks `--calibration` (when the sub-command has it) before the model loads.

    The file must exist and be a pcd-tools calibration file; whether it fits the model is
    checked once the model is loaded.

    Args:
        args: The parsed arguments.

    Raises:
        UsageError: for a missing, unreadable or malformed calibration file.
    """
    path = getattr(args, "calibration", None)
    if not path:
        return
    check_file(path, "--calibration")
    from ..answers.calibration import Calibration, CalibrationError

    try:
        Calibration.load(path)
    except CalibrationError as e:
        raise UsageError(f"--calibration: {e}") from e


def add_common(parser: argparse.ArgumentParser, *, calibration: bool = False) -> None:
    """Adds the options every sub-command shares.

    Args:
        parser: The sub-command's parser.
        calibration: Whether to add `--calibration` too.
    """
    parser.add_argument(
        "--model",
        default=None,
        help="GGUF file, MLX directory or HF id; `embedded` (the default) names the embedded model",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    if calibration:
        parser.add_argument("--calibration", default=None, help="calibration JSON file to apply")


def add_bind_options(parser: Any, *, key_guards: str) -> None:
    """Adds `--host`, `--port`, `--api-key` and `--allow-remote-without-key`, the options
    of every sub-command that serves over HTTP (`pcd serve`, `pcd mcp --http`).

    Args:
        parser: The parser or argument group.
        key_guards: What the key protects, for `--api-key`'s help (e.g. "on /v1/*").
    """
    from ..serve import API_KEY_ENV

    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"require `Authorization: Bearer KEY`{key_guards} (default: ${API_KEY_ENV})",
    )
    parser.add_argument(
        "--allow-remote-without-key",
        action="store_true",
        help="bind a non-loopback address without an API key (refused otherwise)",
    )


def keyed_bind(args: argparse.Namespace) -> str | None:
    """The API key to require (`--api-key`, else `$PCD_API_KEY`), once the bind is allowed.

    Raises:
        UsageError: for a non-loopback `--host` without a key, unless
            `--allow-remote-without-key`: anyone who can reach it could use the model.
    """
    from ..serve import API_KEY_ENV, api_key_from_env, is_loopback

    key = api_key_from_env(args.api_key)
    if not is_loopback(args.host) and not key and not args.allow_remote_without_key:
        raise UsageError(
            f"refusing to bind {args.host!r} without an API key: anyone who can reach "
            f"it could use the model. Set --api-key or ${API_KEY_ENV}, bind 127.0.0.1, or pass "
            "--allow-remote-without-key."
        )
    return key


def print_error(message: str) -> None:
    """Prints an error to stderr, unwrapped (so it can be grepped and parsed).

    Args:
        message: The text after `error: `.
    """
    print(f"error: {message}", file=sys.stderr)


def make_console(args: argparse.Namespace) -> Any:
    """Returns a rich Console; on stderr when `--json` keeps stdout for the JSON.

    Args:
        args: The parsed arguments.
    """
    from rich.console import Console

    return Console(stderr=bool(getattr(args, "json", False)))


def load_decider(args: argparse.Namespace) -> Any:
    """Loads the Decider named by `--model`, applying `--calibration` when given.

    Args:
        args: The parsed arguments.

    Returns:
        The loaded `Decider`.
    """
    from ..decide.decider import Decider
    from ..engine.load.sources import model_source

    kw: dict[str, Any] = {}
    if getattr(args, "calibration", None):
        kw["calibration"] = args.calibration
    return Decider.load(model_source(args.model), **kw)


def print_decision(console: Any, decision: Any, *, title: str = "Decision") -> None:
    """Prints a decision as a table: value, probability, top alternatives, timings.

    Args:
        console: A rich Console.
        decision: The `Decision` to print.
        title: The table title.
    """
    from rich.table import Table

    table = Table(title=title)
    for col in ("field", "value", "probability", "alternatives"):
        table.add_column(col)
    for name, f in decision.fields.items():
        alts = ", ".join(f"{json.dumps(c)} {p:.3f}" for c, p in f.top_choices[1:3])
        prob = "generated" if f.probability is None else f"{f.probability:.4f}"
        table.add_row(name, json.dumps(f.label, ensure_ascii=False), prob, alts)
    console.print(table)
    console.print(
        f"prefill_ms={decision.prefill_ms:.1f}  suffix_eval_ms={decision.suffix_eval_ms:.1f}  "
        f"elapsed_ms={decision.elapsed_ms:.1f}  sequential_forward_passes="
        f"{decision.sequential_forward_passes}  prompt_tokens={decision.prompt_tokens}  "
        f"prefix_cache_hit={decision.prefix_cache_hit}"
    )
    console.print(
        f"model={decision.model_id}  device={decision.device}  scoring={decision.scoring}  mode={decision.mode}"
    )
