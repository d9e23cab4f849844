"""Each model's zero-shot accuracy, raw and under its fitted `auto` calibration, from the
saved runs of `scripts/cascade_runs.sh` (no model runs).

The items are split as `cascade_report` splits them (half calibration, half held-out,
seed 0); the calibration is fitted on the calibration half (offline, so without the
label-free candidates) and both figures are the held-out half's mean accuracy over the
schema's single-choice fields. EVAL.md's "label-free accuracy" rows for the 1.5B on the
multi-class sets come from here.

Usage: PCD_DATA_DIR=../shared/data python scripts/fitted_accuracy.py RUNS [SETS...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pcd_tools.answers.softmax import softmax
from pcd_tools.eval.cascade import ModelRun, fitted_calibration
from pcd_tools.eval.cascade import split_ids as split
from pcd_tools.eval.crossfit import run_arrays
from pcd_tools.eval.datasets import load_dataset
from pcd_tools.schema import compile_schema

MODELS = ("135m", "0.5b", "1.5b")


def accuracy(schema, run: ModelRun, calibration=None) -> float:
    accs = []
    for name, (z, g) in run_arrays(schema, run).items():
        if not len(g):
            continue
        p = (
            np.stack([calibration.probabilities(name, r) for r in z])
            if calibration is not None
            else softmax(z, 1.0)
        )
        accs.append(float((p.argmax(axis=1) == g).mean()))
    return float(np.mean(accs))


def main() -> None:
    runs = Path(sys.argv[1])
    sets = sys.argv[2:] or ["sst2", "sms_spam", "mams", "nlupp", "clinc150", "banking77"]
    print("| set | model | n cal / held-out | zero-shot raw | fitted `auto` (0 shots) |")
    print("|---|---|---|---|---|")
    for d in sets:
        schema = compile_schema(load_dataset(d).schema)
        for m in MODELS:
            f = runs / f"{d}_{m}.json"
            if not f.exists():
                continue
            run = ModelRun.from_report(json.loads(f.read_text()), where=str(f))
            cal_ids, test_ids = split(run.ids, 0.5, 0)
            cal = fitted_calibration(schema, run.subset(cal_ids))
            test = run.subset(test_ids)
            raw, fit = accuracy(schema, test), accuracy(schema, test, cal)
            print(f"| {d} | {m} | {len(cal_ids)} / {len(test_ids)} | {raw:.3f} | {fit:.3f} |")


if __name__ == "__main__":
    main()
