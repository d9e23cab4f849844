"""@decision: validation at decoration time and the added .decide()."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from pcd_tools import decision
from pcd_tools.errors import UnsupportedFieldError

pytestmark = pytest.mark.unit


def test_decorator_validates_at_decoration_time_and_adds_decide():
    with pytest.raises(UnsupportedFieldError) as e:

        @decision
        class Bad(BaseModel):
            ok: bool
            amount: complex = Field(description="money")

    msg = str(e.value)
    assert "Bad.amount" in msg and "complex" in msg and "accepted" in msg
    assert e.value.model == "Bad" and e.value.field == "amount"

    @decision
    class Good(BaseModel):
        ok: bool

    assert callable(Good.decide)
    assert Good.__pcd_schema__.field_names == ["ok"]
