"""The `pcd` command: a thin dispatcher over the library.

Every subcommand is testable through `main(argv)`, which returns the exit code.
A bad subcommand or option is a usage error (exit 2), not a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from .errors import PcdToolsError

__all__ = ["main"]

DEMO_CONTEXT = (
    "Subject: URGENT - checkout API returning 500s for all EU customers\n\n"
    "Since 09:12 UTC every call to /v2/checkout from our EU storefronts fails with HTTP 500. "
    "We are an enterprise customer on the Platinum plan and this is blocking all of our sales "
    "in Europe, roughly $40k per hour. Our status page is red and our CTO is asking for an "
    "ETA. We have not changed anything on our side. Please get an engineer on this now."
)


def _demo_schema() -> Any:
    from typing import Literal

    from pydantic import BaseModel, Field

    from .schema import decision

    @decision
    class SupportTicket(BaseModel):
        """Triage an inbound customer support ticket."""

        priority: Literal["P0_CRITICAL", "P1_HIGH", "P2_NORMAL", "P3_LOW"] = Field(
            description="Urgency tier based on customer business impact",
            json_schema_extra={
                "choice_descriptions": {
                    "P0_CRITICAL": "production down or revenue blocked",
                    "P1_HIGH": "major feature broken, workaround hard",
                    "P2_NORMAL": "minor issue or question",
                    "P3_LOW": "cosmetic or feature request",
                }
            },
        )
        requires_escalation: bool = Field(
            description="Whether an on-call engineer must be notified now"
        )
        department: Literal["ENGINEERING", "BILLING", "BILLING_DISPUTE", "ACCOUNT", "SALES"] = (
            Field(description="Team that should own the ticket")
        )

    return SupportTicket


def _error(message: str) -> None:
    """Prints an error to stderr, unwrapped (so it can be grepped and parsed)."""
    print(f"error: {message}", file=sys.stderr)


def _console(args: argparse.Namespace) -> Any:
    from rich.console import Console

    return Console(stderr=bool(getattr(args, "json", False)))


def _load(args: argparse.Namespace) -> Any:
    from .decider import Decider

    kw: dict[str, Any] = {}
    if getattr(args, "calibration", None):
        kw["calibration"] = args.calibration
    return Decider.load(args.model, **kw)


def print_decision(console: Any, decision: Any, *, title: str = "Decision") -> None:
    """Prints a decision as a table: value, probability, top alternatives, timings."""
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


def cmd_demo(args: argparse.Namespace) -> int:
    from .engine.platform import blas_status

    console = _console(args)
    schema = _demo_schema()
    with console.status("Loading model..."):
        decider = _load(args)
    blas = blas_status()
    console.print(f"[bold]Context[/bold]\n{DEMO_CONTEXT}\n")
    cold = decider.decide(schema, DEMO_CONTEXT, temperature=args.temperature)
    warm = decider.decide(schema, DEMO_CONTEXT, temperature=args.temperature)
    if args.json:
        print(json.dumps({"cold": cold.to_response(), "warm": warm.to_response()}, indent=2))
        return 0
    print_decision(console, cold, title="Cold request (schema prefix prefilled)")
    print_decision(console, warm, title="Warm request (schema prefix cached)")
    console.print(
        f"BLAS: {blas.name} ({(blas.gflops or 0):.0f} GFLOP/s)  dtype={decider.loaded.dtype}"
    )
    console.print(f"value: {warm.value!r}")
    return 0


def cmd_decide(args: argparse.Namespace) -> int:
    from .schema import StructuredSchema

    console = _console(args)
    try:
        with open(args.schema, encoding="utf-8") as fh:
            spec = json.load(fh)
    except OSError as e:
        _error(f"cannot read schema file {args.schema!r}: {e}")
        return 2
    except json.JSONDecodeError as e:
        _error(f"schema file {args.schema!r} is not valid JSON: {e}")
        return 2
    context = sys.stdin.read() if args.context == "-" else args.context
    schema = StructuredSchema(spec)  # the dict form, or {"name", "instructions", "fields"}
    decider = _load(args)
    d = decider.decide(schema, context, temperature=args.temperature, scoring=args.scoring)
    if args.json:
        print(json.dumps(d.to_response(), indent=2, ensure_ascii=False))
    else:
        print_decision(console, d)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from .engine.platform import doctor

    console = _console(args)
    info: dict[str, Any] = {}
    try:
        from .engine.models import EMBEDDED_MODEL_ID, embedded_model_path

        path = embedded_model_path()
        info["embedded"] = {
            "id": EMBEDDED_MODEL_ID,
            "path": str(path),
            "size_mb": round(path.stat().st_size / 2**20, 1),
        }
    except PcdToolsError as e:
        info["embedded"] = {"error": str(e)}
    info["sources"] = [
        "embedded default: Decider.load()",
        "GGUF file (llama, qwen2; any quant type): Decider.load('model.gguf')",
        "MLX directory or Hugging Face id via mlx_lm.load: Decider.load('mlx-community/...')",
    ]
    if args.doctor:
        info["doctor"] = doctor()
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    emb = info["embedded"]
    console.print(
        f"[bold]Embedded model[/bold]: {emb.get('id', '-')}  {emb.get('path', emb.get('error'))}"
    )
    for s in info["sources"]:
        console.print(f"  - {s}")
    if args.doctor:
        for k, v in info["doctor"].items():
            console.print(f"{k:>22}: {v}")
    return 0


def _add_common(p: argparse.ArgumentParser, *, calibration: bool = False) -> None:
    p.add_argument(
        "--model", default=None, help="GGUF file, MLX directory or HF id (default: embedded)"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    if calibration:
        p.add_argument("--calibration", default=None, help="calibration JSON file to apply")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="pcd", description="Parallel Constrained Decoding tools")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("demo", help="decide the support-ticket example on the embedded model")
    _add_common(p, calibration=True)
    p.add_argument("--temperature", type=float, default=1.0)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("decide", help="decide a dict-form schema for a context")
    _add_common(p, calibration=True)
    p.add_argument("--schema", required=True, help="JSON file: the StructuredSchema dict form")
    p.add_argument("--context", required=True, help="the text, or - to read standard input")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--scoring", choices=["full", "constrained"], default="full")
    p.set_defaults(func=cmd_decide)

    p = sub.add_parser("models", help="list model sources; --doctor checks the platform")
    _add_common(p)
    p.add_argument("--doctor", action="store_true", help="device, BLAS and its GFLOP/s, cache dir")
    p.set_defaults(func=cmd_models)

    import importlib

    for name, (module, help_text) in SUBCOMMAND_MODULES.items():
        try:
            mod = importlib.import_module(module)
        except ImportError as e:  # an optional extra is missing: say which
            p = sub.add_parser(name, help=f"{help_text} (unavailable: {e.name} not installed)")
            p.set_defaults(func=_missing_extra(name, e))
            continue
        p = sub.add_parser(name, help=help_text)
        _add_common(p, calibration=name in ("eval", "serve"))
        mod.add_arguments(p)
        p.set_defaults(func=mod.run)
    return parser


# Subcommands that live in their own modules. Each module must be cheap to import (no mlx
# at import time) and define `add_arguments(parser)` and `run(args) -> int`. `--model` and
# `--json` are added here.
SUBCOMMAND_MODULES: dict[str, tuple[str, str]] = {
    "bench": ("pcd_tools.bench", "benchmark PCD against autoregressive baselines"),
    "serve": ("pcd_tools.serve", "run the HTTP decision server (System One + /v1/decide)"),
    "eval": (
        "pcd_tools.evaluate",
        "evaluate a schema on labelled data (PCD vs constrained generation)",
    ),
    "calibrate": ("pcd_tools.calibration", "fit per-field temperatures on labelled data"),
}


def _missing_extra(name: str, err: ImportError) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        extra = {"serve": "serve"}.get(name, "bench")
        print(
            f"error: `pcd {name}` needs {err.name!r}; install it with "
            f"`pip install 'pcd-tools[{extra}]'`.",
            file=sys.stderr,
        )
        return 2

    return run


def main(argv: list[str] | None = None) -> int:
    """Runs the `pcd` command; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors, 0 on --help
        return int(e.code or 0)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args))
    except PcdToolsError as e:
        _error(f"{type(e).__name__}: {e}")
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
