"""The second-stage kinds on the embedded model equal brute force (one prompt per path)."""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
import pytest
from pydantic import BaseModel, Field

from pcd_tools.schema import compile_schema
from tests.oracle import oracle_log_scores, softmax

pytestmark = pytest.mark.integration

TEXT = "I was charged twice for my subscription! Refund the EUR 900 now, third time I ask."
SUBS = {"billing": ["refund", "invoice"], "bug": ["crash", "slow"]}


class Refund(BaseModel):
    kind: Literal["refund"]
    amount: Literal["small", "large"]


class Bug(BaseModel):
    kind: Literal["bug"]
    blocking: bool


class Intake(BaseModel):
    """Read a support message."""

    category: Literal["billing", "bug"]
    subcategory: str = Field(json_schema_extra={"choices_by": {"category": SUBS}})
    tags: list[Literal["vip", "angry", "repeat"]]
    severity: int = Field(ge=1, le=5)
    request: Annotated[Refund | Bug, Field(discriminator="kind")]
    team: Literal["billing_ops", "engineering"] = Field(
        json_schema_extra={"depends_on": ["category"]}
    )


def _p(real, sch, texts):
    return softmax(oracle_log_scores(real, sch, TEXT, "", texts=texts, share_prompt=True))


def test_every_kind_equals_full_prompts_on_the_embedded_model(real):
    sch = compile_schema(Intake)
    d = real.decide(Intake, TEXT)
    assert d.sequential_forward_passes == 3  # prefill, the joint pass, team's wave
    worst = 0.0

    def close(got, want):
        nonlocal worst
        worst = max(worst, float(np.abs(np.asarray(got) - np.asarray(want)).max()))

    p_cat = _p(real, sch, [f'\n  "category": "{c}",' for c in SUBS])
    for i, (cat, subs) in enumerate(SUBS.items()):
        before = f'\n  "category": "{cat}",'
        cond = _p(real, sch, [f'{before}\n  "subcategory": "{s}",' for s in subs])
        close([d.joint[("category", "subcategory")][(cat, s)] for s in subs], p_cat[i] * cond)
    for label in ("vip", "angry", "repeat"):
        stem = f'\n  "tags": {{"{label}": '
        close(d.fields["tags"].labels[label], _p(real, sch, [stem + "true,", stem + "false,"])[0])
    sev = _p(real, sch, [f'\n  "severity": {n},' for n in range(1, 6)])
    close(list(d.fields["severity"].distribution.values()), sev)
    assert d.fields["severity"].expected == pytest.approx(float(np.dot(sev, range(1, 6))), abs=1e-3)
    kind = '\n  "request.kind": "{}",'
    close(
        list(d.fields["request.kind"].distribution.values()),
        _p(real, sch, [kind.format(k) for k in ("refund", "bug")]),
    )
    amount = [kind.format("refund") + f'\n  "request.amount": "{a}",' for a in ("small", "large")]
    close(list(d.fields["request[refund].amount"].distribution.values()), _p(real, sch, amount))
    cat = d.fields["category"].label
    team = [f'\n  "category": "{cat}",\n  "team": "{t}",' for t in ("billing_ops", "engineering")]
    close(list(d.fields["team"].distribution.values()), _p(real, sch, team))
    assert worst < 1e-4
    assert isinstance(d.value.request, Refund if d.value.request.kind == "refund" else Bug)
