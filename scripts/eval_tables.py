"""Prints EVAL.md's tables from the JSON files `pcd eval` and `pcd calibrate` wrote.

For each dataset it reads, from one folder:

- `eval_<dataset>.json`: `pcd eval --out` with the default (temperature) calibration;
- `eval_<dataset>_auto.json`: the same report recomputed under `--method auto`
  (`pcd eval --from-report eval_<dataset>.json --calibration cal_<dataset>_auto.json`);
- `cal_<dataset>.json` and `cal_<dataset>_auto.json`: the two calibrations.

The ECE floor (`pcd_tools.metrics.ece_floor`) is the ECE a perfectly calibrated predictor
with the same confidences would show on as many items.

Usage: python scripts/eval_tables.py RUNS_DIR banking77 clinc150 nlupp mams sst2 sms_spam
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _ms(m: dict[str, Any]) -> str:
    return f"{m['latency']['median_ms']:,.0f}"


def _trio(key: str, *ms: dict[str, Any] | None) -> str:
    """`key` of each method's field metrics, joined by " / " ("-" where a method is absent)."""
    return " / ".join(f"{m[key]:.3f}" if m else "-" for m in ms)


def _floor(m: dict[str, Any]) -> str:
    # reports written before metrics.ece_floor existed lack it; rescore them to add it
    return f"{m['ece_floor']:.3f}" if "ece_floor" in m else "-"


def main(argv: list[str]) -> int:
    runs, names = Path(argv[0]), argv[1:]
    head = (
        "| dataset | field | n | accuracy PCD / baseline / PCD auto-cal "
        "| macro-F1 PCD / baseline / auto | ECE PCD raw → T → auto "
        "| ECE floor raw / auto | ECE baseline | Brier PCD / auto / baseline | AURC PCD / auto / baseline "
        "| latency ms PCD / baseline |"
    )
    print(head)
    print("|" + "---|" * 11)
    for name in names:
        rep = _load(runs / f"eval_{name}.json")
        auto = _load(runs / f"eval_{name}_auto.json")
        cal_auto = _load(runs / f"cal_{name}_auto.json")
        m, a = rep["methods"], auto["methods"]
        first = True
        for field, f in m["pcd"]["fields"].items():
            t = m["pcd_calibrated"]["fields"][field]
            c = a["pcd_calibrated"]["fields"][field]
            b = m.get("baseline", {}).get("fields", {}).get(field)
            how = cal_auto["metrics"][field]["method"]
            tag = "T+b" if how == "temperature_bias" else "T"
            cells = [
                name if first else "",
                field,
                str(f["n"]),
                _trio("accuracy", f, b, c),
                _trio("macro_f1", f, b, c),
                f"{f['ece']:.3f} → {t['ece']:.3f} → {c['ece']:.3f} ({tag})",
                f"{_floor(f)} / {_floor(c)}",
                f"{b['ece']:.3f}" if b else "-",
                _trio("brier", f, c, b),
                _trio("aurc", f, c, b),
                f"{_ms(m['pcd'])} / {_ms(m['baseline'])}" if first and b else "",
            ]
            print("| " + " | ".join(cells) + " |")
            first = False
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
