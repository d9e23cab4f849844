"""Choice limits: 2 to 255 candidates per field."""

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
    assert "StructuredSchema.c" in msg and "256 choices" in msg and "2 to 255" in msg
