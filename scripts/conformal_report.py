"""EVAL.md "Prediction sets": held-out coverage of split conformal sets on the shared sets.

After `scripts/conformal_runs.sh R` (the model runs: calibration scores on 300 items kept
apart from the evaluation sample, and a PCD-only `pcd eval` on 300 items), this refits each
set's calibration from its saved scores (`pcd calibrate --from-scores`, which stores the
conformal scores) and rescores the saved report with it (`pcd eval --from-report
--calibration`), then prints the table: per set and field, the held-out coverage and mean
set size at 0.8, 0.9 and 0.95. A second table compares the score the library uses (LAC,
`1 - p(true)`) with APS (Romano et al. 2020, non-randomised: the probability mass ranked
at or above the true answer), both on the same calibrated probabilities.

    PCD_DATA_DIR=../shared/data python scripts/conformal_report.py /tmp/conformal_runs \
        [--folds K] [sst2 ...]

`--folds K` fits the conformal scores cross-fitted (`pcd calibrate --conformal-folds K`).

The last table is what chance alone gives an exact method at n = 300 / 300.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

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


def _aps(p_cal: np.ndarray, g_cal: np.ndarray, p_eval: np.ndarray, g_eval: np.ndarray, c: float):
    """Coverage and mean size of non-randomised APS sets, the most probable answer kept."""

    def mass_to(p: np.ndarray, g: int) -> float:
        return float(p[p > p[g]].sum() + p[g])  # ties: the true answer ranks first

    s = np.sort([mass_to(p, g) for p, g in zip(p_cal, g_cal)])
    q = s[math.ceil((len(s) + 1) * c - 1e-9) - 1]
    hits, sizes = [], []
    for p, g in zip(p_eval, g_eval):
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        k = max(1, int(np.searchsorted(cum, q - 1e-9)) + 1)  # smallest prefix reaching q
        hits.append(g in order[:k])
        sizes.append(k)
    return float(np.mean(hits)), float(np.mean(sizes))


def _compare(runs: Path, d: str, cal_path: Path) -> list[list[str]]:
    from pcd_tools.answers.calibration import Calibration
    from pcd_tools.answers.conformal import ConformalScores, prediction_set_indices
    from pcd_tools.eval.datasets import label_index, load_dataset
    from pcd_tools.schema import compile_schema

    cal = Calibration.load(cal_path)
    scores = json.loads((runs / f"scores_{d}.json").read_text())["fields"]
    items = json.loads((runs / f"eval_{d}.json").read_text())["items"]
    compiled = compile_schema(load_dataset(d).schema)
    rows = []
    for field in cal.conformal:
        p_cal = cal.probabilities(field, np.asarray(scores[field]["log_scores"]))
        g_cal = np.asarray(scores[field]["gold"])
        kept = [it for it in items if field in it["gold"]]
        p_ev = cal.probabilities(field, np.asarray([it["pcd_log_scores"][field] for it in kept]))
        g_ev = np.asarray([label_index(compiled.field(field), it["gold"][field]) for it in kept])
        cells = []
        for t in TARGETS:
            c = float(t)
            lac = ConformalScores(field, tuple(cal.conformal[field]["scores"]))
            q = lac.quantile(c)
            sets = [prediction_set_indices(p, q) for p in p_ev]
            lac_cov = float(np.mean([g in s for g, s in zip(g_ev, sets)]))
            lac_size = float(np.mean([len(s) for s in sets]))
            aps_cov, aps_size = _aps(p_cal, g_cal, p_ev, g_ev, c)
            cells += [f"{lac_cov:.3f} / {lac_size:.2f}", f"{aps_cov:.3f} / {aps_size:.2f}"]
        rows.append([d, field, *cells])
    return rows


def chance(n_cal: int = 300, n_eval: int = 300, draws: int = 20000) -> list[str]:
    """How far an exact split-conformal method's held-out coverage strays by chance alone:
    continuous exchangeable scores, `n_cal` calibration and `n_eval` evaluation items."""
    rng = np.random.default_rng(0)
    out = []
    for t in TARGETS:
        c = float(t)
        k = math.ceil((n_cal + 1) * c - 1e-9)
        q = np.sort(rng.random((draws, n_cal)), axis=1)[:, k - 1]
        cov = (rng.random((draws, n_eval)) <= q[:, None]).mean(axis=1)
        out.append(
            f"| {t} | {cov.mean():.3f} | {cov.std():.3f} | {(np.abs(cov - c) > 0.03).mean():.2f} |"
        )
    return out


def main() -> int:
    runs = Path(sys.argv[1])
    rest = sys.argv[2:]
    folds: list[str] = []
    if rest[:1] == ["--folds"]:
        folds, rest = ["--conformal-folds", rest[1]], rest[2:]
    sets = rest or SETS
    within: dict[str, list[int]] = {}
    rows, compare = [], []
    for d in sets:
        if not (runs / f"eval_{d}.json").exists():
            print(f"{d}: no run in {runs}", file=sys.stderr)
            continue
        cal = runs / f"calc_{d}.json"
        pcd("calibrate", "--dataset", d, "--from-scores", str(runs / f"scores_{d}.json"),
            "--out", str(cal), *folds)  # fmt: skip
        rep = pcd("eval", "--dataset", d, "--from-report", str(runs / f"eval_{d}.json"),
                  "--calibration", str(cal))  # fmt: skip
        compare += _compare(runs, d, cal)
        first = json.loads((runs / f"eval_{d}.json").read_text())["items"][0]
        for field, per in rep["prediction_sets"].items():
            k = len(first["pcd_log_scores"][field])
            acc = rep["methods"]["pcd_calibrated"]["fields"][field]["accuracy"]
            cells = []
            for t in TARGETS:
                r = per[t]
                miss = abs(r["coverage"] - float(t)) > 0.03
                within.setdefault(d, [0, 0])[0] += not miss
                within[d][1] += 1
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
    head = ["set", "field"]
    for t in TARGETS:
        head += [f"set @{t} (cov / size)", f"APS @{t} (cov / size)"]
    print()
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in compare:
        print("| " + " | ".join(r) + " |")
    print()
    print("| set | cells within 3 points |")
    print("|---|---|")
    for d, (ok, n) in within.items():
        print(f"| {d} | {ok} of {n} |")
    print()
    print("| target | mean coverage | sd | P(off by > 3 points) |")
    print("|---|---|---|---|")
    print("\n".join(chance()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
