"""The tables of evaluations and calibrations: on the console, and as EVAL.md's markdown.

- `print_eval_report` and `print_calibration`: what `pcd eval` and `pcd calibrate` print
  (rich tables);
- `eval_markdown_table`: EVAL.md's per-dataset table, from the JSON files that `pcd eval
  --out` and `pcd calibrate --out` wrote (`scripts/eval_tables.py`);
- `paired_comparison`: PCD against the baseline item by item on one field of a saved
  report, with an exact McNemar (sign) test (`scripts/eval_paired.py`);
- `print_label_free_grid` and `label_free_markdown`: the label-free grid of `pcd eval
  --label-free-grid` (`pcd_tools.eval.label_free`), per dataset and summed up over
  datasets against the issue's figures (`scripts/eval_label_free.py`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..answers.calibration import Calibration
    from .evaluate import EvalReport

__all__ = [
    "eval_markdown_table",
    "grid_rows",
    "label_free_markdown",
    "paired_comparison",
    "print_calibration",
    "print_eval_report",
    "print_label_free_grid",
    "sign_test",
]

# How a method `auto` chose for a field is written in the tables.
AUTO_TAGS = {
    "identity": "none",
    "temperature": "T",
    "temperature_bias": "T+b",
    "contextual": "ctx",
    "contextual_temperature": "ctx+T",
    "pmi": "PMI",
    "pmi_temperature": "PMI+T",
}

# --- the console --------------------------------------------------------------------------


def print_eval_report(console: Any, report: EvalReport) -> None:
    """Prints an evaluation: a row per field and method, then latency and extras.

    Args:
        console: A rich Console.
        report: The evaluation report.
    """
    from rich.table import Table

    table = Table(
        title=f"{report.dataset}: n={report.n}, seed={report.seed}, model={report.model_id}"
    )
    cols = (
        "field",
        "method",
        "acc",
        "macro-F1",
        "ECE",
        "ECE floor",
        "Brier",
        "NLL",
        "AURC",
        "conf",
    )
    for col in cols:
        table.add_column(col, justify="right" if col not in ("field", "method") else "left")
    for name in next(iter(report.methods.values())).fields:
        for mname, m in report.methods.items():
            f = m.fields.get(name)
            if f is None:
                continue
            table.add_row(
                name,
                mname,
                f"{f.accuracy:.3f}",
                f"{f.macro_f1:.3f}",
                f"{f.ece:.3f}",
                f"{f.ece_floor:.3f}",
                f"{f.brier:.3f}",
                f"{f.nll:.3f}",
                f"{f.aurc:.3f}",
                f"{f.mean_confidence:.3f}",
            )
    console.print(table)
    for mname, m in report.methods.items():
        lat = m.latency
        console.print(
            f"{mname}: median {lat['median_ms']:.0f} ms, p95 {lat['p95_ms']:.0f} ms per item "
            f"({m.latency_kind}); passes {m.passes:.1f}; invalid {m.invalid}"
        )
    if report.shots:
        console.print(
            f"{report.shots['k']} shots (seed {report.shots['seed']}, stratified on "
            f"{report.shots['field']}, from {report.shots['split']}): "
            + ", ".join(report.shots["ids"])
        )
    if report.label_free != "none":
        console.print(f"PCD label-free correction: {report.label_free}")
    if report.thresholds:
        console.print(f"thresholds on this sample: {json.dumps(report.thresholds)}")
    for name, per in report.prediction_sets.items():
        cells = [
            f"{r['target']:g}: "
            + (
                f"coverage {r['coverage']:.3f}, mean size {r['mean_size']:.2f}"
                if "coverage" in r
                else "n too small"
            )
            for r in per.values()
        ]
        console.print(f"prediction sets of {name} on this sample: " + "; ".join(cells))
    if report.order_bias:
        console.print(f"order bias: {json.dumps(report.order_bias)}")
    console.print(f"elapsed {report.elapsed_s:.1f} s")


def print_calibration(console: Any, cal: Calibration, *, dataset: str) -> None:
    """Prints a calibration: per field, the method, T, NLL and ECE before and after.

    Args:
        console: A rich Console.
        cal: The fitted calibration.
        dataset: The dataset name in the title.
    """
    from rich.table import Table

    table = Table(
        title=f"Calibration of {dataset} on {cal.fitted_on.get('n', '?')} items "
        f"({cal.fitted_on.get('split', '?')}, seed {cal.fitted_on.get('seed', '?')})"
    )
    cols = ("field", "method", "T", "NLL before", "NLL after", "ECE before", "ECE after")
    for col in (*cols, "threshold"):
        table.add_column(col)
    for name, t in cal.temperatures.items():
        m = cal.metrics[name]
        th = cal.thresholds.get(name)
        table.add_row(
            name,
            str(m.get("method", cal.method)),
            f"{t:.3f}",
            f"{m['nll_before']:.3f}",
            f"{m['nll_after']:.3f}",
            f"{m['ece_before']:.3f}",
            f"{m['ece_after']:.3f}",
            f"{th['threshold']:.3f} (coverage {th['coverage']:.2f}, risk {th['risk']:.2f})"
            if th
            else "-",
        )
    console.print(table)
    for name in cal.temperatures:
        why = cal.metrics[name].get("why")
        if why:
            console.print(f"{name}: {why}", markup=False, highlight=False)


# --- EVAL.md's table ------------------------------------------------------------------------


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


def eval_markdown_table(runs: str | Path, names: Sequence[str]) -> Iterator[str]:
    """EVAL.md's table: a row per dataset and field, PCD against the baseline.

    For each dataset it reads, from `runs`:

    - `eval_<dataset>.json`: `pcd eval --out` with the default (temperature) calibration;
    - `eval_<dataset>_auto.json`: the same report recomputed under `--method auto`
      (`pcd eval --from-report eval_<dataset>.json --calibration cal_<dataset>_auto.json`);
    - `cal_<dataset>_auto.json`: that calibration.

    Args:
        runs: The folder holding the files.
        names: The datasets, in row order.

    Yields:
        The markdown lines: header, rule, then the rows (each as soon as it is made).
    """
    runs = Path(runs)
    head = (
        "| dataset | field | n | accuracy PCD / baseline / PCD auto-cal "
        "| macro-F1 PCD / baseline / auto | ECE PCD raw → T → auto "
        "| ECE floor raw / auto | ECE baseline | Brier PCD / auto / baseline | AURC PCD / auto / baseline "
        "| latency ms PCD / baseline |"
    )
    yield head
    yield "|" + "---|" * 11
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
            tag = AUTO_TAGS.get(cal_auto["metrics"][field]["method"], "T")
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
            yield "| " + " | ".join(cells) + " |"
            first = False


# --- paired comparison ------------------------------------------------------------------------


def sign_test(a: int, b: int) -> float:
    """The exact two-sided sign test (McNemar) of `a` against `b` discordant pairs.

    Args:
        a: Items only the first method got right.
        b: Items only the second method got right.

    Returns:
        The p-value (1.0 when there are no discordant pairs).
    """
    n, k = a + b, min(a, b)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def _raw_confidence(log_scores: list[float]) -> float:
    m = max(log_scores)
    return 1.0 / sum(math.exp(z - m) for z in log_scores)


def paired_comparison(report: Mapping[str, Any], field: str, n_examples: int = 3) -> Iterator[str]:
    """PCD against the baseline item by item on one field of a saved report.

    Counts the items only one method got right, tests them with `sign_test`, and shows up
    to `n_examples` of each kind. PCD's confidence is shown raw (softmax of the stored log
    scores at T = 1), whatever calibration the report was made with.

    Args:
        report: A report dict with items and the baseline (`pcd eval --out`).
        field: The field to compare on.
        n_examples: Examples shown per kind.

    Yields:
        The lines to print (each as soon as it is made).
    """
    only_pcd, only_base, both, neither = [], [], 0, 0
    for it in report["items"]:
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
    yield (
        f"{field}: n={total}  both right {both}, neither {neither}, only PCD {len(only_pcd)}, "
        f"only baseline {len(only_base)}; exact McNemar p = "
        f"{sign_test(len(only_pcd), len(only_base)):.3f}"
    )
    for title, rows in (("only the baseline right", only_base), ("only PCD right", only_pcd)):
        yield f"  {title}:"
        for it in rows[:n_examples]:
            p, b = it["pcd"][field], it["baseline"][field]
            conf = _raw_confidence(it["pcd_log_scores"][field])
            yield (
                f"    {it['text'][:90]!r}  gold={it['gold'][field]!r}  "
                f"PCD={p[0]!r} ({conf:.2f})  baseline={b[0]!r} ({b[1]:.2f})"
            )


# --- the label-free grid ------------------------------------------------------------------

_NAMES = {
    "raw": "raw",
    "contextual": "contextual",
    "pmi": "PMI",
    "fitted": "fitted",
    "auto": "auto (LOO)",
}


def grid_rows(grid: Mapping[str, Any]) -> Iterator[tuple[int, str, dict[str, Any], float, str]]:
    """`(shots, method, main-field metrics, warm ms, note)` per row of a grid.

    Args:
        grid: What `pcd_tools.eval.label_free.label_free_grid` returned.
    """
    main = grid["main_field"]
    for row in grid["rows"]:
        for m in grid["methods"]:
            note = ""
            if m == "fitted":
                note = AUTO_TAGS.get(row["calibration"][main]["method"], "?")
            if m == "auto" and "auto" not in row.get("fields", {}):
                continue  # a grid from before `calibration="auto"`
            if m == "auto":
                note = _NAMES[row["auto"]["grid_method"]]
            yield row["shots"], m, row["fields"][m][main], row["latency_ms"][m], note


def _num(x: Any, fmt: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def print_label_free_grid(console: Any, grid: Mapping[str, Any]) -> None:
    """Prints one dataset's grid: shots x method on the main field, then the baseline.

    Args:
        console: A rich Console.
        grid: What `label_free_grid` returned.
    """
    from rich.table import Table

    table = Table(
        title=f"{grid['dataset']} `{grid['main_field']}`: n={grid['n']} (seed {grid['seed']}), "
        f"calibration n={grid['cal_n']}, model={grid['model_id']}"
    )
    for col in ("shots", "method", "acc", "macro-F1", "ECE", "ECE floor", "warm ms", "fitted"):
        table.add_column(col, justify="left" if col in ("method", "fitted") else "right")
    for k, m, f, ms, note in grid_rows(grid):
        table.add_row(
            str(k),
            _NAMES[m],
            _num(f["accuracy"]),
            _num(f["macro_f1"]),
            _num(f["ece"]),
            _num(f["ece_floor"]),
            _num(ms, ",.0f"),
            note,
        )
    console.print(table)
    for row in grid["rows"]:
        if row["shots"]:
            console.print(f"{row['shots']} shots: {', '.join(row['shot_ids'])}")
        base = row.get("baseline")
        if base:
            f = base["method"]["fields"][grid["main_field"]]
            pcd = base["pcd"]
            console.print(
                f"{row['shots']} shots, {base['n']} items: constrained generation acc "
                f"{f['accuracy']:.3f}; PCD "
                + " / ".join(_NAMES[m] for m in _NAMES if m in pcd)
                + " "
                + " / ".join(
                    f"{pcd[m][grid['main_field']]['accuracy']:.3f}" for m in _NAMES if m in pcd
                )
            )
    console.print(f"elapsed {grid['elapsed_s']:.0f} s")


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _dataset_table(grid: Mapping[str, Any]) -> Iterator[str]:
    main = grid["main_field"]
    yield (
        f"**{grid['dataset']}** (`{main}`; n = {grid['n']}, seed {grid['seed']}; fitted on "
        f"{grid['cal_n']} items of `{grid['cal_split']}`)"
    )
    yield ""
    yield "| shots | method | accuracy | macro-F1 | ECE (floor) | warm request ms | auto chose |"
    yield "|---|---|---|---|---|---|---|"
    for k, m, f, ms, note in grid_rows(grid):
        yield (
            f"| {k} | {_NAMES[m]} | {_num(f['accuracy'])} | {_num(f['macro_f1'])} | "
            f"{_num(f['ece'])} ({_num(f['ece_floor'])}) | {_num(ms, ',.0f')} | {note} |"
        )
    bases = [r for r in grid["rows"] if r.get("baseline")]
    if bases:
        yield ""
        cols = [m for m in _NAMES if all(m in r["baseline"]["pcd"] for r in bases)]
        yield (
            "| shots | items | constrained generation | "
            + " | ".join(f"PCD {_NAMES[m]}" for m in cols)
            + " |"
        )
        yield "|---|---|---|" + "---|" * len(cols)
        for r in bases:
            b = r["baseline"]
            accs = [b["pcd"][m][main]["accuracy"] for m in cols]
            yield (
                f"| {r['shots']} | {b['n']} | {_num(b['method']['fields'][main]['accuracy'])} | "
                + " | ".join(_num(a) for a in accs)
                + " |"
            )
    yield ""


def _acc(grid: Mapping[str, Any], k: int, m: str) -> float | None:
    for row in grid["rows"]:
        if row["shots"] == k and m in row["fields"]:
            return float(row["fields"][m][grid["main_field"]]["accuracy"])
    return None


def _summary(grids: Sequence[Mapping[str, Any]]) -> Iterator[str]:
    """The issue's figures, from every dataset's grid."""
    ks = sorted({r["shots"] for g in grids for r in g["rows"]})
    names = [g["dataset"] for g in grids]
    yield "| shots | method | " + " | ".join(names) + " | mean |"
    yield "|---|---|" + "---|" * (len(names) + 1)
    means: dict[tuple[int, str], float] = {}
    for k in ks:
        for m in _NAMES:
            accs = [_acc(g, k, m) for g in grids]
            ok = [a for a in accs if a is not None]
            means[(k, m)] = _mean(ok) if len(ok) == len(accs) else math.nan
            yield (
                f"| {k} | {_NAMES[m]} | "
                + " | ".join(_num(a) for a in accs)
                + f" | {_num(means[(k, m)])} |"
            )
    yield ""
    if (0, "raw") not in means:
        return
    free = {
        km: v
        for km, v in means.items()
        if km[1] != "fitted" and km != (0, "raw") and not math.isnan(v)
    }
    if free:
        bk, bm = max(free, key=lambda km: free[km])
        drops = {g["dataset"]: (_acc(g, bk, bm) or 0.0) - (_acc(g, 0, "raw") or 0.0) for g in grids}
        worst = min(drops, key=lambda d: drops[d])
        yield (
            f"- Best label-free setting: {bk} shots + {_NAMES[bm]}, mean main-field accuracy "
            f"{free[(bk, bm)]:.3f} against {means[(0, 'raw')]:.3f} zero-shot raw "
            f"({100 * (free[(bk, bm)] - means[(0, 'raw')]):+.1f} points; target +10). Per "
            "dataset, in points: "
            + ", ".join(f"{d} {100 * v:+.1f}" for d, v in drops.items())
            + f"; the lowest is {worst} (target: none below -2)."
        )
    for g in grids:
        lat = {r["shots"]: r["latency_ms"]["raw"] for r in g["rows"]}
        ratio = g.get("warm_ratio", {}).get(str(max(lat)))
        if g.get("warm_ratio", {}).get("over_shots") == 0 and ratio:
            yield (
                f"- {g['dataset']}: warm request with {max(lat)} shots over zero-shot, "
                f"interleaved on {ratio['n']} texts: {ratio['median']:.2f}x "
                f"({ratio['min']:.2f}-{ratio['max']:.2f}) (target ≤ 1.2x)."
            )
        elif 0 in lat and max(lat) > 0:
            yield (
                f"- {g['dataset']}: warm request with {max(lat)} shots {lat[max(lat)]:,.0f} ms "
                f"against {lat[0]:,.0f} ms zero-shot: {lat[max(lat)] / lat[0]:.2f}x (target "
                "≤ 1.2x)."
            )
    missed, worse, total = [], [], 0
    for g in grids:
        for r in g["rows"]:
            for key, f in r["fields"]["fitted"].items():
                total += 1
                target = max(0.05, 1.5 * f["ece_floor"])
                if f["ece"] > target:
                    missed.append(f"{g['dataset']} {key} {r['shots']}-shot {f['ece']:.3f}")
                if f["ece"] > r["fields"]["raw"][key]["ece"]:
                    worse.append(f"{g['dataset']} {key} {r['shots']}-shot")
    yield (
        f"- Fitted (auto): ECE ≤ max(0.05, 1.5 × floor) on {total - len(missed)} of {total} "
        "field × shot cells"
        + (f"; above it: {'; '.join(missed)}" if missed else "")
        + f". ECE above raw's on {len(worse)}"
        + (f": {'; '.join(worse)}" if worse else "")
        + "."
    )


def label_free_markdown(grids: Sequence[Mapping[str, Any]]) -> Iterator[str]:
    """EVAL.md's label-free section: the summary over datasets, then a table per dataset.

    Args:
        grids: One `label_free_grid` result per dataset (the `--out` files of `pcd eval
            --label-free-grid`).

    Yields:
        The markdown lines.
    """
    yield from _summary(grids)
    yield ""
    for g in grids:
        yield from _dataset_table(g)


def _pct(x: Any) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def print_cascade_report(console: Any, report: Mapping[str, Any]) -> None:
    """Prints a `pcd_tools.eval.cascade.cascade_report`: the gates' areas, the best gate's
    sweep and the fitted thresholds on the held-out items (and the timed real run).

    Args:
        console: A rich Console.
        report: The report dict.
    """
    from rich.table import Table

    s, lg = report["small_only"], report["large_only"]
    console.print(
        f"[bold]{report.get('dataset') or report['schema']}[/]: {report['small_model']} -> "
        f"{report['large_model']}; {report['n_calibration']} calibration / "
        f"{report['n_held_out']} held-out items; escalated fields scored over "
        f"{report['escalated_scoring']}. Small only {_pct(s['accuracy'])}, large only "
        f"{_pct(lg['accuracy'])} (held-out accuracy)."
    )
    t = Table(title="gates: area under accuracy vs large-model tokens (held-out)")
    for c in ("gate", "area", "separation (AUROC)"):
        t.add_column(c)
    for name, g in sorted(report["gates"].items(), key=lambda kv: -kv[1]["area"]):
        star = " (best)" if name == report["best_gate"] else ""
        t.add_row(name + star, f"{g['area']:.4f}", f"{g.get('separation', float('nan')):.3f}")
    console.print(t)
    t = Table(title=f"sweep of {report['best_gate']} (held-out)")
    for c in ("threshold", "escalated", "large tokens", "est. time", "accuracy", "macro-F1", "ECE"):
        t.add_column(c, justify="right")
    for r in report["gates"][report["best_gate"]]["sweep"]:
        t.add_row(
            f"{r['threshold']:.3f}",
            _pct(r["escalation"]),
            _pct(r["large_tokens"]),
            f"{r['est_time']:.2f}x",
            _pct(r["accuracy"]),
            _pct(r["macro_f1"]),
            f"{r['ece']:.3f}",
        )
    console.print(t)
    t = Table(title="thresholds fitted on the calibration items, measured held-out")
    for c in ("fit", "gate", "cal. escalated", "cal. accuracy", "escalated", "accuracy", "met"):
        t.add_column(c, justify="right")
    for f in report["fits"].values():
        h, c = f["held_out"], f["calibration"]
        t.add_row(
            f"{f['target']}={f['value']}",
            f["gate"],
            _pct(c["escalation"]),
            _pct(c["accuracy"]),
            _pct(h["escalation"]),
            _pct(h["accuracy"]),
            "yes" if f["met"] else "no",
        )
    console.print(t)
    w = report.get("wall")
    if w:
        console.print(
            f"real run ({w['fit']}, n={w['n']}): cascade {w['cascade_s']:.1f} s against large "
            f"only {w['large_only_s']:.1f} s = {w['ratio']:.2f}x"
            + (f" (small only {w['small_only_s']:.1f} s)" if "small_only_s" in w else "")
            + "; escalated "
            f"{_pct(w['escalation'])}, accuracy {_pct(w['accuracy'])}"
            + (
                f" (large only {_pct(w['large_accuracy'])})."
                if w.get("large_accuracy") is not None
                else "."
            )
        )
