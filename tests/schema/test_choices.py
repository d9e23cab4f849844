"""Choice limits: 1 to 255 candidates per field."""

from __future__ import annotations

import pytest

from pcd_tools import StructuredSchema
from pcd_tools.errors import TooManyChoicesError

pytestmark = pytest.mark.unit


def test_255_choices_accepted_256_refused():
    ok = StructuredSchema({"c": {"type": "enum", "choices": [f"c{i}" for i in range(255)]}})
    assert ok.schema.field("c").cardinality == 255
    with pytest.raises(TooManyChoicesError) as e:
        StructuredSchema({"c": {"type": "enum", "choices": [f"c{i}" for i in range(256)]}})
    msg = str(e.value)
    assert "StructuredSchema.c" in msg and "256 choices" in msg and "1 to 255" in msg


def test_too_many_choices_message_is_short_with_advice_before_examples():
    from typing import Literal

    from pydantic import BaseModel

    import pcd_tools

    values = tuple(f"CODE_{i:03d}" for i in range(300))

    class Billing(BaseModel):
        code: Literal[values]  # type: ignore[valid-type]

    with pytest.raises(TooManyChoicesError) as e:
        pcd_tools.decision(Billing)
    msg = str(e.value)
    assert len(msg) < 400, len(msg)
    assert "Billing.code" in msg
    assert "300 choices" in msg and "1 to 255" in msg
    # the count, the limit and the advice come first, then a few example values
    assert msg.index("300 choices") < msg.index("Split the field") < msg.index("'CODE_000'")
    assert "'CODE_004'" in msg and "'CODE_005'" not in msg
    assert "and 295 more" in msg
    assert e.value.model == "Billing" and e.value.field == "code"


def test_too_many_choices_examples_are_truncated():
    long = [f"{i}-" + "x" * 500 for i in range(256)]
    with pytest.raises(TooManyChoicesError) as e:
        StructuredSchema({"c": {"type": "enum", "choices": long}})
    assert len(str(e.value)) < 500
    assert "and 251 more" in str(e.value)
