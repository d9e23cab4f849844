"""The Ray Data block of docs/scale-out.md runs as written on the embedded model.

Two bends: it asks for 4 CPUs per actor, and the test's Ray instance has 2 CPUs in all,
so the block runs with `num_cpus_per_actor=1` (leaving a CPU for the read task); and its
`/data/` folder is a temporary one.
"""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, Field

import pcd_tools
from pcd_tools.batch import decision_column_names
from tests.batch.helpers import write_parquet
from tests.docs.blocks import fences, named_blocks

pytestmark = [pytest.mark.ray, pytest.mark.integration]


@pcd_tools.decision
class Triage(BaseModel):
    """Triage an inbound support ticket."""  # as in the README's quick start

    priority: Literal["P0_CRITICAL", "P1_HIGH", "P2_NORMAL", "P3_LOW"] = Field(
        description="Urgency tier based on customer business impact"
    )
    requires_escalation: bool = Field(description="Whether an on-call engineer must be notified")


def test_the_ray_data_block(ray_session, tmp_path):
    blocks = [b for b in named_blocks("docs/scale-out.md").values() if b.lang == "python"]
    assert [b.name for b in blocks] == ["ray-data"] and len(fences("docs/scale-out.md")) == 1
    src = blocks[0].src.replace("num_cpus_per_actor=4", "num_cpus_per_actor=1")
    src = src.replace('"/data/', f'"{tmp_path}/')
    assert src.count(str(tmp_path)) == 2
    bodies = ["Checkout is down for all EU customers!", "Please add a dark mode.", ""]
    write_parquet(tmp_path / "tickets.parquet", {"id": [1, 2, 3], "body": bodies})
    exec(
        compile(src, "docs/scale-out.md (ray-data)", "exec"),
        {"Triage": Triage, "__name__": "readme"},
    )
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
