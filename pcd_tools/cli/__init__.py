"""The `pcd` command: a thin dispatcher over one module per sub-command.

Every sub-command module defines `HELP`, `add_arguments(parser)` and `run(args) -> int`,
and stays cheap to import: the library loads inside `run`. This package is the only
place argparse lives; the library takes typed arguments.

Every sub-command is testable through `main(argv)`, which returns the exit code.
A bad sub-command or option is a usage error (exit 2), not a traceback; so is a bad
option value (`--temperature 0`, a missing `--schema` file), which each sub-command checks
with `_common.UsageError` before it loads a model.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

from ..errors import PcdToolsError
from ._common import UsageError, add_common, check_calibration, print_error

__all__ = ["build_parser", "main"]

# (sub-command, module, takes --calibration), in the order `pcd --help` lists them.
SUBCOMMANDS: tuple[tuple[str, str, bool], ...] = (
    ("demo", "pcd_tools.cli.demo", True),
    ("decide", "pcd_tools.cli.decide", True),
    ("models", "pcd_tools.cli.models", False),
    ("bench", "pcd_tools.cli.bench", False),
    ("serve", "pcd_tools.cli.serve", True),
    ("mcp", "pcd_tools.cli.mcp", True),
    ("eval", "pcd_tools.cli.eval", True),
    ("calibrate", "pcd_tools.cli.calibrate", False),
    ("batch", "pcd_tools.cli.batch", True),
)

# Optional dependencies (import name → extra), for the message when one is missing.
OPTIONAL_MODULES: dict[str, str] = {
    "fastapi": "serve",
    "uvicorn": "serve",
    "httpx": "serve",
    "starlette": "serve",
    "mcp": "mcp",
    "outlines_core": "bench",
    "matplotlib": "bench",
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command.

    Returns:
        The `pcd` parser; each sub-command sets `func` to its `run`.
    """
    parser = argparse.ArgumentParser(prog="pcd", description="Parallel Constrained Decoding tools")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module, calibration in SUBCOMMANDS:
        try:
            mod = importlib.import_module(module)
        except ImportError as e:  # an optional extra is missing: say which
            p = sub.add_parser(name, help=f"{name} (unavailable: {e.name} not installed)")
            p.set_defaults(func=_missing_extra(name, e))
            continue
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        add_common(p, calibration=calibration)
        mod.add_arguments(p)
        p.set_defaults(func=mod.run)
    return parser


def _extra_for(err: ImportError) -> str | None:
    root = (err.name or "").split(".")[0]
    return OPTIONAL_MODULES.get(root)


def _print_missing_extra(name: str, err: ImportError, extra: str) -> None:
    print(
        f"error: `pcd {name}` needs {err.name!r}; install it with "
        f"`pip install 'pcd-tools[{extra}]'`.",
        file=sys.stderr,
    )


def _missing_extra(name: str, err: ImportError) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        _print_missing_extra(name, err, _extra_for(err) or {"serve": "serve"}.get(name, "bench"))
        return 2

    return run


def main(argv: list[str] | None = None) -> int:
    """Runs the `pcd` command.

    Args:
        argv: The arguments after `pcd`; default `sys.argv[1:]`.

    Returns:
        The exit code: 0 on success, 1 on a `PcdToolsError`, 2 on a usage error or a
        missing optional extra.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors, 0 on --help
        return int(e.code or 0)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        check_calibration(args)
        return int(args.func(args))
    except UsageError as e:  # a bad argument, found before any model loads
        print_error(str(e))
        return 2
    except ImportError as e:  # the library needs an extra that is not installed
        extra = _extra_for(e)
        if extra is None:
            if isinstance(e, PcdToolsError):
                print_error(f"{type(e).__name__}: {e}")
                return 1
            raise
        _print_missing_extra(args.command, e, extra)
        return 2
    except PcdToolsError as e:
        print_error(f"{type(e).__name__}: {e}")
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
