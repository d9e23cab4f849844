"""A calibration records the compute mode it was fitted under (issue 52, item 1).

int8 and float32 scores of the same GGUF file differ (up to 0.02 in probability on the
1.5B, 0.29 on the 0.5B), so a calibration fitted under one mode is refused under another;
a file written before the field existed is accepted with one warning.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from pcd_tools.answers.calibration import Calibration, CalibrationMismatchError
from pcd_tools.eval.calibration import calibrate, calibration_from_scores
from tests.eval.helpers import SCHEMA, TEXTS
from tests.eval.helpers import toy_calibration as _cal


@pytest.mark.unit
def test_compute_is_saved_and_old_files_load_as_unknown(tmp_path):
    path = _cal(compute="int8").save(tmp_path / "cal.json")
    assert json.loads(path.read_text())["compute"] == "int8"
    assert Calibration.load(path).compute == "int8"
    raw = _cal().to_dict()
    raw.pop("compute")
    old = tmp_path / "old.json"
    old.write_text(json.dumps(raw))
    assert Calibration.load(old).compute is None


@pytest.mark.unit
def test_check_compute_names_both_modes_and_the_fix():
    cal = _cal(compute="int8")
    cal.check_compute("int8")
    with pytest.raises(CalibrationMismatchError, match=r"'int8'.*'float32'") as e:
        cal.check_compute("float32")
    assert "compute='int8'" in str(e.value) and "pcd calibrate" in str(e.value)


@pytest.mark.unit
def test_fitting_from_scores_records_the_compute_mode():
    z = np.array([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0], [0.0, 2.0, 1.0], [1.0, 0.0, 2.0]])
    g = np.array([2, 0, 1, 2])
    cal = calibration_from_scores(
        SCHEMA, {"mood": (z, g)}, model_id="m", compute="bf16", method="temperature"
    )
    assert cal.compute == "bf16"


@pytest.mark.engine
def test_a_decider_refuses_a_calibration_of_another_compute_mode(tiny, tmp_path):
    mode = tiny.loaded.compute
    other = "int8" if mode != "int8" else "float32"
    with pytest.raises(CalibrationMismatchError, match=f"'{other}'.*'{mode}'"):
        tiny.with_calibration(_cal(model_id=tiny.model_id, compute=other))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tiny.with_calibration(_cal(model_id=tiny.model_id, compute=mode))


@pytest.mark.engine
def test_an_old_file_without_compute_is_accepted_with_one_warning(tiny, tmp_path):
    raw = _cal(model_id=tiny.model_id).to_dict()
    raw.pop("compute")
    old = tmp_path / "old.json"
    old.write_text(json.dumps(raw))
    with pytest.warns(UserWarning, match="records no compute mode") as got:
        d = tiny.with_calibration(str(old))
    assert len(got) == 1 and str(old) in str(got[0].message)
    assert d.calibration is not None


@pytest.mark.engine
def test_calibrate_records_the_deciders_compute_mode(tiny):
    labels = [{"mood": "calm"}, {"mood": "angry"}, {"mood": "sad"}]
    cal = calibrate(SCHEMA, list(zip(TEXTS[:3], labels)), decider=tiny, method="temperature")
    assert cal.compute == tiny.loaded.compute
    tiny.with_calibration(cal)  # accepted by the decider it was fitted on
