"""Resumable batch jobs over files: the library behind `pcd batch`.

```python
from pcd_tools import Decider
from pcd_tools.batch import run_batch

report = run_batch(Decider.load(), Ticket, "tickets.csv", "decided.parquet", text_column="body")
```

The output has one row per input row, in input order: the id column, then `<field>` and
`<field>__p` per field, `confidence` and `error` (layout: `pcd_tools.batch.columns`).
Chunks are checkpointed beside the output (`pcd_tools.batch.checkpoint`), so a killed
job run again continues where it stopped. `pcd_tools.ray` runs the same job, with the
same output, on a Ray cluster.

Modules: `columns` (the decision columns and deciding texts row by row), `io` (input
chunks, output files), `checkpoint` (the work folder) and `job` (the loop).
"""

from __future__ import annotations

from ..errors import (
    BatchError,
    BatchLockedError,
    CheckpointMismatchError,
    InputNotFoundError,
    OutputExistsError,
)
from .checkpoint import work_dir
from .columns import decide_texts, decision_column_names, decision_schema, decision_table
from .io import INPUT_FORMATS, OUTPUT_FORMATS
from .job import BatchProgress, BatchReport, run_batch

__all__ = [
    "INPUT_FORMATS",
    "OUTPUT_FORMATS",
    "BatchError",
    "BatchLockedError",
    "BatchProgress",
    "BatchReport",
    "CheckpointMismatchError",
    "InputNotFoundError",
    "OutputExistsError",
    "decide_texts",
    "decision_column_names",
    "decision_schema",
    "decision_table",
    "run_batch",
    "work_dir",
]
