"""The fast compute modes against float32 on the shared data sets (issue 31, EVAL.md
"Compute modes").

For each set, the same stratified sample (`--n`, `--seed`) is decided twice on one GGUF
file, in float32 over the file's blocks (`dtype="quantized"`: the dense path's scores
within 1e-5) and in a fast mode (`compute="int8"`, or `bf16` where the CPU has it), with
the same `decide_many` batches. Per set it prints: the share of scored answers (field by
field) whose argmax agrees, the largest and the median |delta p| over every candidate,
both modes' accuracy against the labels, and the wall time of each mode (alternating
set by set; the time is a ratio on this machine only).

Usage:
    .venv/bin/python benchmarks/compute_agreement.py --n 100 --json compute_agreement.json
    .venv/bin/python benchmarks/compute_agreement.py --model qwen2.5-coder-0.5b --sets sst2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SETS = ("sst2", "sms_spam", "mams", "nlupp", "clinc150", "banking77")


def _model_path(name: str | None) -> str | None:
    """None (the embedded model), a .gguf path, or a fetched model's name."""
    if name is None or name.endswith(".gguf"):
        return name
    root = Path.home() / ".cache" / "pcd-tools" / "models"
    hits = sorted(root.glob(f"{name}*.gguf"))
    if not hits:
        raise SystemExit(f"no model {name!r} in {root}: python ../shared/models/fetch.py --list")
    return str(hits[0])


def _compare(ref: list[Any], fast: list[Any], gold: list[dict[str, Any]]) -> dict[str, Any]:
    agree = total = right_ref = right_fast = counted = 0
    diffs: list[float] = []
    for a, b, labels in zip(ref, fast, gold):
        for name, fa in a.fields.items():
            fb = b.fields[name]
            if fa.distribution is None:
                continue
            total += 1
            agree += fa.label == fb.label
            pa = np.array(list(fa.distribution.values()))
            pb = np.array([fb.distribution[k] for k in fa.distribution])
            diffs.extend(np.abs(pa - pb).tolist())
            if name in labels:
                counted += 1
                right_ref += fa.label == labels[name]
                right_fast += fb.label == labels[name]
    return {
        "answers": total,
        "argmax_agreement": agree / total if total else float("nan"),
        "max_abs_dp": max(diffs, default=float("nan")),
        "median_abs_dp": statistics.median(diffs) if diffs else float("nan"),
        "accuracy_float32": right_ref / counted if counted else float("nan"),
        "accuracy_fast": right_fast / counted if counted else float("nan"),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pcd_tools import Decider
    from pcd_tools.eval.datasets.builtin import load_dataset

    path = _model_path(args.model)
    ref = Decider.load(path, dtype="quantized", compute="float32")
    fast = Decider.load(path, dtype="quantized", compute=args.compute)
    out: dict[str, Any] = {
        "model": ref.model_id,
        "compute": args.compute,
        "n": args.n,
        "seed": args.seed,
        "sets": {},
    }
    for i, name in enumerate(args.sets.split(",")):
        ds = load_dataset(name)
        split = ds.eval_sample(args.n, args.seed)
        texts = [t for t, _ in split.examples]
        gold = [lab for _, lab in split.examples]
        times: dict[str, float] = {}
        got: dict[str, list[Any]] = {}
        order = ("float32", "fast") if i % 2 == 0 else ("fast", "float32")
        for which in order:
            dec = ref if which == "float32" else fast
            t0 = time.perf_counter()
            got[which] = dec.decide_many(ds.schema, texts, batch_size=args.batch_size)
            times[which] = time.perf_counter() - t0
        row = _compare(got["float32"], got["fast"], gold)
        row["seconds_float32"], row["seconds_fast"] = times["float32"], times["fast"]
        out["sets"][name] = row
        print(
            f"{name}: {row['answers']} answers, argmax agreement {row['argmax_agreement']:.1%}, "
            f"max |dp| {row['max_abs_dp']:.3f} (median {row['median_abs_dp']:.4f}), accuracy "
            f"{row['accuracy_float32']:.1%} float32 / {row['accuracy_fast']:.1%} "
            f"{args.compute}, {times['fast'] / times['float32']:.2f}x the float32 time",
            flush=True,
        )
        if args.json:
            args.json.write_text(json.dumps(out, indent=1) + "\n")
    return out


def table(out: dict[str, Any]) -> str:
    lines = [
        f"{out['model']}, compute={out['compute']!r} against float32, n={out['n']} per set:",
        "",
        "| set | answers | argmax agreement | max abs dp | median abs dp | accuracy float32 "
        f"| accuracy {out['compute']} | time {out['compute']} / float32 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in out["sets"].items():
        lines.append(
            f"| {name} | {r['answers']} | {r['argmax_agreement']:.1%} | {r['max_abs_dp']:.3f} "
            f"| {r['median_abs_dp']:.4f} | {r['accuracy_float32']:.1%} | {r['accuracy_fast']:.1%} "
            f"| {r['seconds_fast'] / r['seconds_float32']:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a .gguf path or a fetched model's name (default: embedded)")
    ap.add_argument("--compute", default="int8", choices=("int8", "bf16"))
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--from-json", type=Path, help="print the table of an earlier run")
    args = ap.parse_args()
    out = json.loads(args.from_json.read_text()) if args.from_json else run(args)
    print(table(out))


if __name__ == "__main__":
    main()
