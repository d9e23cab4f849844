"""Paired comparison of PCD and the baseline on one field of a saved `pcd eval --out` report.

Prints how many items only one method got right, an exact two-sided McNemar (sign) test
on those, and up to N examples of each kind. PCD's confidence is shown raw (softmax of the
stored log scores at T = 1), whatever calibration the report was made with.

Usage: python scripts/eval_paired.py REPORT.json FIELD [N]
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def _sign_test(a: int, b: int) -> float:
    n, k = a + b, min(a, b)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def _raw_confidence(log_scores: list[float]) -> float:
    m = max(log_scores)
    return 1.0 / sum(math.exp(z - m) for z in log_scores)


def main(argv: list[str]) -> int:
    rep = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    field, n_ex = argv[1], int(argv[2]) if len(argv) > 2 else 3
    only_pcd, only_base, both, neither = [], [], 0, 0
    for it in rep["items"]:
        if field not in it["gold"]:
            continue
        gold = it["gold"][field]
        p, b = it["pcd"][field][0], it["baseline"][field][0]
        if p == gold and b == gold:
            both += 1
        elif p == gold:
            only_pcd.append(it)
        elif b == gold:
            only_base.append(it)
        else:
            neither += 1
    total = both + neither + len(only_pcd) + len(only_base)
    print(
        f"{field}: n={total}  both right {both}, neither {neither}, only PCD {len(only_pcd)}, "
        f"only baseline {len(only_base)}; exact McNemar p = "
        f"{_sign_test(len(only_pcd), len(only_base)):.3f}"
    )
    for title, rows in (("only the baseline right", only_base), ("only PCD right", only_pcd)):
        print(f"  {title}:")
        for it in rows[:n_ex]:
            p, b = it["pcd"][field], it["baseline"][field]
            conf = _raw_confidence(it["pcd_log_scores"][field])
            print(
                f"    {it['text'][:90]!r}  gold={it['gold'][field]!r}  "
                f"PCD={p[0]!r} ({conf:.2f})  baseline={b[0]!r} ({b[1]:.2f})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
