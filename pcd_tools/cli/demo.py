"""`pcd demo`: decide the support-ticket example on the embedded model."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ._common import check_temperature, load_decider, make_console, print_decision

HELP = "decide the support-ticket example on the embedded model"

DEMO_CONTEXT = (
    "Subject: URGENT - checkout API returning 500s for all EU customers\n\n"
    "Since 09:12 UTC every call to /v2/checkout from our EU storefronts fails with HTTP 500. "
    "We are an enterprise customer on the Platinum plan and this is blocking all of our sales "
    "in Europe, roughly $40k per hour. Our status page is red and our CTO is asking for an "
    "ETA. We have not changed anything on our side. Please get an engineer on this now."
)


EMBEDDED_NOTE = """\
Note: the embedded SmolLM2-135M-Instruct is a 135M model for trying pcd-tools offline and
for tests, not for real decisions: it is often confidently wrong (here it may well call
this outage P2_NORMAL). For real work load a Qwen2.5 or Llama 3.x instruct model, as a
GGUF file on Linux or from mlx-community on a Mac, with a calibration fitted on your data:
  Decider.load("models/Qwen2.5-7B-Instruct-Q4_K_M.gguf", calibration="cal.json")
  Decider.load("mlx-community/Qwen2.5-7B-Instruct-4bit")
  pcd demo --model models/Qwen2.5-7B-Instruct-Q4_K_M.gguf"""


def demo_schema() -> Any:
    """The demo's `SupportTicket` decision model."""
    from typing import Literal

    from pydantic import BaseModel, Field

    from ..schema import decision

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `pcd demo` options (the dispatcher adds the common ones).

    Args:
        parser: The sub-command's parser.
    """
    parser.add_argument("--temperature", type=float, default=1.0)


def run(args: argparse.Namespace) -> int:
    """Decides the demo ticket twice (cold, then warm) and prints both.

    Args:
        args: The parsed arguments.

    Returns:
        The exit code: 2 for an out-of-range option (before the model loads).
    """
    from ..engine.models import EMBEDDED_MODEL_ID
    from ..engine.platform import blas_status

    check_temperature(args.temperature)
    console = make_console(args)
    schema = demo_schema()
    with console.status("Loading model..."):
        decider = load_decider(args)
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
    if decider.model_id == EMBEDDED_MODEL_ID:
        console.print(EMBEDDED_NOTE, soft_wrap=True, markup=False, highlight=False)
    return 0
