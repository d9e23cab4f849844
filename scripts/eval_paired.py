"""Paired comparison of PCD and the baseline on one field of a saved `pcd eval --out` report.

Prints how many items only one method got right, an exact two-sided McNemar (sign) test
on those, and up to N examples of each kind. PCD's confidence is shown raw (softmax of the
stored log scores at T = 1), whatever calibration the report was made with. The
comparison itself is `pcd_tools.eval.report.paired_comparison`.

Usage: python scripts/eval_paired.py REPORT.json FIELD [N]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pcd_tools.eval.report import paired_comparison


def main(argv: list[str]) -> int:
    rep = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    field, n_ex = argv[1], int(argv[2]) if len(argv) > 2 else 3
    for line in paired_comparison(rep, field, n_ex):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
