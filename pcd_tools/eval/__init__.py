"""Evaluation and calibration on labelled data: how right PCD is, and how sure it should be.

One idea per module:

- `datasets`: labelled datasets (built-in and a user's own files) and sampling;
- `metrics`: accuracy and calibration metrics for one field (pure numpy);
- `runner`: running PCD over many texts in batches;
- `scoring`: each method's metrics from its answers (`MethodReport`);
- `evaluate`: PCD against grammar-constrained generation (`evaluate`, `rescore`,
  `EvalReport`);
- `calibration`: fitting a `pcd_tools.answers.calibration.Calibration` on labelled data, with
  the fits in `fitting`, the arrays in `fit_data` and the default `auto` choice in `auto`;
- `shots`: few-shot examples drawn from the calibration split (`pcd eval --shots K`);
- `label_free`: the grid of shot counts × raw, contextual, PMI and fitted;
- `thresholds`: confidence thresholds for a target risk or coverage;
- `cascade`: small→large cascades measured from both models' results (sweep, gate
  signals, `fit_cascade` for a target), with the arrays in `cascade_data` and the fit in
  `cascade_fit`;
- `order_bias`: the order-flip rate, and averaging over listing orders;
- `plots`: reliability diagrams (matplotlib, imported when drawing);
- `report`: the console and markdown tables of reports and calibrations.

Importing this package is light: each name below loads its module on first use. The
functions `evaluate` and `order_bias` share their module's name, so import them from
their modules (`from pcd_tools.eval.evaluate import evaluate`); this keeps
`pcd_tools.eval.evaluate` the module wherever it is looked up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from .calibration import calibrate
    from .cascade import CascadeFit, ModelRun, cascade_report, fit_cascade
    from .datasets import Dataset, Split, from_file, load_dataset
    from .evaluate import EvalReport, rescore
    from .order_bias import OrderBiasReport, decide_orderings
    from .plots import reliability_diagram
    from .thresholds import ThresholdChoice, choose_threshold

__all__ = [
    "CascadeFit",
    "Dataset",
    "EvalReport",
    "ModelRun",
    "OrderBiasReport",
    "Split",
    "ThresholdChoice",
    "calibrate",
    "cascade_report",
    "choose_threshold",
    "decide_orderings",
    "fit_cascade",
    "from_file",
    "load_dataset",
    "reliability_diagram",
    "rescore",
]

_LAZY = {
    "Dataset": "datasets",
    "Split": "datasets",
    "from_file": "datasets",
    "load_dataset": "datasets",
    "EvalReport": "evaluate",
    "rescore": "evaluate",
    "calibrate": "calibration",
    "CascadeFit": "cascade",
    "ModelRun": "cascade",
    "cascade_report": "cascade",
    "fit_cascade": "cascade",
    "OrderBiasReport": "order_bias",
    "decide_orderings": "order_bias",
    "reliability_diagram": "plots",
    "ThresholdChoice": "thresholds",
    "choose_threshold": "thresholds",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__, globals())
