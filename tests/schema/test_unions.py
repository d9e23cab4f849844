"""Discriminated unions: a `kind` choice plus each branch's fields, tied to the branch."""

from __future__ import annotations

from typing import Annotated, Literal, Union

import pytest
from pydantic import BaseModel, Field

from pcd_tools.errors import UnsupportedUnionError
from pcd_tools.prompt import field_suffix, questions, render_system
from pcd_tools.schema import compile_schema

pytestmark = pytest.mark.unit


class Refund(BaseModel):
    kind: Literal["refund"]
    reason: Literal["late", "broken"]


class Bug(BaseModel):
    kind: Literal["bug"]
    reason: Literal["crash", "slow"]
    blocking: bool


class Request(BaseModel):
    """Read a request."""

    request: Annotated[Union[Refund, Bug], Field(discriminator="kind")]  # noqa: UP007
    urgent: bool


def test_a_union_compiles_to_its_kind_and_each_branchs_fields():
    s = compile_schema(Request)
    assert s.field_names == [
        "request.kind",
        "request[refund].reason",
        "request[bug].reason",
        "request[bug].blocking",
        "urgent",
    ]
    assert s.field("request.kind").labels == ["refund", "bug"]
    bug_reason = s.field("request[bug].reason")
    assert (bug_reason.branch, bug_reason.depends_on) == (("request.kind", 1), ("request.kind",))
    assert field_suffix(bug_reason) == '\n  "request.reason": '
    assert "(only when 'request.kind' is \"bug\")" in render_system(s)


def test_each_branch_field_is_asked_after_its_branch_value_in_the_first_pass():
    qs = questions(compile_schema(Request))
    assert [q.key for q in qs] == [
        "request.kind",
        "request[refund].reason|request.kind=0",
        "request[bug].reason|request.kind=1",
        "request[bug].blocking|request.kind=1",
        "urgent",
    ]
    assert qs[2].texts[0] == '\n  "request.kind": "bug",\n  "request.reason": "crash",'


def test_build_keeps_only_the_answered_branch():
    s = compile_schema(Request)
    values = {
        "request.kind": "refund",
        "request[refund].reason": "late",
        "request[bug].reason": "crash",
        "request[bug].blocking": True,
        "urgent": False,
    }
    assert s.build(values) == Request(request=Refund(kind="refund", reason="late"), urgent=False)
    values["request.kind"] = "bug"
    v = s.build(values)
    assert v.request == Bug(kind="bug", reason="crash", blocking=True)


def test_a_union_without_a_discriminator_is_refused():
    class NoDisc(BaseModel):
        request: Refund | Bug

    with pytest.raises(UnsupportedUnionError) as e:
        compile_schema(NoDisc)
    assert str(e.value).startswith(
        "NoDisc.request: Union[Refund, Bug] has no discriminator; accepted: "
        "Annotated[Union[A, B], Field(discriminator='kind')]"
    )
    assert (e.value.model, e.value.field) == ("NoDisc", "request")


def test_a_branch_with_an_unsupported_field_is_named():
    class Note(BaseModel):
        kind: Literal["note"]
        text: str

    class Mixed(BaseModel):
        request: Annotated[Refund | Note, Field(discriminator="kind")]

    with pytest.raises(UnsupportedUnionError) as e:
        compile_schema(Mixed)
    msg = str(e.value)
    assert msg.startswith(
        "Mixed.request: branch Note (kind='note') holds a field PCD cannot score:"
    )
    assert "Mixed.request[note].text is generated (string)" in msg
    assert "Accepted: branches whose fields are all scoreable" in msg
