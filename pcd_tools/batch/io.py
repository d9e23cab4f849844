"""Reading a batch job's input file in chunks, and writing its output file.

Inputs: CSV (`.csv`), TSV (`.tsv`), JSON Lines (`.jsonl`, `.ndjson`) and Parquet
(`.parquet`, `.pq`). Every format is read as a stream, so a file larger than memory is
fine, and a job can start at any row. Outputs: the same formats but TSV.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputNotFoundError, InvalidArgumentError
from .columns import ERROR, BadRow

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["INPUT_FORMATS", "OUTPUT_FORMATS", "Chunk", "InputFile", "output_format", "write_output"]

INPUT_FORMATS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
}
OUTPUT_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "jsonl"}
ROW_COLUMN = "row"
"""The id column's name when the input has no id column: the 0-based row number."""


def _format(path: Path, table: dict[str, str], what: str) -> str:
    fmt = table.get(path.suffix.lower())
    if fmt is None:
        raise InvalidArgumentError(
            f"{what} {str(path)!r}: unknown file type {path.suffix or '(none)'!r}; accepted: "
            f"{sorted(table)}."
        )
    return fmt


def output_format(path: str | os.PathLike[str]) -> str:
    """The output format named by the file's extension.

    Raises:
        InvalidArgumentError: for an extension that is not `.parquet`, `.csv` or `.jsonl`.
    """
    return _format(Path(path), OUTPUT_FORMATS, "output")


@dataclass(frozen=True)
class Chunk:
    """Consecutive input rows.

    Args:
        start: The 0-based number of the first row.
        ids: Each row's id (its row number when the input has no id column).
        texts: Each row's text: any value the file holds, or a `BadRow`.
    """

    start: int
    ids: list[Any]
    texts: list[Any]


def _csv_max_field() -> None:
    # The default limit (128 KiB) would fail long texts before the model could say so.
    limit = min(sys.maxsize, 2**31 - 1)
    if csv.field_size_limit() < limit:
        csv.field_size_limit(limit)


class InputFile:
    """One input file: its columns, row count, and chunks from any row on.

    Args:
        path: The file.
        text_column: The column with the text to decide on.
        id_column: The column that identifies a row; default `id` when the file has one,
            else the row number (written as the `row` column).

    Raises:
        InvalidArgumentError: for an unknown file type, or a missing text or id column
            (the message lists the columns the file has).
        InputNotFoundError: when the file does not exist.
    """

    def __init__(self, path: str | os.PathLike[str], text_column: str, id_column: str | None):
        self.path = Path(path)
        if not self.path.is_file():
            raise InputNotFoundError(f"input {str(self.path)!r}: no such file.")
        self.format = _format(self.path, INPUT_FORMATS, "input")
        self.text_column = text_column
        columns, self.total_rows, id_types = self._scan(id_column or "id")
        self.columns = columns
        if text_column not in columns:
            raise InvalidArgumentError(
                f"input {str(self.path)!r} has no text column {text_column!r}; its columns: "
                f"{columns}. Pass --text-column NAME."
            )
        if id_column is not None and id_column not in columns:
            raise InvalidArgumentError(
                f"input {str(self.path)!r} has no id column {id_column!r}; its columns: "
                f"{columns}. Leave --id-column out to number the rows."
            )
        self.id_source = id_column or ("id" if "id" in columns else None)
        self.id_name = self.id_source or ROW_COLUMN
        self.id_type = self._id_type(id_types)
        self.identity = {
            "path": str(self.path.resolve()),
            "bytes": self.path.stat().st_size,
            "mtime_ns": self.path.stat().st_mtime_ns,
        }

    # --- scanning ---------------------------------------------------------------------

    def _scan(self, id_name: str) -> tuple[list[str], int, set[str]]:
        """Columns, row count and (JSON Lines) the types the id column holds."""
        if self.format == "parquet":
            import pyarrow.parquet as pq

            meta = pq.ParquetFile(self.path)
            return list(meta.schema_arrow.names), meta.metadata.num_rows, set()
        if self.format in ("csv", "tsv"):
            _csv_max_field()
            with self._open_text() as fh:
                reader = csv.reader(fh, dialect=self._dialect())
                header = next(reader, [])
                return header, sum(1 for rec in reader if rec), set()  # as DictReader
        columns: dict[str, None] = {}
        types: set[str] = set()
        n = 0
        with self.path.open("rb") as fh:
            for raw in fh:
                if not raw.strip():
                    continue
                n += 1
                try:
                    obj = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    columns.update(dict.fromkeys(obj))
                    v = obj.get(id_name)
                    if v is not None:
                        int_like = isinstance(v, int) and not isinstance(v, bool)
                        types.add("int" if int_like else "other")
        return list(columns), n, types

    def _id_type(self, id_types: set[str]) -> pa.DataType:
        import pyarrow as pa

        if self.id_source is None:
            return pa.int64()
        if self.format == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(self.path).schema_arrow.field(self.id_source).type
        if self.format == "jsonl" and id_types == {"int"}:
            return pa.int64()
        return pa.string()

    def _dialect(self) -> type[csv.Dialect]:
        return csv.excel_tab if self.format == "tsv" else csv.excel

    def _open_text(self) -> Any:
        return self.path.open(encoding="utf-8-sig", newline="")

    # --- reading ----------------------------------------------------------------------

    def chunks(self, start: int, size: int) -> Iterator[Chunk]:
        """The rows from `start` on, `size` at a time (the last chunk may be shorter).

        Args:
            start: The first row to read (0-based); the rows before it are skipped.
            size: Rows per chunk.
        """
        rows = self._rows(start)
        ids: list[Any] = []
        texts: list[Any] = []
        first = start
        for i, (rid, text) in enumerate(rows, start):
            ids.append(i if self.id_source is None else self._id(rid))
            texts.append(text)
            if len(texts) == size:
                yield Chunk(first, ids, texts)
                first, ids, texts = i + 1, [], []
        if texts:
            yield Chunk(first, ids, texts)

    def _id(self, value: Any) -> Any:
        if value is None or self.format == "parquet":
            return value
        if self.format == "jsonl" and str(self.id_type) == "int64":
            return value
        if isinstance(value, str):
            return value
        return json.dumps(value, ensure_ascii=False)

    def _rows(self, start: int) -> Iterator[tuple[Any, Any]]:
        """`(id, text)` per row from row `start` on."""
        idc, tc = self.id_source, self.text_column
        if self.format == "parquet":
            yield from self._parquet_rows(start)
        elif self.format in ("csv", "tsv"):
            with self._open_text() as fh:
                reader = csv.DictReader(fh, dialect=self._dialect())
                for n, rec in enumerate(reader):
                    if n >= start:
                        yield (rec.get(idc) if idc else None), rec.get(tc)
        else:
            n = 0
            with self.path.open("rb") as fh:
                for line_no, raw in enumerate(fh, 1):
                    if not raw.strip():
                        continue
                    n += 1
                    if n <= start:
                        continue
                    yield self._json_row(raw, line_no)

    def _json_row(self, raw: bytes, line_no: int) -> tuple[Any, Any]:
        try:
            obj = json.loads(raw)
        except ValueError as e:
            return None, BadRow(f"InvalidContextError: line {line_no} is not valid JSON ({e}).")
        if not isinstance(obj, dict):
            return None, BadRow(
                f"InvalidContextError: line {line_no} is a JSON {type(obj).__name__}, "
                "not an object."
            )
        return (obj.get(self.id_source) if self.id_source else None), obj.get(self.text_column)

    def _parquet_rows(self, start: int) -> Iterator[tuple[Any, Any]]:
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(self.path)
        cols = [self.text_column] + ([self.id_source] if self.id_source else [])
        groups: list[int] = []
        skip = start
        for g in range(pf.num_row_groups):  # skip whole row groups without reading them
            n = pf.metadata.row_group(g).num_rows
            if skip >= n and not groups:
                skip -= n
                continue
            groups.append(g)
        if not groups:
            return
        for batch in pf.iter_batches(batch_size=4096, row_groups=groups, columns=cols):
            if skip:
                cut = min(skip, batch.num_rows)
                batch, skip = batch.slice(cut), skip - cut
            texts = batch.column(self.text_column).to_pylist()
            ids = (
                batch.column(self.id_source).to_pylist() if self.id_source else [None] * len(texts)
            )
            yield from zip(ids, texts)


def write_output(
    parts: list[Path], path: Path, fmt: str, metadata: dict[bytes, bytes] | None = None
) -> tuple[int, int]:
    """Concatenates the Parquet `parts`, in order, into `path` in format `fmt`.

    Args:
        parts: The chunk files.
        path: Where to write (the caller renames it into place).
        fmt: `parquet`, `csv` or `jsonl`.
        metadata: Key-value metadata for a Parquet output's schema.

    Returns:
        Rows written, and how many of them have an error.
    """
    import pyarrow.parquet as pq

    rows = errors = 0
    writer: Any = None
    with path.open("wb") as sink:
        try:
            for part in parts:
                table = pq.read_table(part)
                rows += table.num_rows
                errors += table.num_rows - table.column(ERROR).null_count
                writer = _write(table, sink, fmt, writer, metadata=metadata)
            if writer is None:  # no rows at all: still a valid, empty file
                writer = _write(None, sink, fmt, writer, _schema_of(parts), metadata)
        finally:
            if writer is not None and fmt != "jsonl":
                writer.close()
        sink.flush()
        os.fsync(sink.fileno())
    return rows, errors


def _schema_of(parts: list[Path]) -> pa.Schema | None:
    import pyarrow.parquet as pq

    return pq.read_schema(parts[0]) if parts else None


def _write(
    table: pa.Table | None,
    sink: Any,
    fmt: str,
    writer: Any,
    schema: pa.Schema | None = None,
    metadata: dict[bytes, bytes] | None = None,
) -> Any:
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    if fmt == "jsonl":
        for rec in table.to_pylist() if table is not None else []:
            sink.write(json.dumps(rec, ensure_ascii=False, default=str).encode() + b"\n")
        return True
    if writer is None:
        schema = table.schema if table is not None else schema
        if schema is None:
            return None
        if fmt == "parquet":
            meta = {**(schema.metadata or {}), **(metadata or {})}
            writer = pq.ParquetWriter(sink, schema.with_metadata(meta))
        else:
            writer = pacsv.CSVWriter(sink, schema)
    if table is not None:
        writer.write_table(table)
    return writer
