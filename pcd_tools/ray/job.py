"""`pcd batch --ray`: the resumable file job of `pcd_tools.batch`, decided on a Ray cluster.

The input file is read by this process, in chunks, and its rows go to the cluster through
the object store; `decide_dataset` decides them on the actor pool, and the decided rows
come back in input order (`preserve_order`), a chunk at a time, to be checkpointed and
written here exactly as the local job does. The output, its columns and its checkpoint
are the local job's, so a killed job run again resumes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pcd_tools.errors import BatchError
from pcd_tools.schema import compile_schema

from .data import (
    PROBLEM_COLUMN,
    ModelSource,
    check_model_source,
    decide_dataset,
    load_calibration,
    model_name,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from pcd_tools.batch.io import Chunk, InputFile
    from pcd_tools.batch.job import BatchProgress, BatchReport

__all__ = ["connect", "run_batch"]

# The columns of the dataset the job sends; user datasets never have them.
_ROW, _TEXT = "__pcd_row", "__pcd_text"


def connect(address: str | None) -> bool:
    """Connects to Ray unless this process already is.

    Args:
        address: `auto`: the running cluster (as `ray start` leaves it, or
            `RAY_ADDRESS`), else a new local one; `local`: a new local cluster; or a
            cluster address (`ray://host:10001`, `host:6379`).

    Returns:
        Whether a new local cluster was started (the caller then shuts it down).

    Raises:
        BatchError: when an explicit address cannot be reached.
    """
    import ray

    if ray.is_initialized():
        return False
    if address in (None, "local"):
        ray.init()
        return True
    try:
        ray.init(address=address)
        return False
    except ConnectionError as e:
        if address == "auto":  # no cluster running here: start one, as `ray.init()` would
            ray.init()
            return True
        raise BatchError(
            f"no Ray cluster at {address!r} ({e}). Start one with `ray start --head` and pass "
            "its address, or use `auto` or `local`."
        ) from e


def _input_table(chunk: Chunk) -> pa.Table:
    import pyarrow as pa

    from pcd_tools.batch.columns import row_problem

    texts = [t if isinstance(t, str) else None for t in chunk.texts]
    problems = [None if isinstance(t, str) else row_problem(t) for t in chunk.texts]
    rows = list(range(chunk.start, chunk.start + len(texts)))
    return pa.table(
        {
            _ROW: pa.array(rows, pa.int64()),
            _TEXT: pa.array(texts, pa.string()),
            PROBLEM_COLUMN: pa.array(problems, pa.string()),
        }
    )


def run_batch(
    schema: Any,
    input: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    model: ModelSource = None,
    calibration: Any = None,
    address: str | None = "auto",
    actors: int | tuple[int, int] | None = None,
    num_cpus_per_actor: float = 2.0,
    text_column: str = "text",
    id_column: str | None = None,
    temperature: float = 1.0,
    scoring: str = "auto",
    batch_size: int = 32,
    chunk_rows: int = 256,
    allow_empty: bool = False,
    overwrite: bool = False,
    on_progress: Callable[[BatchProgress], None] | None = None,
) -> BatchReport:
    """`pcd batch --ray`: the file job of `pcd_tools.batch.run_batch`, decided on Ray.

    The output and its checkpoint are those of the local job: one row per input row in
    input order, committed chunk by chunk, so a killed job run again resumes. The
    remaining input rows are read here and held in the object store while the job runs.

    Args:
        schema: Any accepted schema form (see `decide_dataset` for where its module
            comes from on the workers).
        input: A `.csv`, `.tsv`, `.jsonl` or `.parquet` file.
        output: A `.parquet`, `.csv` or `.jsonl` file.
        model: What each actor loads (see `decide_dataset`).
        calibration: A `Calibration` or its path.
        address: `auto`, `local` or a cluster address (see `connect`); unused when this
            process is already connected.
        actors: As for `decide_dataset`.
        num_cpus_per_actor: As for `decide_dataset`.
        text_column: As for `pcd_tools.batch.run_batch`.
        id_column: As for `pcd_tools.batch.run_batch`.
        temperature: Softmax temperature (> 0).
        scoring: `"auto"` (the default: a large field by certified pruned search, the
            others `"full"`), `"full"` or `"constrained"`.
        batch_size: Rows per actor call.
        chunk_rows: Rows per committed chunk.
        allow_empty: Decide on empty texts instead of failing them.
        overwrite: Discard an existing output and checkpoint.
        on_progress: Called with a `BatchProgress` at the start and after each chunk.

    Returns:
        A `BatchReport`.

    Raises:
        BatchError: when the cluster cannot be reached, or Ray returns rows out of order.
        InvalidArgumentError: as `pcd_tools.batch.run_batch`.
    """
    from pcd_tools.batch.columns import decision_column_names
    from pcd_tools.batch.io import Chunk, InputFile, output_format
    from pcd_tools.batch.job import calibration_identity, check_job_options, run_job

    check_job_options(temperature, scoring, batch_size, chunk_rows)
    check_model_source(model)
    compiled = compile_schema(schema)
    output_format(output)
    source = InputFile(input, text_column, id_column)
    cal = load_calibration(calibration)
    if cal is not None:
        cal.check_schema(compiled)
    connect(address)
    names = decision_column_names(compiled)
    options: dict[str, Any] = {
        "temperature": temperature,
        "scoring": scoring,
        "allow_empty": allow_empty,
    }

    def decide_chunks(
        src: InputFile, start: int, tick: Callable[[int], None]
    ) -> Iterator[tuple[Chunk, pa.Table]]:
        import ray
        import ray.data

        chunks: list[Chunk] = []
        refs: list[Any] = []
        for chunk in src.chunks(start, chunk_rows):
            refs.append(ray.put(_input_table(chunk)))
            chunks.append(Chunk(chunk.start, chunk.ids, []))
        if not chunks:
            return
        ds = decide_dataset(
            ray.data.from_arrow_refs(refs),
            compiled,
            text_column=_TEXT,
            model=model,
            calibration=cal,
            actors=actors,
            batch_size=batch_size,
            num_cpus_per_actor=num_cpus_per_actor,
            **options,
        )
        ds.context.execution_options.preserve_order = True
        batches: Iterator[Any] = iter(
            ds.iter_batches(batch_size=chunk_rows, batch_format="pyarrow")
        )
        for chunk in chunks:
            try:
                batch = next(batches, None)
            except Exception as e:  # a failure in the actors, or of the cluster
                raise BatchError(
                    f"the Ray job failed at row {chunk.start} ({type(e).__name__}: {e}). "
                    "The rows before it are checkpointed: run the same command to resume."
                ) from e
            first = batch.column(_ROW)[0].as_py() if batch is not None else None
            if batch is None or first != chunk.start or batch.num_rows != len(chunk.ids):
                got = "no rows" if batch is None else f"rows {first}.. ({batch.num_rows})"
                raise BatchError(
                    f"Ray returned {got} where rows {chunk.start}.. ({len(chunk.ids)}) were "
                    "due; the output is left as it was at the last checkpoint."
                )
            yield chunk, batch.select(names)

    job = {**options, "model": model_name(model), "calibration": calibration_identity(cal)}
    return run_job(
        compiled, source, output, decide_chunks, job, overwrite=overwrite, on_progress=on_progress
    )
