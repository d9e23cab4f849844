"""EVAL.md "Prediction sets": held-out coverage of split conformal sets on the shared sets.

After `scripts/conformal_runs.sh R` (the model runs: calibration scores on 300 items kept
apart from the evaluation sample, and a PCD-only `pcd eval` on 300 items), this refits each
set's calibration from its saved scores (`pcd calibrate --from-scores`, which stores the
conformal scores) and rescores the saved report with it (`pcd eval --from-report
--calibration`), then prints the table: per set and field, the held-out coverage and mean
set size at 0.8, 0.9 and 0.95.

    python scripts/conformal_report.py /tmp/conformal_runs [sst2 sms_spam ...]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SETS = ["banking77", "clinc150", "nlupp", "mams", "sst2", "sms_spam"]
TARGETS = ("0.8", "0.9", "0.95")


def pcd(*args: str) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pcd_tools.cli import main; sys.exit(main())",
            *args,
            "--json",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout)


def main() -> int:
    runs = Path(sys.argv[1])
    sets = sys.argv[2:] or SETS
    rows = []
    for d in sets:
        if not (runs / f"eval_{d}.json").exists():
            print(f"{d}: no run in {runs}", file=sys.stderr)
            continue
        cal = runs / f"calc_{d}.json"
        pcd("calibrate", "--dataset", d, "--from-scores", str(runs / f"scores_{d}.json"),
            "--out", str(cal))  # fmt: skip
        rep = pcd("eval", "--dataset", d, "--from-report", str(runs / f"eval_{d}.json"),
                  "--calibration", str(cal))  # fmt: skip
        first = json.loads((runs / f"eval_{d}.json").read_text())["items"][0]
        for field, per in rep["prediction_sets"].items():
            k = len(first["pcd_log_scores"][field])
            acc = rep["methods"]["pcd_calibrated"]["fields"][field]["accuracy"]
            cells = []
            for t in TARGETS:
                r = per[t]
                miss = abs(r["coverage"] - float(t)) > 0.03
                cov = f"{r['coverage']:.3f}" + (" **miss**" if miss else "")
                cells += [cov, f"{r['mean_size']:.2f}", f"{r['lac_coverage']:.3f}"]
            rows.append([d, field, str(k), str(per[TARGETS[0]]["n"]),
                         str(per[TARGETS[0]]["n_cal"]), f"{acc:.3f}", *cells])  # fmt: skip
    head = ["set", "field", "K", "n eval", "n cal", "top-1 acc"]
    for t in TARGETS:
        head += [f"cov @{t}", f"size @{t}", f"LAC cov @{t}"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
