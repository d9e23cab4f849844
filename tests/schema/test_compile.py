"""compile_schema: objects that are no schema form are refused."""

from __future__ import annotations

import pytest

from pcd_tools import SchemaError
from pcd_tools.schema import compile_schema

pytestmark = pytest.mark.unit


def test_compile_schema_rejects_other_objects():
    with pytest.raises(SchemaError, match="accepted: a Pydantic BaseModel subclass"):
        compile_schema(42)
