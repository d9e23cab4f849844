"""The README's "Scale out" Python block runs as written on the embedded model.

Two bends: it asks for 4 CPUs per actor, and the test's Ray instance has 2 CPUs in all,
so the block runs with `num_cpus_per_actor=1` (leaving a CPU for the read task); and its
`/data/` folder is a temporary one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, Field

import pcd_tools
from pcd_tools.batch import decision_column_names
from tests.batch.helpers import write_parquet

pytestmark = [pytest.mark.ray, pytest.mark.integration]

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
SECTION = README.split("<!-- scale:start -->")[1].split("<!-- scale:end -->")[0]


@pcd_tools.decision
class Triage(BaseModel):
    """Triage an inbound support ticket."""  # as in the README's quick start

    priority: Literal["P0_CRITICAL", "P1_HIGH", "P2_NORMAL", "P3_LOW"] = Field(
        description="Urgency tier based on customer business impact"
    )
    requires_escalation: bool = Field(description="Whether an on-call engineer must be notified")


def test_the_ray_data_block(ray_session, tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", SECTION, flags=re.S)
    assert len(blocks) == 1
    src = blocks[0].replace("num_cpus_per_actor=4", "num_cpus_per_actor=1")
    src = src.replace('"/data/', f'"{tmp_path}/')
    assert src.count(str(tmp_path)) == 2
    bodies = ["Checkout is down for all EU customers!", "Please add a dark mode.", ""]
    write_parquet(tmp_path / "tickets.parquet", {"id": [1, 2, 3], "body": bodies})
    exec(compile(src, "README.md (scale out)", "exec"), {"Triage": Triage, "__name__": "readme"})
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "decided")
    rows = sorted(table.to_pylist(), key=lambda r: r["id"])
    assert table.column_names == ["id", "body", *decision_column_names(Triage)]
    assert [r["id"] for r in rows] == [1, 2, 3]
    assert (
        rows[0]["error"] is None
        and rows[0]["priority"] in Triage.model_fields["priority"].annotation.__args__
    )
    assert "empty or only whitespace" in rows[2]["error"]
