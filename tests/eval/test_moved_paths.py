"""The old import paths of the eval code still work for one release, with a warning.

`pcd_tools.evaluate`, `pcd_tools.metrics` and `pcd_tools.datasets` are deprecation shims
over `pcd_tools.eval`; the names that moved out of `pcd_tools.calibration` resolve
through its module `__getattr__`. Each yields the very object of its new home.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

import pcd_tools.calibration

pytestmark = pytest.mark.unit

# Every public name of the old modules -> the module it lives in now.
OLD_NAMES: dict[str, dict[str, str]] = {
    "pcd_tools.evaluate": {
        "Baseline": "pcd_tools.eval.evaluate",
        "EvalError": "pcd_tools.eval.evaluate",
        "EvalReport": "pcd_tools.eval.evaluate",
        "MethodReport": "pcd_tools.eval.scoring",
        "evaluate": "pcd_tools.eval.evaluate",
        "rescore": "pcd_tools.eval.evaluate",
        "run_pcd": "pcd_tools.eval.runner",
    },
    "pcd_tools.metrics": dict.fromkeys(
        (
            "ECE_BINS",
            "FieldMetrics",
            "accuracy",
            "aurc",
            "brier",
            "ece",
            "ece_floor",
            "field_metrics",
            "macro_f1",
            "nll",
            "reliability_bins",
            "risk_coverage",
        ),
        "pcd_tools.eval.metrics",
    ),
    "pcd_tools.datasets": {
        **dict.fromkeys(
            (
                "DataNotFoundError",
                "Dataset",
                "DatasetError",
                "Example",
                "Split",
                "label_index",
                "restrict_schema",
                "stratified_sample",
            ),
            "pcd_tools.eval.datasets.base",
        ),
        **dict.fromkeys(
            (
                "DATASETS",
                "MAMS_ASPECTS",
                "NLUPP_FLAGS",
                "MovieReviewSentence",
                "Polarity",
                "TextMessage",
                "banking77",
                "clinc150",
                "data_dir",
                "load_dataset",
                "mams",
                "nlupp",
                "sms_spam",
                "sst2",
            ),
            "pcd_tools.eval.datasets.builtin",
        ),
        "from_file": "pcd_tools.eval.datasets.files",
        "load_schema": "pcd_tools.eval.datasets.files",
    },
}

MOVED_FROM_CALIBRATION: dict[str, str] = {
    **dict.fromkeys(
        (
            "T_MIN",
            "T_MAX",
            "BIAS_PRIOR_SDS",
            "CV_FOLDS",
            "OBJECTIVES",
            "calibrate",
            "calibration_from_decisions",
            "calibration_from_scores",
            "fit_field",
            "fit_temperature",
            "fit_temperature_bias",
        ),
        "pcd_tools.eval.calibration",
    ),
    "ThresholdChoice": "pcd_tools.eval.thresholds",
    "choose_threshold": "pcd_tools.eval.thresholds",
    "reliability_diagram": "pcd_tools.eval.plots",
    "DESIGNS": "pcd_tools.eval.order_bias",
    "OrderBiasReport": "pcd_tools.eval.order_bias",
    "decide_orderings": "pcd_tools.eval.order_bias",
    "order_bias": "pcd_tools.eval.order_bias",
}

# What stays in the core module, under the same names.
KEPT_IN_CALIBRATION = (
    "FORMAT",
    "METHODS",
    "Calibration",
    "CalibrationError",
    "CalibrationMismatchError",
    "read_json",
)


def _import_quietly(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module(name)


@pytest.mark.parametrize("old", sorted(OLD_NAMES))
def test_an_old_module_warns_and_reexports_the_same_objects(old):
    mod = _import_quietly(old)
    new = old.replace("pcd_tools.", "pcd_tools.eval.")
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}; the old path goes"):
        mod = importlib.reload(mod)
    for name, home in OLD_NAMES[old].items():
        assert getattr(mod, name) is getattr(importlib.import_module(home), name), name
    # the new package exports the same objects too
    for name in mod.__all__:
        assert getattr(mod, name) is getattr(importlib.import_module(new), name), name


def test_importing_an_old_module_warns_in_a_fresh_interpreter():
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    import pcd_tools.evaluate, pcd_tools.metrics, pcd_tools.datasets\n"
        "for x in w:\n"
        "    print(x.category.__name__, x.message)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    for old in ("evaluate", "metrics", "datasets"):
        want = (
            f"DeprecationWarning pcd_tools.{old} moved to pcd_tools.eval.{old}; "
            "the old path goes in the next release"
        )
        assert want in lines


@pytest.mark.parametrize("name", sorted(MOVED_FROM_CALIBRATION))
def test_a_moved_calibration_name_warns_and_is_the_same_object(name):
    home = MOVED_FROM_CALIBRATION[name]
    with pytest.warns(
        DeprecationWarning,
        match=f"pcd_tools.calibration.{name} moved to {home}.{name}; the old path goes",
    ):
        obj = getattr(pcd_tools.calibration, name)
    assert obj is getattr(importlib.import_module(home), name)


def test_from_import_of_a_moved_name_warns():
    with pytest.warns(DeprecationWarning, match="moved to pcd_tools.eval.calibration.calibrate"):
        from pcd_tools.calibration import calibrate
    from pcd_tools.eval.calibration import calibrate as new

    assert calibrate is new


def test_the_core_names_stay_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in KEPT_IN_CALIBRATION:
            getattr(pcd_tools.calibration, name)
    from pcd_tools.eval.calibration import METHODS

    assert METHODS is pcd_tools.calibration.METHODS


@pytest.mark.parametrize(
    ("old", "name", "new"),
    [
        ("pcd_tools.calibration", "add_arguments", "pcd_tools.cli.calibrate"),
        ("pcd_tools.calibration", "run", "pcd_tools.cli.calibrate"),
        ("pcd_tools.evaluate", "add_arguments", "pcd_tools.cli.eval"),
        ("pcd_tools.evaluate", "run", "pcd_tools.cli.eval"),
        ("pcd_tools.datasets", "add_data_arguments", "pcd_tools.cli._data"),
        ("pcd_tools.datasets", "dataset_from_args", "pcd_tools.cli._data"),
    ],
)
def test_the_argument_parsing_moved_to_the_cli(old, name, new):
    mod = _import_quietly(old)
    with pytest.raises(AttributeError, match=f"{old}.{name} moved to {new}.{name}"):
        getattr(mod, name)
    assert callable(getattr(importlib.import_module(new), name))


@pytest.mark.parametrize("old", ["pcd_tools.calibration", *sorted(OLD_NAMES)])
def test_an_unknown_name_is_still_an_attribute_error(old):
    mod = _import_quietly(old)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        mod.nope  # noqa: B018
