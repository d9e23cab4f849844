"""The `Calibration` a decider applies: its JSON file, its checks, and applying it.

Also: `pcd_tools.answers.calibration` is core. It imports without a warning and without
`pcd_tools.eval`, where fitting lives.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from pcd_tools.answers.calibration import Calibration, CalibrationError, CalibrationMismatchError
from pcd_tools.errors import PcdToolsError
from pcd_tools.schema import compile_schema
from tests.eval.helpers import SCHEMA, TEXTS
from tests.eval.helpers import toy_calibration as _cal


@pytest.mark.unit
def test_calibration_round_trip(tmp_path):
    cal = _cal()
    path = cal.save(tmp_path / "cal.json")
    assert cal.path == str(path)
    raw = json.loads(path.read_text())
    assert raw["format"] == "pcd-tools.calibration/1"
    assert raw["schema_fingerprint"] == compile_schema(SCHEMA).fingerprint()
    assert raw["fitted_on"]["ids"] == ["a", "b"]
    back = Calibration.load(path)
    assert back.temperatures == {"mood": 2.0} and back.path == str(path)
    assert back.temperature("mood") == 2.0
    assert back.temperature("urgent") == 1.0  # not fitted: unchanged


@pytest.mark.unit
def test_calibration_refuses_another_model_or_schema():
    cal = _cal()
    with pytest.raises(CalibrationMismatchError, match=r"tiny-llama-0.*other-model") as e:
        cal.check_model("other-model")
    assert isinstance(e.value, PcdToolsError) and isinstance(e.value, ValueError)
    cal.check_model("tiny-llama-0")
    cal.check_schema(SCHEMA)
    other = dict(SCHEMA, urgent={"type": "boolean", "description": "Whether to page someone"})
    fp = compile_schema(other).fingerprint()
    with pytest.raises(CalibrationMismatchError, match=f"{cal.schema_fingerprint}.*{fp}"):
        cal.check_schema(other)


@pytest.mark.unit
def test_calibration_load_errors(tmp_path):
    with pytest.raises(CalibrationError, match="cannot read"):
        Calibration.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CalibrationError, match="not JSON"):
        Calibration.load(bad)
    bad.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(CalibrationError, match="not a pcd-tools calibration"):
        Calibration.load(bad)
    raw = _cal(temperatures={"mood": -1}).to_dict()
    bad.write_text(json.dumps(raw))
    with pytest.raises(CalibrationError, match="> 0"):
        Calibration.load(bad)


@pytest.mark.engine
def test_a_fitted_bias_can_change_the_answer(tiny):
    # Warm the schema prefix first: both calls below then run the same graph (a cold and a
    # warm prefill differ in the last float32 bits, whatever ran before this test).
    tiny.decide(SCHEMA, TEXTS[0])
    raw = tiny.decide(SCHEMA, TEXTS[0])
    z = np.array(raw.fields["mood"].log_scores)
    loser = int(np.argmin(z))
    bias = [0.0, 0.0, 0.0]
    bias[loser] = float(z.max() - z.min() + 5.0)  # enough to overturn the raw ranking
    cal = Calibration(
        model_id=tiny.model_id,
        schema_name="x",
        schema_fingerprint=compile_schema(SCHEMA).fingerprint(),
        temperatures={"mood": 1.0},
        biases={"mood": bias},
        method="temperature_bias",
    )
    d = tiny.with_calibration(cal).decide(SCHEMA, TEXTS[0])
    assert d.calibrated
    assert d.fields["mood"].label == compile_schema(SCHEMA).fields[0].choices[loser].label
    assert d.fields["mood"].log_scores == raw.fields["mood"].log_scores  # raw scores kept
    assert d.fields["urgent"].distribution == pytest.approx(raw.fields["urgent"].distribution)


@pytest.mark.unit
def test_the_core_module_imports_without_a_warning_and_without_eval():
    code = (
        "import sys, warnings\n"
        "warnings.simplefilter('error')\n"
        "import pcd_tools.answers.calibration\n"
        "from pcd_tools.answers.calibration import FORMAT, Calibration, CalibrationError, read_json\n"
        "print(sorted(m for m in sys.modules if m.startswith('pcd_tools.eval')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
