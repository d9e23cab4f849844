"""A user's own labelled data: a CSV, TSV, JSON or JSONL file and a schema for it."""

from __future__ import annotations

import csv
import importlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...schema import FieldSpec, StructuredSchema, compile_schema
from .base import DataNotFoundError, Dataset, DatasetError, Split

__all__ = ["from_file", "load_schema"]

_TRUE = {"1", "true", "yes", "y", "t"}
_FALSE = {"0", "false", "no", "n", "f"}


def load_schema(spec: str) -> Any:
    """A schema from `module:Class` or from a JSON file in the `StructuredSchema` dict form.

    Raises:
        DatasetError: naming what was given and the two accepted forms.
    """
    if spec.endswith(".json") or os.path.isfile(spec):
        try:
            obj = json.loads(Path(spec).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise DatasetError(f"cannot read schema file {spec!r}: {e}") from e
        if isinstance(obj, dict) and "fields" in obj:
            return StructuredSchema(
                obj["fields"],
                name=obj.get("name", "StructuredSchema"),
                instructions=obj.get("instructions", ""),
            )
        return StructuredSchema(obj)
    mod, sep, attr = spec.partition(":")
    if not sep or not mod or not attr:
        raise DatasetError(
            f"schema {spec!r} is neither a JSON file nor 'module:Class'; accepted: e.g. "
            "'myapp.schemas:Ticket' or 'ticket_schema.json'."
        )
    try:
        obj = importlib.import_module(mod)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise DatasetError(f"cannot import schema {spec!r}: {e}") from e
    return obj


def _coerce(spec: FieldSpec, raw: Any, where: str) -> Any:
    """A raw cell as the field's JSON label; `None` means unlabelled."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    if spec.kind == "boolean":
        if isinstance(raw, bool):
            return raw
        s = str(raw).strip().lower()
        if s in _TRUE | _FALSE:
            return s in _TRUE
        raise DatasetError(
            f"{where}: {raw!r} is not a boolean label for field {spec.name!r}; accepted: "
            f"{sorted(_TRUE)} or {sorted(_FALSE)}."
        )
    for c in spec.choices:
        if c.label == raw or str(c.label) == str(raw).strip():
            return c.label
    raise DatasetError(
        f"{where}: {raw!r} is not a choice of field {spec.name!r}; accepted: {spec.labels}."
    )


def _read_rows(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        with path.open(encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    if suffix == ".json":
        rows = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(rows, list):
            raise DatasetError(f"{path}: a .json data file must hold a list of objects.")
        return rows
    if suffix in (".csv", ".tsv"):
        with path.open(newline="", encoding="utf-8") as fh:
            return list(csv.DictReader(fh, delimiter="\t" if suffix == ".tsv" else ","))
    raise DatasetError(
        f"{path}: unknown data format {suffix!r}; accepted: .csv, .tsv, .jsonl, .json."
    )


def from_file(
    path: str | os.PathLike[str],
    schema: Any,
    *,
    text: str = "text",
    columns: Mapping[str, str] | None = None,
    name: str | None = None,
) -> Dataset:
    """A dataset from a user's CSV/TSV/JSONL file.

    Args:
        path: The data file.
        schema: A schema object, or a string for `load_schema` (`module:Class` or JSON).
        text: The column holding the text to decide on.
        columns: Field name -> column; fields not named map to a column of the same name.
        name: Dataset name (default: the file stem).

    Raises:
        DatasetError: for a missing column or a label that is not one of a field's choices.
    """
    p = Path(path)
    if not p.is_file():
        raise DataNotFoundError(f"data file {str(p)!r} does not exist.")
    sch = load_schema(schema) if isinstance(schema, str) else schema
    compiled = compile_schema(sch)
    cols = dict(columns or {})
    unknown = set(cols) - set(compiled.field_names)
    if unknown:
        raise DatasetError(
            f"column mapping names unknown field(s) {sorted(unknown)}; fields: {compiled.field_names}."
        )
    rows = _read_rows(p)
    if rows:
        have = set(rows[0])
        want = [text, *(cols.get(f.name, f.name) for f in compiled.fields)]
        missing = [c for c in want if c not in have]
        if text in missing or len(missing) == len(want) - 1:
            raise DatasetError(
                f"{p}: missing column(s) {missing}; the file has {sorted(have)}. Map fields to "
                "columns with --map field=column and name the text column with --text-column."
            )
    ex, strata = [], []
    for i, row in enumerate(rows):
        lab = {}
        for f in compiled.fields:
            v = _coerce(f, row.get(cols.get(f.name, f.name)), f"{p.name} row {i + 1}")
            if v is not None:
                lab[f.name] = v
        ex.append((str(row[text]), lab))
        strata.append(json.dumps(lab.get(compiled.fields[0].name)))
    split = Split("file", ex, [f"row:{i}" for i in range(len(ex))], strata)
    return Dataset(name or p.stem, sch, split, split, [str(p)])
