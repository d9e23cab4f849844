"""EVAL.md "Cascades" tables from the runs of `scripts/cascade_runs.sh`.

For each set and each (small, large) pair of models with saved `pcd eval --out` reports in
the runs folder, `pcd_tools.eval.cascade.cascade_report` splits the items into a
calibration half and a held-out half (seed 0) and reports; this prints the markdown tables
and writes each report as `cascade_<set>_<small>_<large>.json` in the runs folder.

The last table is the mean over the sets given, per pair and fit (a set counts once).

Usage: PCD_DATA_DIR=../shared/data python scripts/cascade_report.py RUNS [SETS...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pcd_tools.eval.cascade import ModelRun, cascade_report
from pcd_tools.eval.datasets import load_dataset

PAIRS = [("135m", "1.5b"), ("0.5b", "1.5b"), ("135m", "0.5b")]


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def main() -> None:
    runs = Path(sys.argv[1])
    sets = sys.argv[2:] or ["sst2", "sms_spam", "mams", "nlupp", "clinc150", "banking77"]
    fits, gates, seps = [], [], []
    means: dict[tuple[str, str], list[list[float]]] = {}  # (pair, target) -> rows per set
    for d in sets:
        ds = load_dataset(d)
        for s, lg in PAIRS:
            fs, fl = runs / f"{d}_{s}.json", runs / f"{d}_{lg}.json"
            if not (fs.exists() and fl.exists()):
                continue
            ctx = runs / f"{d}_{s}-contextual.json"
            rep = cascade_report(
                ds.schema,
                ModelRun.from_report(json.loads(fs.read_text()), where=str(fs)),
                ModelRun.from_report(json.loads(fl.read_text()), where=str(fl)),
                contextual=(
                    ModelRun.from_report(json.loads(ctx.read_text()), where=str(ctx))
                    if ctx.exists()
                    else None
                ),
                dataset=d,
            )
            (runs / f"cascade_{d}_{s}_{lg}.json").write_text(json.dumps(rep, indent=1) + "\n")
            so = rep["small_only"]
            keys = [
                "max_escalation/raw/probability",
                "max_accuracy_loss/raw/probability",
                "max_accuracy_loss/raw/probability/bound",
            ]
            if rep["best_gate"] != "raw/probability":
                keys += ["max_escalation/best", "max_accuracy_loss/best"]
            keys += ["max_escalation/best/bound", "max_escalation/both", "max_accuracy_loss/both"]
            for key in keys:
                f = rep["fits"][key]
                bound = " (90% bound)" if key.endswith("/bound") else ""
                h = f["held_out"]
                fits.append(
                    f"| {d} | {s} → {lg} | {rep['n_calibration']} / {rep['n_held_out']} | "
                    f"{pct(so['accuracy'])} | {pct(f['held_out_large_accuracy'])} | {f['target']}={f['value']}{bound} | "
                    f"{f['gate']} | {pct(f['calibration']['escalation'])} | {pct(h['escalation'])} | "
                    f"{pct(h['accuracy'])} | {pct(h['large_tokens'])} | {h['est_time']:.2f}x | "
                    f"{'yes' if f['met'] else '**no**'} |"
                )
            # for the mean: the raw gate's fits, and each set's best gate's (raw where best)
            for name, key in (
                ("max_escalation=0.3", "max_escalation/raw/probability"),
                ("max_accuracy_loss=0.01", "max_accuracy_loss/raw/probability"),
                ("max_escalation=0.3, best gate", "max_escalation/best"),
                ("max_accuracy_loss=0.01, best gate", "max_accuracy_loss/best"),
                ("max_escalation=0.3 (90% bound), best gate", "max_escalation/best/bound"),
                ("max_escalation=0.3, both calibrated", "max_escalation/both"),
                ("max_accuracy_loss=0.01, both calibrated", "max_accuracy_loss/both"),
            ):
                f = rep["fits"].get(key) or rep["fits"][key.split("/")[0] + "/raw/probability"]
                h = f["held_out"]
                means.setdefault((f"{s} → {lg}", name), []).append(
                    [
                        so["accuracy"],
                        f["held_out_large_accuracy"],
                        h["escalation"],
                        h["accuracy"],
                        float(f["met"]),
                    ]
                )
            areas = {g: v["area"] for g, v in rep["gates"].items()}
            row = " | ".join(
                f"{areas.get(f'{src}/{sig}', float('nan')):.4f}"
                for src in ("raw", "fitted", "contextual")
                for sig in ("probability", "margin", "entropy")
            )
            gates.append(f"| {d} | {s} → {lg} | {row} | {rep['best_gate']} |")
            sep = {g: v["separation"] for g, v in rep["gates"].items()}
            seps.append(
                f"| {d} | {s} → {lg} | {pct(rep['small_only']['accuracy'])} | "
                + " | ".join(
                    f"{sep.get(f'{src}/probability', float('nan')):.3f}"
                    for src in ("raw", "fitted", "contextual")
                )
                + " |"
            )
    print(
        "| set | cascade | n cal / held-out | small acc | large acc | target | gate | "
        "cal. escalated | escalated | accuracy | large tokens | est. time | met |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(fits))
    print()
    heads = [
        f"{src} {sig[:4]}"
        for src in ("raw", "fitted", "ctx")
        for sig in ("probability", "margin", "entropy")
    ]
    print("| set | cascade | " + " | ".join(heads) + " | best |")
    print("|---|---|" + "---|" * len(heads) + "---|")
    print("\n".join(gates))
    print()
    print("Separation: the AUROC of the small model's max probability for its right against")
    print("its wrong answers (held-out; 0.5 = cannot tell them apart), per source.")
    print()
    print("| set | cascade | small acc | raw | fitted | contextual |")
    print("|---|---|---|---|---|---|")
    print("\n".join(seps))
    print()
    # the mean over the sets given, per pair and fit (a set counts once however large)
    print(
        "| cascade | fit | sets | small acc | large acc | escalated | accuracy | "
        "accuracy - large | met |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (pair, which), rows in means.items():
        m = [sum(col) / len(rows) for col in zip(*rows)]
        print(
            f"| {pair} | {which} | {len(rows)} | {pct(m[0])} | {pct(m[1])} | {pct(m[2])} | "
            f"{pct(m[3])} | {100 * (m[3] - m[1]):+.1f} | {round(m[4] * len(rows))} of {len(rows)} |"
        )


if __name__ == "__main__":
    main()
