"""The tables of evaluations and calibrations: on the console, and as EVAL.md's markdown.

- `print_eval_report` and `print_calibration`: what `pcd eval` and `pcd calibrate` print
  (rich tables);
- `eval_markdown_table`: EVAL.md's per-dataset table, from the JSON files that `pcd eval
  --out` and `pcd calibrate --out` wrote (`scripts/eval_tables.py`);
- `paired_comparison`: PCD against the baseline item by item on one field of a saved
  report, with an exact McNemar (sign) test (`scripts/eval_paired.py`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..calibration import Calibration
    from .evaluate import EvalReport

__all__ = [
    "eval_markdown_table",
    "paired_comparison",
    "print_calibration",
    "print_eval_report",
    "sign_test",
]

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
    if report.thresholds:
        console.print(f"thresholds on this sample: {json.dumps(report.thresholds)}")
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
