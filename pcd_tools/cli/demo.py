"""`pcd demo`: decide the support-ticket example on the embedded model.

The demo shows what works best without labelled data for its ticket schema:
`DEMO_EXAMPLES`, four tickets answered by hand (one per priority, the critical one
last), go in the cached schema prefix as few-shot examples, and no label-free
correction is applied. Measured on the embedded model on 9 tickets written for the
purpose (27 field answers: the demo ticket and 8 others), then on 7 more held out from
the choice (21):

| setting | 9 tickets | 7 held out | demo ticket's priority |
|---|---|---|---|
| zero-shot, raw | 9 / 27 | 7 / 21 | P2_NORMAL (0.81) |
| contextual calibration | 7 / 27 | - | P2_NORMAL |
| PMI | 10 / 27 | - | P2_NORMAL |
| these 4 examples | **13 / 27** | **11 / 21** | **P0_CRITICAL** |
| 4 examples + contextual | 5 / 27 | - | P1_HIGH |
| 4 examples + PMI | 5 / 27 | - | P1_HIGH |

Contextual calibration and PMI pushed this 135M model towards `ACCOUNT` and `P1_HIGH` on
almost every ticket; the examples mostly fixed `requires_escalation` and the department.
The samples are tiny: read them as "examples help here, the corrections do not", not as
an accuracy. With a calibration file (`--calibration`) the demo decides the schema the
file was fitted for: with the examples if its fingerprint includes them, else without.
"""

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


# Few-shot examples for the demo schema, in prompt order (the most urgent last).
DEMO_EXAMPLES: list[dict[str, Any]] = [
    {
        "input": "Subject: Quote for more seats\n\nWe would like a quote for 50 more seats "
        "before our renewal next quarter. No rush.",
        "output": {"priority": "P3_LOW", "requires_escalation": False, "department": "SALES"},
    },
    {
        "input": "Subject: Disputing last invoice\n\nWe were billed for 40 seats in March but "
        "only 25 people have accounts. We do not accept this invoice and want it corrected.",
        "output": {
            "priority": "P2_NORMAL",
            "requires_escalation": False,
            "department": "BILLING_DISPUTE",
        },
    },
    {
        "input": "Subject: Admin account locked\n\nOur only admin was locked out after a "
        "password reset and the 2FA codes are rejected, so nobody can add or remove users. "
        "Can you unlock it?",
        "output": {"priority": "P1_HIGH", "requires_escalation": False, "department": "ACCOUNT"},
    },
    {
        "input": "Subject: Nobody can log in\n\nSince 08:30 every login through SSO returns a "
        "503 error. Our whole company is locked out of the product and our support team "
        "cannot work. Please fix this immediately.",
        "output": {
            "priority": "P0_CRITICAL",
            "requires_escalation": True,
            "department": "ENGINEERING",
        },
    },
]


EMBEDDED_NOTE = """\
Note: the embedded SmolLM2-135M-Instruct is a 135M model for trying pcd-tools offline and
for tests, not for real decisions: it is often confidently wrong (without the examples it
calls this outage P2_NORMAL). For real work load a Qwen2.5 or Llama 3.x instruct model, as a
GGUF file on Linux or from mlx-community on a Mac, with a calibration fitted on your data:
  Decider.load("models/Qwen2.5-7B-Instruct-Q4_K_M.gguf", calibration="cal.json")
  Decider.load("mlx-community/Qwen2.5-7B-Instruct-4bit")
  pcd demo --model models/Qwen2.5-7B-Instruct-Q4_K_M.gguf"""


def demo_schema() -> Any:
    """The demo's `SupportTicket` decision model."""
    from typing import Literal

    from pydantic import BaseModel, Field

    from ..decide.decorator import decision

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


def demo_examples(schema: Any, calibration: Any = None) -> list[dict[str, Any]]:
    """The examples the demo decides with: `DEMO_EXAMPLES`, or none when a fitted
    calibration was fitted for the schema without them.

    Args:
        schema: The demo schema.
        calibration: The decider's fitted `Calibration`, if any.
    """
    from ..schema import compile_schema, with_examples

    if calibration is None:
        return DEMO_EXAMPLES
    shown = with_examples(compile_schema(schema), DEMO_EXAMPLES, "DEMO_EXAMPLES")
    return DEMO_EXAMPLES if calibration.schema_fingerprint == shown.fingerprint() else []


def label_free_line(examples: int, calibration: str) -> str:
    """The line that says what the demo used without labels.

    Args:
        examples: Few-shot examples in the prompt.
        calibration: The decision's label-free calibration (`"none"`, `"contextual"`).
    """
    shown = f"{examples} examples in the cached prefix" if examples else "no examples"
    how = (
        "contextual calibration on" if calibration == "contextual" else "contextual calibration off"
    )
    why = "" if calibration == "contextual" else " (it hurt this schema)"
    return f"label-free: {shown}; {how}{why}"


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
    from ..engine.host.blas import blas_status
    from ..engine.load.sources import EMBEDDED_MODEL_ID

    check_temperature(args.temperature)
    console = make_console(args)
    schema = demo_schema()
    with console.status("Loading model..."):
        decider = load_decider(args)
    examples = demo_examples(schema, getattr(decider, "calibration", None))
    blas = blas_status()
    console.print(f"[bold]Context[/bold]\n{DEMO_CONTEXT}\n")
    cold = decider.decide(schema, DEMO_CONTEXT, temperature=args.temperature, examples=examples)
    warm = decider.decide(schema, DEMO_CONTEXT, temperature=args.temperature, examples=examples)
    label_free = {"examples": len(examples), "calibration": warm.calibration_method}
    if args.json:
        print(
            json.dumps(
                {"cold": cold.to_response(), "warm": warm.to_response(), "label_free": label_free},
                indent=2,
            )
        )
        return 0
    print_decision(console, cold, title="Cold request (schema prefix prefilled)")
    print_decision(console, warm, title="Warm request (schema prefix cached)")
    console.print(
        f"BLAS: {blas.name} ({(blas.gflops or 0):.0f} GFLOP/s)  dtype={decider.loaded.dtype}"
    )
    console.print(f"value: {warm.value!r}")
    console.print(
        label_free_line(label_free["examples"], warm.calibration_method),
        soft_wrap=True,
        markup=False,
        highlight=False,
    )
    if decider.model_id == EMBEDDED_MODEL_ID:
        console.print(EMBEDDED_NOTE, soft_wrap=True, markup=False, highlight=False)
    return 0
