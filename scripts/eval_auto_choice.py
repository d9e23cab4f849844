"""Prints EVAL.md's `calibration="auto"` tables from the label-free grids.

For each dataset it reads `grid_<dataset>.json` from one folder (`pcd eval --dataset D
--label-free-grid --out RUNS/grid_D.json`) and prints, per shot count above zero, the
main field's accuracy under raw, PMI and contextual calibration, and under `auto` (the
recipe `calibration="auto"` chose by leave-one-out over the shots, with each recipe's
leave-one-out accuracy and how long the leave-one-out took), and under the rule without
`MIN_GAIN` (any lead over raw, `min_gain=1`); then the mean over the datasets and the
lowest `auto - raw`.

The choice is recomputed from the stored leave-one-out accuracies with the current
`pcd_tools.decide.loo.pick`, and the script says where it differs from the one the grid
made (a grid run before a change of the rule).

Usage: python scripts/eval_auto_choice.py RUNS_DIR sst2 sms_spam mams nlupp clinc150 banking77
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pcd_tools.decide.loo import pick

_COL = {"none": "raw", "pmi": "pmi", "contextual": "contextual"}
_NAME = {"none": "raw", "pmi": "PMI", "contextual": "contextual"}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    runs, names = Path(argv[0]), argv[1:]
    grids = [json.loads((runs / f"grid_{d}.json").read_text()) for d in names]
    ks = sorted({r["shots"] for g in grids for r in g["rows"] if r["shots"]})
    print(
        "| set | shots | raw | PMI | contextual | auto | auto chose | any lead (chose) | "
        "LOO raw / PMI / contextual (answers) | LOO s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    sums: dict[int, dict[str, list[float]]] = {
        k: {m: [] for m in ("raw", "pmi", "contextual", "auto", "strict")} for k in ks
    }
    worst: dict[int, tuple[float, str]] = {}
    worst_strict: dict[int, tuple[float, str]] = {}
    notes = []
    for g in grids:
        main = g["main_field"]
        for row in g["rows"]:
            k = row["shots"]
            if not k:
                continue
            loo = row["auto"]
            chosen = pick(loo["accuracy"], loo["answers"])
            strict = pick(loo["accuracy"], loo["answers"], min_gain=1)
            if chosen != loo["method"]:
                notes.append(f"{g['dataset']} {k} shots: the grid chose {loo['method']}")
            acc = {m: row["fields"][m][main]["accuracy"] for m in ("raw", "pmi", "contextual")}
            acc["auto"] = acc[_COL[chosen]]
            acc["strict"] = acc[_COL[strict]]
            for m, v in acc.items():
                sums[k][m].append(v)
            d = acc["auto"] - acc["raw"]
            if k not in worst or d < worst[k][0]:
                worst[k] = (d, g["dataset"])
            d1 = acc["strict"] - acc["raw"]
            if k not in worst_strict or d1 < worst_strict[k][0]:
                worst_strict[k] = (d1, g["dataset"])
            la = loo["accuracy"]
            print(
                f"| {g['dataset']} | {k} | {acc['raw']:.3f} | {acc['pmi']:.3f} | "
                f"{acc['contextual']:.3f} | **{acc['auto']:.3f}** | {_NAME[chosen]} | "
                f"{acc['strict']:.3f} ({_NAME[strict]}) | "
                f"{la['none']:.3f} / {la['pmi']:.3f} / {la['contextual']:.3f} "
                f"({loo['answers']}) | {loo['loo_ms'] / 1e3:.0f} |"
            )
    for k in ks:
        mean = {m: sum(v) / len(v) for m, v in sums[k].items()}
        print(
            f"| **mean** | {k} | {mean['raw']:.3f} | {mean['pmi']:.3f} | "
            f"{mean['contextual']:.3f} | **{mean['auto']:.3f}** | | {mean['strict']:.3f} | | |"
        )
    print()
    for k in ks:
        d, name = worst[k]
        d1, name1 = worst_strict[k]
        print(
            f"- {k} shots: lowest auto - raw {100 * d:+.1f} points ({name}); with any lead "
            f"over raw (min_gain=1) {100 * d1:+.1f} ({name1})."
        )
    for n in notes:
        print(f"- {n}; the current rule chooses as the table says.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
