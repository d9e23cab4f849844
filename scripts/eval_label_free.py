"""Prints EVAL.md's label-free section from the grids `pcd eval --label-free-grid` wrote.

For each dataset it reads `grid_<dataset>.json` from one folder (`pcd eval --dataset D
--label-free-grid --out RUNS/grid_D.json`) and prints, in markdown:

- the summary over datasets: main-field accuracy per shot count and method, the best
  label-free setting against zero-shot raw PCD, the warm-latency ratio of the most shots
  to zero shots, and how often the fitted (`auto`) calibration meets
  ECE <= max(0.05, 1.5 x floor);
- then one table per dataset: shots x (raw, contextual, PMI, fitted) with accuracy,
  macro-F1, ECE (floor) and warm request latency, and the constrained-generation
  baseline given the same examples, beside PCD on the same items.

The tables are `pcd_tools.eval.report.label_free_markdown`.

Usage: python scripts/eval_label_free.py RUNS_DIR banking77 clinc150 nlupp mams sst2 sms_spam
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pcd_tools.eval.report import label_free_markdown


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    runs = Path(argv[0])
    grids = [json.loads((runs / f"grid_{name}.json").read_text()) for name in argv[1:]]
    for line in label_free_markdown(grids):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
