"""Prints EVAL.md's tables from the JSON files `pcd eval` and `pcd calibrate` wrote.

For each dataset it reads, from one folder:

- `eval_<dataset>.json`: `pcd eval --out` with the default (temperature) calibration;
- `eval_<dataset>_auto.json`: the same report recomputed under `--method auto`
  (`pcd eval --from-report eval_<dataset>.json --calibration cal_<dataset>_auto.json`);
- `cal_<dataset>.json` and `cal_<dataset>_auto.json`: the two calibrations.

The ECE floor (`pcd_tools.eval.metrics.ece_floor`) is the ECE a perfectly calibrated
predictor with the same confidences would show on as many items. The table itself is
`pcd_tools.eval.report.eval_markdown_table`.

Usage: python scripts/eval_tables.py RUNS_DIR banking77 clinc150 nlupp mams sst2 sms_spam
"""

from __future__ import annotations

import sys

from pcd_tools.eval.report import eval_markdown_table


def main(argv: list[str]) -> int:
    for line in eval_markdown_table(argv[0], argv[1:]):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
