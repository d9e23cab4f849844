"""Labelled datasets for evaluation and calibration, each with the schema a user would write.

Built-in adapters read the public sets under `shared/data/` (see its README): `banking77`,
`clinc150`, `nlupp`, `mams`, `sst2` and `sms_spam`. `from_file` adapts a user's own CSV,
TSV or JSONL file. Data is read in place and never copied.

An example is `(text, {field: label})` with JSON labels (`str`/`int` for enums, `bool` for
booleans). A field missing from an example's labels is not scored for that example (e.g.
CLINC-150's `intent` on out-of-scope queries).

Every dataset has an evaluation split and a calibration split. Where the source ships two
splits they are used (CLINC-150 test/val, MAMS test/val, NLU++ folds 0-9/10-19);
otherwise both come from one pool and the calibration sample excludes the evaluation
sample.

The package holds one idea per module:

- `base`: `Split`, `Dataset`, stratified sampling, `label_index` and the errors;
- `builtin`: the six built-in adapters, `DATASETS` and `load_dataset`;
- `files`: `from_file` and `load_schema`, for a user's own data.

The command-line options that choose a dataset live in `pcd_tools.cli`.
"""

from __future__ import annotations

from .base import (
    DataNotFoundError,
    Dataset,
    DatasetError,
    Example,
    Split,
    label_index,
    restrict_schema,
    stratified_sample,
)
from .builtin import DATASETS, data_dir, load_dataset
from .builtin import sst2 as sst2
from .files import from_file, load_schema

__all__ = [
    "DATASETS",
    "DataNotFoundError",
    "Dataset",
    "DatasetError",
    "Example",
    "Split",
    "data_dir",
    "from_file",
    "label_index",
    "load_dataset",
    "load_schema",
    "restrict_schema",
    "stratified_sample",
]
