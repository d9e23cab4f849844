"""The options that choose a labelled dataset, shared by `pcd eval` and `pcd calibrate`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..eval.datasets import Dataset


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the options that choose a dataset (built-in or a user's file).

    Args:
        parser: The sub-command's parser.
    """
    from ..eval.datasets import DATASETS

    g = parser.add_argument_group("data")
    g.add_argument("--dataset", choices=sorted(DATASETS), help="a built-in labelled dataset")
    g.add_argument("--data", default=None, help="your own CSV/TSV/JSONL file instead")
    g.add_argument(
        "--schema", default=None, help="for --data: 'module:Class' or a JSON schema file"
    )
    g.add_argument("--text-column", default="text", help="for --data: the text column")
    g.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="FIELD=COLUMN",
        help="for --data: read FIELD's label from COLUMN (repeatable)",
    )
    g.add_argument("--data-dir", default=None, help="labelled-data folder (default ../shared/data)")
    g.add_argument("--fields", default=None, help="comma-separated fields to score (default all)")


def dataset_from_args(args: argparse.Namespace) -> Dataset:
    """The dataset the options of `add_data_arguments` describe.

    Args:
        args: The parsed arguments.

    Raises:
        DatasetError: when neither or both of --dataset and --data are given, or when
            --data lacks --schema or a --map entry is malformed.
    """
    from ..eval.datasets import DATASETS, DatasetError, from_file, load_dataset

    fields = [f.strip() for f in args.fields.split(",") if f.strip()] if args.fields else None
    if bool(args.dataset) == bool(args.data):
        raise DatasetError(
            "give exactly one of --dataset NAME (one of "
            f"{sorted(DATASETS)}) or --data FILE --schema SPEC."
        )
    if args.dataset:
        return load_dataset(args.dataset, args.data_dir, fields=fields)
    if not args.schema:
        raise DatasetError("--data needs --schema 'module:Class' or a JSON schema file.")
    cols = {}
    for m in args.map:
        key, sep, col = m.partition("=")
        if not sep or not key or not col:
            raise DatasetError(f"--map takes FIELD=COLUMN; got {m!r}.")
        cols[key] = col
    ds = from_file(args.data, args.schema, text=args.text_column, columns=cols)
    return ds.restrict(fields) if fields else ds
