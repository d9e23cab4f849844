"""Scale out on Ray (the `ray` extra: `pip install 'pcd-tools[ray]'`).

- `decide_dataset(ds, Schema, text_column=...)`: decide a Ray dataset on a pool of model
  actors (Ray Data `map_batches`, `ActorPoolStrategy`); it keeps the input columns and
  adds the decision columns of `pcd batch`.
- `run_batch(Schema, input, output, address=...)`: the resumable `pcd batch` file job,
  decided on a cluster (`pcd batch --ray`).
- `deployment(model=...)`: the `pcd serve` app as a Ray Serve deployment, batched across
  callers with `@serve.batch` (`pcd serve --ray`).

`ray` is imported inside the functions, so `import pcd_tools.ray` stays light. Every
actor and replica loads the model itself, once, with threads sized to its CPUs.

```python
import ray
from pcd_tools.ray import decide_dataset

ds = ray.data.read_parquet("s3://bucket/tickets/")
decide_dataset(ds, Ticket, text_column="body", actors=8).write_parquet("s3://bucket/decided/")
```
"""

from __future__ import annotations

from .data import DecideBatch, ModelSource, decide_dataset, size_threads
from .job import run_batch
from .serving import deployment, run_server

__all__ = [
    "DecideBatch",
    "ModelSource",
    "decide_dataset",
    "deployment",
    "run_batch",
    "run_server",
    "size_threads",
]
