"""Deprecated: moved to `pcd_tools.eval.datasets`; this path goes in the next release.

Every public name is re-exported from its new home (the same objects). The options that
choose a dataset (`add_data_arguments`, `dataset_from_args`) moved to `pcd_tools.cli`,
which the library does not import.
"""

from __future__ import annotations

import warnings
from typing import Any

from .eval.datasets import (
    DATASETS,
    DataNotFoundError,
    Dataset,
    DatasetError,
    Example,
    Split,
    data_dir,
    from_file,
    label_index,
    load_dataset,
    load_schema,
    restrict_schema,
    stratified_sample,
)

# Public without being in `__all__`, as before.
from .eval.datasets import MAMS_ASPECTS as MAMS_ASPECTS
from .eval.datasets import NLUPP_FLAGS as NLUPP_FLAGS
from .eval.datasets import MovieReviewSentence as MovieReviewSentence
from .eval.datasets import Polarity as Polarity
from .eval.datasets import TextMessage as TextMessage
from .eval.datasets import banking77 as banking77
from .eval.datasets import clinc150 as clinc150
from .eval.datasets import mams as mams
from .eval.datasets import nlupp as nlupp
from .eval.datasets import sms_spam as sms_spam
from .eval.datasets import sst2 as sst2

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

warnings.warn(
    "pcd_tools.datasets moved to pcd_tools.eval.datasets; the old path goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)

_CLI = ("add_data_arguments", "dataset_from_args")


def __getattr__(name: str) -> Any:
    if name in _CLI:
        raise AttributeError(
            f"pcd_tools.datasets.{name} moved to pcd_tools.cli._data.{name} (argument parsing "
            "lives in pcd_tools.cli); call pcd_tools.eval.datasets.load_dataset or from_file "
            "instead."
        )
    raise AttributeError(f"module 'pcd_tools.datasets' has no attribute {name!r}")
