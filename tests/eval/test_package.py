"""`pcd_tools.eval`: a small pinned surface, cheap to import."""

from __future__ import annotations

import subprocess
import sys

import pytest

import pcd_tools.eval

pytestmark = pytest.mark.unit

EXPECTED_ALL = [
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


def test_all_is_pinned():
    assert sorted(pcd_tools.eval.__all__) == sorted(EXPECTED_ALL)


def test_every_name_resolves_from_a_public_module():
    for name in pcd_tools.eval.__all__:
        obj = getattr(pcd_tools.eval, name)
        module = obj.__module__
        assert module.startswith("pcd_tools.eval."), (name, module)
        assert not any(part.startswith("_") for part in module.split(".")), (name, module)


def test_module_names_are_never_shadowed_by_functions():
    import pcd_tools.eval.evaluate
    import pcd_tools.eval.order_bias

    assert pcd_tools.eval.evaluate.__name__ == "pcd_tools.eval.evaluate"
    assert pcd_tools.eval.order_bias.__name__ == "pcd_tools.eval.order_bias"


def test_unknown_attribute_raises_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        pcd_tools.eval.nope  # noqa: B018


def test_import_is_light():
    code = (
        "import sys\n"
        "import pcd_tools.eval, pcd_tools.eval.evaluate, pcd_tools.eval.calibration\n"
        "import pcd_tools.eval.order_bias, pcd_tools.eval.plots, pcd_tools.eval.report\n"
        "heavy = [m for m in ('mlx', 'mlx.core', 'mlx_lm', 'matplotlib', 'langchain_core', "
        "'fastapi') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
