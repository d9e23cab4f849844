"""A batch job's checkpoint: the work folder beside the output, one Parquet file per chunk.

`decided.parquet` is built in `decided.parquet.pcd-batch/`:

- `job.json`: what the job is (input file, schema, model, options), written once;
- `part-<first row>-<rows>.parquet`: one per finished chunk. A chunk is written to a
  temporary file, flushed to disk and renamed into place; the rename is the commit, so a
  part is either complete or absent, and the parts present say which rows are done;
- `lock`: held (`flock`) while a process runs the job.

At the end the parts are concatenated into a temporary output, flushed, and renamed to
the output path; then the folder is removed. A job killed at any moment restarts from
the last part; a job killed after its output was renamed into place is complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BatchLockedError, CheckpointMismatchError, OutputExistsError
from .io import write_output

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["JOB_METADATA_KEY", "Checkpoint", "work_dir"]

JOB_METADATA_KEY = b"pcd_batch.job"
_PART = re.compile(r"^part-(\d{12})-(\d{9})\.parquet$")


def work_dir(output: str | os.PathLike[str]) -> Path:
    """The checkpoint folder of an output file: `<output>.pcd-batch` beside it."""
    out = Path(output)
    return out.with_name(out.name + ".pcd-batch")


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform can open a folder
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class Checkpoint:
    """The checkpoint of one job; use as a context manager (it holds the lock).

    Args:
        output: The output file.
        job: What identifies the job (JSON-serialisable); a checkpoint with another
            identity is refused.
        overwrite: Discard an existing output and checkpoint and start afresh.
    """

    def __init__(self, output: str | os.PathLike[str], job: dict[str, Any], *, overwrite: bool):
        self.output = Path(output)
        self.dir = work_dir(self.output)
        self.job = json.loads(json.dumps(job))  # as it reads back from job.json
        self.overwrite = overwrite
        self._lock: Any = None
        self.parts: list[tuple[int, int, Path]] = []
        self.complete = False

    # --- lock ---------------------------------------------------------------------------

    def __enter__(self) -> Checkpoint:
        self.dir.mkdir(parents=True, exist_ok=True)
        fh = (self.dir / "lock").open("a+")
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: no advisory lock
            self._lock = fh
            return self
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            fh.close()
            raise BatchLockedError(
                f"another process is writing {str(self.output)!r} (its checkpoint "
                f"{str(self.dir)!r} is locked). Wait for it, or stop it first."
            ) from e
        self._lock = fh
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        if self.dir.is_dir() and [p.name for p in self.dir.iterdir()] == ["lock"]:
            shutil.rmtree(self.dir, ignore_errors=True)  # nothing was checkpointed

    # --- opening ------------------------------------------------------------------------

    def open(self) -> int:
        """Checks the job against the checkpoint and returns the rows already done.

        Returns:
            The number of leading input rows whose chunks are committed.

        Raises:
            OutputExistsError: when the output exists but no checkpoint of this job does.
            CheckpointMismatchError: when the checkpoint belongs to another job.
        """
        job_file = self.dir / "job.json"
        for stale in self.dir.parent.glob(f"{self.dir.name}.done-*"):
            shutil.rmtree(stale, ignore_errors=True)  # a finished job killed while cleaning up
        if self.overwrite:
            self._clear()
            self.output.unlink(missing_ok=True)
        if not job_file.exists():
            if self.output.exists() and self._finished_output():
                self.complete = True
                return 0
            if self.output.exists():
                raise OutputExistsError(
                    f"output {str(self.output)!r} exists and has no checkpoint of this job: it "
                    "is a finished job's output or another file. Pass --overwrite "
                    "(overwrite=True) to decide again, or choose another output.",
                    path=str(self.output),
                )
            self._clear()
            _write_atomic(job_file, json.dumps(self.job, indent=1, sort_keys=True).encode())
        else:
            stored = json.loads(job_file.read_text(encoding="utf-8"))
            diff = [
                (k, stored.get(k), self.job.get(k))
                for k in sorted(set(stored) | set(self.job))
                if stored.get(k) != self.job.get(k)
            ]
            if diff:
                shown = "; ".join(f"{k}: {a!r} then, {b!r} now" for k, a, b in diff)
                raise CheckpointMismatchError(
                    f"the checkpoint in {str(self.dir)!r} belongs to another job ({shown}). "
                    "Run the same command to resume it, or pass --overwrite "
                    "(overwrite=True) to discard it and start afresh.",
                    differences=diff,
                )
        return self._scan()

    def _finished_output(self) -> bool:
        """Whether the output is a Parquet file this very job wrote."""
        try:
            import pyarrow.parquet as pq

            meta = pq.read_schema(self.output).metadata or {}
            return bool(json.loads(meta.get(JOB_METADATA_KEY, b"null")) == self.job)
        except Exception:  # not Parquet, or not ours
            return False

    def _clear(self) -> None:
        for p in self.dir.iterdir():
            if p.name != "lock":
                p.unlink()

    def _scan(self) -> int:
        """The committed parts; temporary files of an interrupted write are removed."""
        found: list[tuple[int, int, Path]] = []
        for p in self.dir.iterdir():
            m = _PART.match(p.name)
            if m:
                found.append((int(m.group(1)), int(m.group(2)), p))
            elif p.name.endswith(".tmp"):
                p.unlink()
        found.sort()
        done = 0
        for start, rows, path in found:
            if start != done:  # a gap: only the leading run of parts counts
                for _, _, later in found[found.index((start, rows, path)) :]:
                    later.unlink()
                break
            done += rows
        self.parts = [f for f in found if f[2].exists()]
        return done

    # --- committing ---------------------------------------------------------------------

    def commit(self, start: int, table: pa.Table) -> None:
        """Writes one chunk's rows and commits them (the rename is the commit).

        Args:
            start: The chunk's first input row.
            table: Its output rows.
        """
        import pyarrow.parquet as pq

        path = self.dir / f"part-{start:012d}-{table.num_rows:09d}.parquet"
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as fh:
            pq.write_table(table, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(self.dir)
        self.parts.append((start, table.num_rows, path))

    def finish(self, fmt: str) -> tuple[int, int]:
        """Writes the output from the parts, renames it into place, removes the folder.

        Args:
            fmt: The output format (`parquet`, `csv` or `jsonl`).

        Returns:
            Rows in the output, and how many have an error.
        """
        tmp = self.dir / ("output.tmp" + self.output.suffix)
        meta = {JOB_METADATA_KEY: json.dumps(self.job, sort_keys=True).encode()}
        rows, errors = write_output([p for _, _, p in sorted(self.parts)], tmp, fmt, meta)
        os.replace(tmp, self.output)
        _fsync_dir(self.output.parent)
        trash = self.dir.with_name(f"{self.dir.name}.done-{os.getpid()}")
        os.replace(self.dir, trash)  # atomic: the checkpoint is gone in one step
        shutil.rmtree(trash, ignore_errors=True)
        return rows, errors
