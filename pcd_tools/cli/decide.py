"""`pcd decide`: decide a dict-form schema for a context."""

from __future__ import annotations

import argparse
import json
import sys

from ._common import (
    UsageError,
    check_temperature,
    load_decider,
    make_console,
    print_decision,
)

HELP = "decide a dict-form schema for a context"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `pcd decide` options (the dispatcher adds the common ones).

    Args:
        parser: The sub-command's parser.
    """
    parser.add_argument("--schema", required=True, help="JSON file: the StructuredSchema dict form")
    parser.add_argument("--context", required=True, help="the text, or - to read standard input")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--scoring", choices=["auto", "full", "constrained", "pmi"], default="auto")


def run(args: argparse.Namespace) -> int:
    """Reads the schema file and the context, decides, and prints the decision.

    Args:
        args: The parsed arguments.

    Returns:
        The exit code: 2 when an option is out of range or the schema file cannot be
        read or parsed (checked before the model loads).
    """
    from ..schema import StructuredSchema

    check_temperature(args.temperature)
    console = make_console(args)
    try:
        with open(args.schema, encoding="utf-8") as fh:
            spec = json.load(fh)
    except OSError as e:
        raise UsageError(
            f"--schema: cannot read schema file {args.schema!r}: {e.strerror or e}."
        ) from e
    except json.JSONDecodeError as e:
        raise UsageError(f"--schema: schema file {args.schema!r} is not valid JSON: {e}") from e
    context = sys.stdin.read() if args.context == "-" else args.context
    schema = StructuredSchema(spec)  # the dict form, or {"name", "instructions", "fields"}
    decider = load_decider(args)
    d = decider.decide(schema, context, temperature=args.temperature, scoring=args.scoring)
    if args.json:
        print(json.dumps(d.to_response(), indent=2, ensure_ascii=False))
    else:
        print_decision(console, d)
    return 0
