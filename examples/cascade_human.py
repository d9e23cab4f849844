"""A confidence-gated cascade: the embedded model decides, a person settles the rest.

    python examples/cascade_human.py                    # asks at the terminal
    echo "1" | python examples/cascade_human.py         # answers from stdin
    python examples/cascade_human.py --model mlx-community/Qwen2.5-1.5B-Instruct-4bit

Fields whose probability is below the threshold go to the next stage with only their
top candidates. `--model ID` (a Hugging Face id, an MLX directory or a .gguf file) puts a
bigger local model between the embedded one and the human. Any LangChain chat model can
be a stage too: `Cascade(Triage, stages=[decider, ChatOpenAI(model="gpt-5-mini"), ask])`.
On stdin answers, an empty line or end of input takes the model's top suggestion.
"""

from __future__ import annotations

import argparse
import sys
from typing import Literal

from pydantic import BaseModel, Field

from pcd_tools import Decider
from pcd_tools.agents import Cascade, DeciderStage, HumanStage
from pcd_tools.agents.cascade import EscalationRequest


class Triage(BaseModel):
    """Triage an inbound customer support ticket."""

    priority: Literal["urgent", "normal", "low"] = Field(description="How fast to respond")
    requires_escalation: bool = Field(description="Whether an on-call engineer must be paged")
    channel: Literal["email", "phone", "chat"] = Field(description="Channel to reply on")


def ask_at_terminal(request: EscalationRequest) -> dict:
    """Shows each escalated field's candidates, most probable first, and reads a choice."""
    print(f"\nThe model is unsure about: {', '.join(request.fields)}")
    print(f"Text: {request.text}")
    answers = {}
    for name in request.fields:
        ranked = request.ranked[name]  # [(value, probability or None), ...], best first
        choices = [c for c, _ in ranked]
        suggested = choices[0]
        print(f"  {name}: {request.schema.field(name).description}")
        for i, (c, prob) in enumerate(ranked, 1):
            mark = "  <- suggested" if i == 1 else ""
            p_txt = f"p={prob:.2f}" if prob is not None else "p=?"
            print(f"    {i}. {c!s:<8} {p_txt}{mark}")
        print(f"  choose 1-{len(choices)} [Enter = suggested]: ", end="", flush=True)
        line = sys.stdin.readline()
        if not sys.stdin.isatty():
            print(line.strip() or "(default)")
        line = line.strip()
        pick = suggested
        if line.isdigit() and 1 <= int(line) <= len(choices):
            pick = choices[int(line) - 1]
        answers[name] = pick
    return answers


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a bigger model to try before the human (id, dir or .gguf)")
    p.add_argument("--threshold", type=float, default=0.8)
    p.add_argument(
        "--text",
        default="Hi, my invoice shows a double charge. Can someone call me back today?",
    )
    args = p.parse_args(argv)

    small = Decider.load()  # the embedded SmolLM2-135M-Instruct
    stages: list[object] = [DeciderStage(small, name="smollm2-135m")]
    if args.model:
        stages.append(DeciderStage(Decider.load(args.model), top_k=2))
    stages.append(HumanStage(ask_at_terminal, name="human", top_k=3))

    cascade = Cascade(Triage, stages=stages, threshold=args.threshold)
    result = cascade.invoke(args.text)

    print("\nresult     :", result.value)
    for name, f in result.fields.items():
        p_txt = f"p={f.probability:.2f}" if f.probability is not None else "human"
        print(f"  {name:<20} {f.label!s:<8} decided by {f.stage} ({p_txt})")
    print("latency ms :", {k: round(v, 1) for k, v in result.latency_ms.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
