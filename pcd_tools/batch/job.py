"""The resumable file job behind `pcd batch`: read in chunks, decide, checkpoint, assemble.

`run_batch` decides on this machine with a loaded `Decider`. `run_job` is the loop it
shares with `pcd_tools.ray.run_batch`, which decides the same chunks on a Ray cluster.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..decide.checks import SCORINGS
from ..errors import BatchError, InvalidArgumentError
from ..schema import Schema, compile_schema
from .checkpoint import Checkpoint
from .columns import check_column_clash, decide_texts, decision_table
from .io import Chunk, InputFile, output_format

if TYPE_CHECKING:
    import pyarrow as pa

    from ..decide.decider import Decider

__all__ = [
    "BatchProgress",
    "BatchReport",
    "DecideChunks",
    "calibration_identity",
    "check_job_options",
    "run_batch",
    "run_job",
]

DecideChunks = Callable[[InputFile, int, Callable[[int], None]], Iterator[tuple[Chunk, "pa.Table"]]]
"""`(source, first row, tick)`: decides the input from that row on and yields each chunk
with its decision columns, in order; `tick(n)` may report rows finished within a chunk."""


@dataclass(frozen=True)
class BatchProgress:
    """Where a running job stands (passed to `on_progress` after each chunk).

    Args:
        done: Input rows finished (skipped ones included).
        total: Input rows.
        skipped: Rows a previous run had already decided.
        errors: Rows that failed in this run's committed chunks.
        seconds: Wall time of this run so far.
        committed: Rows safe in the checkpoint (a kill now loses `done - committed`).
    """

    done: int
    total: int
    skipped: int
    errors: int
    seconds: float
    committed: int = 0

    @property
    def rows_per_s(self) -> float:
        """Rows decided per second in this run."""
        return (self.done - self.skipped) / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class BatchReport:
    """What a finished job did.

    Args:
        output: The output file.
        rows: Rows in the output (one per input row).
        decided: Rows this run wrote, decided or failed (the others were skipped).
        skipped: Rows a previous, interrupted run had already decided.
        errors: Output rows with an error (of every run).
        seconds: Wall time of this run.
        chunks: Chunks committed by this run.
    """

    output: str
    rows: int
    decided: int
    skipped: int
    errors: int
    seconds: float
    chunks: int

    @property
    def rows_per_s(self) -> float:
        """Rows decided per second by this run."""
        return self.decided / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable summary."""
        return {
            "output": self.output,
            "rows": self.rows,
            "decided": self.decided,
            "skipped": self.skipped,
            "errors": self.errors,
            "seconds": round(self.seconds, 3),
            "rows_per_s": round(self.rows_per_s, 3),
            "chunks": self.chunks,
        }


def check_job_options(temperature: Any, scoring: Any, batch_size: Any, chunk_rows: Any) -> None:
    """Refuses job options out of range before any model loads.

    Raises:
        InvalidArgumentError: naming the option, what it accepts and what it got.
    """
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise InvalidArgumentError(f"temperature must be a number > 0; got {temperature!r}.")
    if not (math.isfinite(temperature) and temperature > 0):
        raise InvalidArgumentError(f"temperature must be finite and > 0; got {temperature!r}.")
    if scoring not in SCORINGS:
        raise InvalidArgumentError(f"unknown scoring {scoring!r}; accepted: {list(SCORINGS)}.")
    for name, v in (("batch_size", batch_size), ("chunk_rows", chunk_rows)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InvalidArgumentError(f"{name} must be an int >= 1; got {v!r}.")


def calibration_identity(calibration: Any) -> str | None:
    """A short hash of what a calibration changes (its temperatures and biases), or None."""
    if calibration is None:
        return None
    blob = json.dumps(
        {"t": calibration.temperatures, "b": calibration.biases}, sort_keys=True, default=str
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def run_job(
    compiled: Schema,
    source: InputFile,
    output: str | os.PathLike[str],
    decide_chunks: DecideChunks,
    job: dict[str, Any],
    *,
    overwrite: bool = False,
    on_progress: Callable[[BatchProgress], None] | None = None,
) -> BatchReport:
    """The job loop: open the checkpoint, decide the rows left, commit chunks, assemble.

    Args:
        compiled: The schema.
        source: The input file.
        output: The output file.
        decide_chunks: Decides the input from a row on (see `DecideChunks`).
        job: The settings that identify the job in its checkpoint (the input file's
            identity and the columns are added here).
        overwrite: Discard an existing output and checkpoint.
        on_progress: Called when the job starts (its `skipped` says how many rows a
            previous run had done), as rows finish, and after each committed chunk.
    """
    fmt = output_format(output)
    out = Path(output)
    if out.resolve() == source.path.resolve():
        raise InvalidArgumentError(f"output {str(out)!r} is the input file; choose another path.")
    check_column_clash(compiled, [source.id_name], where="the id column")
    identity = {
        **job,
        "input": source.identity,
        "text_column": source.text_column,
        "id_column": source.id_name,
        "schema": compiled.fingerprint(),
    }
    t0 = time.perf_counter()
    total = source.total_rows
    with Checkpoint(out, identity, overwrite=overwrite) as ckpt:
        done = ckpt.open()
        if ckpt.complete:
            if on_progress is not None:
                on_progress(BatchProgress(total, total, total, 0, 0.0, total))
            return BatchReport(str(out), total, 0, total, _errors_in(out), 0.0, 0)
        skipped = done
        errors = chunks = 0
        running = [done]  # rows finished, committed or not

        def report() -> None:
            if on_progress is not None:
                seconds = time.perf_counter() - t0
                on_progress(BatchProgress(running[0], total, skipped, errors, seconds, done))

        def tick(n: int) -> None:
            running[0] += n
            report()

        report()
        for chunk, decided in decide_chunks(source, done, tick):
            if chunk.start != done:  # the checkpoint relies on chunks arriving in order
                raise BatchError(
                    f"the chunk starting at row {chunk.start} came where row {done} was due; "
                    "the checkpoint is left as it was."
                )
            table = _with_ids(source, chunk, decided)
            ckpt.commit(chunk.start, table)
            done += table.num_rows
            running[0] = done
            errors += table.num_rows - table.column("error").null_count
            chunks += 1
            report()
        if not ckpt.parts:  # an input without rows: still an output with every column
            ckpt.commit(0, _with_ids(source, Chunk(0, [], []), decision_table(compiled, [])))
        rows, all_errors = ckpt.finish(fmt)
    return BatchReport(
        str(out), rows, rows - skipped, skipped, all_errors, time.perf_counter() - t0, chunks
    )


def _errors_in(path: Path) -> int:
    import pyarrow.parquet as pq

    col = pq.read_table(path, columns=["error"]).column("error")
    return len(col) - col.null_count


def _with_ids(source: InputFile, chunk: Chunk, decided: pa.Table) -> pa.Table:
    import pyarrow as pa

    ids = pa.array(chunk.ids, type=source.id_type)
    return decided.add_column(0, pa.field(source.id_name, source.id_type), ids)


def run_batch(
    decider: Decider | Callable[[], Decider],
    schema: Any,
    input: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
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
    """Decides every row of a file and writes one output row per input row, resumably.

    The output has the id column, then the decision columns (`<field>`, `<field>__p`,
    `confidence`, `error`; see `pcd_tools.batch.columns`), in input order. A row that
    fails gets its reason in `error` and nulls elsewhere; the job goes on. Every
    `chunk_rows` rows are committed to a checkpoint beside the output, so a job killed
    at any moment and run again with the same arguments continues after the last
    committed chunk, without losing or repeating a row.

    Args:
        decider: The loaded decider (its calibration, if any, applies), or a callable
            that loads one, called once the options and the input file are checked.
        schema: Any accepted schema form.
        input: A `.csv`, `.tsv`, `.jsonl`/`.ndjson` or `.parquet` file.
        output: A `.parquet`, `.csv` or `.jsonl` file.
        text_column: The input column with the text.
        id_column: The input column that identifies a row; default `id` when the input
            has one, else the 0-based row number (written as `row`).
        temperature: Softmax temperature (> 0).
        scoring: `"auto"` (the default: a large field by certified pruned search, the
            others `"full"`), `"full"` or `"constrained"`.
        batch_size: Contexts per engine batch.
        chunk_rows: Rows per committed chunk (the most a kill can cost).
        allow_empty: Decide on empty or whitespace-only texts instead of failing them.
        overwrite: Discard an existing output and checkpoint and start afresh.
        on_progress: Called with a `BatchProgress` when the job starts (its `skipped`
            says how many rows a previous run had done), as rows finish, and after each
            committed chunk.

    Returns:
        A `BatchReport`.

    Raises:
        InvalidArgumentError: for a bad option, unknown file type or missing column.
        InputNotFoundError: when the input file does not exist.
        OutputExistsError: when the output exists and is not this job's.
        CheckpointMismatchError: when the checkpoint beside the output is another job's.
        BatchLockedError: when another process runs the same job.
        CalibrationError: when the decider's calibration does not fit the schema.
    """
    check_job_options(temperature, scoring, batch_size, chunk_rows)
    compiled = compile_schema(schema)
    output_format(output)
    source = InputFile(input, text_column, id_column)
    from ..decide.decider import Decider

    loaded = decider if isinstance(decider, Decider) else decider()
    if loaded.calibration is not None:
        loaded.calibration.check_schema(compiled)
    options: dict[str, Any] = {
        "temperature": temperature,
        "scoring": scoring,
        "allow_empty": allow_empty,
    }

    def decide_chunks(
        src: InputFile, start: int, tick: Callable[[int], None]
    ) -> Iterator[tuple[Chunk, pa.Table]]:
        for chunk in src.chunks(start, chunk_rows):
            outcomes = decide_texts(
                loaded, compiled, chunk.texts, batch_size=batch_size, on_rows=tick, **options
            )
            yield chunk, decision_table(compiled, outcomes)

    job = {
        **options,
        "model": loaded.model_id,
        "calibration": calibration_identity(loaded.calibration),
    }
    return run_job(
        compiled,
        source,
        output,
        decide_chunks,
        job,
        overwrite=overwrite,
        on_progress=on_progress,
    )
