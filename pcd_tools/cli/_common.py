"""Helpers shared by the `pcd` sub-commands: common options, loading, printing."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_common", "load_decider", "make_console", "print_decision", "print_error"]


def add_common(parser: argparse.ArgumentParser, *, calibration: bool = False) -> None:
    """Adds the options every sub-command shares.

    Args:
        parser: The sub-command's parser.
        calibration: Whether to add `--calibration` too.
    """
    parser.add_argument(
        "--model", default=None, help="GGUF file, MLX directory or HF id (default: embedded)"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    if calibration:
        parser.add_argument("--calibration", default=None, help="calibration JSON file to apply")


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
    from ..decider import Decider

    kw: dict[str, Any] = {}
    if getattr(args, "calibration", None):
        kw["calibration"] = args.calibration
    return Decider.load(args.model, **kw)


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
        table.add_row(name, json.dumps(f.label), f"{f.probability:.4f}", alts)
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
