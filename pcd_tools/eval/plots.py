"""Reliability diagrams, drawn with matplotlib (the `bench` extra).

- `reliability_diagram`: one panel per set of `(confidence, correct)` arrays;
- `eval_diagrams`: per field of an evaluation, a panel per method (`pcd eval --diagrams`);
- `calibration_diagrams`: per field, before and after a calibration on its fitting data
  (`pcd calibrate --diagrams`).

matplotlib is imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .metrics import ece, reliability_bins

if TYPE_CHECKING:
    from ..answers.calibration import Calibration
    from .evaluate import EvalReport

__all__ = ["calibration_diagrams", "cascade_curve", "eval_diagrams", "reliability_diagram"]


def reliability_diagram(
    panels: Mapping[str, tuple[Any, Any]],
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    n_bins: int = 15,
) -> Path:
    """Draws one reliability diagram per panel side by side and saves a PNG.

    Args:
        panels: Panel title -> `(confidence, correct)` arrays.
        path: The PNG to write.
        title: Figure title.
        n_bins: Equal-width confidence bins.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    k = max(1, len(panels))
    fig, axes = plt.subplots(1, k, figsize=(3.6 * k, 3.8), squeeze=False)
    for ax, (name, (conf, ok)) in zip(axes[0], panels.items()):
        b = reliability_bins(conf, ok, n_bins)
        centers = (b["edges"][:-1] + b["edges"][1:]) / 2
        filled = b["count"] > 0
        width = 1.0 / n_bins
        ax.bar(
            centers[filled],
            b["accuracy"][filled],
            width=width,
            edgecolor="black",
            color="#4C72B0",
            label="accuracy",
        )
        ax.bar(
            centers[filled],
            b["confidence"][filled] - b["accuracy"][filled],
            bottom=b["accuracy"][filled],
            width=width,
            color="#DD8452",
            alpha=0.5,
            edgecolor="#DD8452",
            label="gap",
        )
        ax.plot([0, 1], [0, 1], "k--", linewidth=1)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("confidence")
        ax.set_ylabel("accuracy")
        ax.set_title(
            f"{name}\nECE={ece(conf, ok, n_bins):.3f}  n={len(np.asarray(conf))}", fontsize=9
        )
        ax.legend(loc="upper left", fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=90)
    plt.close(fig)
    return p


def eval_diagrams(
    report: EvalReport, folder: str | os.PathLike[str], *, name: str, fields: Sequence[str]
) -> list[Path]:
    """Draws one reliability diagram per field of an evaluation, a panel per method.

    Args:
        report: The evaluation report.
        folder: Where the PNGs go, as `<name>_<field>.png`.
        name: The dataset name in file names and titles.
        fields: The fields to draw (a field no method scored is skipped).

    Returns:
        The PNGs written.
    """
    out = []
    for field in fields:
        panels: dict[str, tuple[Any, Any]] = {
            m: report.methods[m].confidence_correct(field)
            for m in ("pcd", "pcd_calibrated", "baseline")
            if m in report.methods and field in report.methods[m].fields
        }
        if panels:
            out.append(
                reliability_diagram(
                    panels,
                    Path(folder) / f"{name}_{field}.png",
                    title=f"{name}.{field}: evaluation sample n={report.n}, seed {report.seed}",
                )
            )
    return out


def calibration_diagrams(
    cal: Calibration,
    arrays: Mapping[str, tuple[Any, Any]],
    folder: str | os.PathLike[str],
    *,
    name: str,
) -> list[Path]:
    """Draws before/after reliability diagrams of a calibration on its own fitting data.

    Args:
        cal: The fitted calibration.
        arrays: Field name -> `(log_scores (n, K), gold indices (n,))` it was fitted on.
        folder: Where the PNGs go, as `<name>_<field>_calibration_split.png`.
        name: The dataset name in file names and titles.

    Returns:
        The PNGs written.
    """
    from ..answers.softmax import softmax

    out = []
    for field, (zz, gg) in arrays.items():
        z, g = np.asarray(zz, dtype=np.float64), np.asarray(gg)
        before = np.stack([softmax(row, 1.0) for row in z])
        after = cal.probabilities(field, z)
        how = f"T={cal.temperature(field):.2f}" + (" + bias" if field in cal.biases else "")
        out.append(
            reliability_diagram(
                {
                    "before (T=1)": (before.max(axis=1), before.argmax(axis=1) == g),
                    f"after ({how})": (after.max(axis=1), after.argmax(axis=1) == g),
                },
                Path(folder) / f"{name}_{field}_calibration_split.png",
                title=f"{name}.{field}: calibration split (in-sample)",
            )
        )
    return out


def cascade_curve(report: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Draws a cascade report's cost-accuracy curves (`pcd_tools.eval.cascade`) and saves a
    PNG: accuracy against the large model's forward tokens (a fraction of large-only),
    one line per gate, with the two single models and the fitted thresholds marked.

    Args:
        report: A `cascade_report` dict.
        path: The PNG to write.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for name, gate in report["gates"].items():
        rows = gate["sweep"]
        best = name == report["best_gate"]
        ax.plot(
            [r["large_tokens"] for r in rows],
            [r["accuracy"] for r in rows],
            lw=2.2 if best else 0.9,
            alpha=1.0 if best else 0.6,
            label=f"{name}{' (best)' if best else ''}",
        )
    s, lg = report["small_only"], report["large_only"]
    ax.scatter([0.0], [s["accuracy"]], marker="s", color="black", zorder=5)
    ax.annotate(f"small only ({report['small_model']})", (0.0, s["accuracy"]), fontsize=7)
    ax.scatter([1.0], [lg["accuracy"]], marker="D", color="black", zorder=5)
    ax.annotate(f"large only ({report['large_model']})", (0.55, lg["accuracy"]), fontsize=7)
    for key, fit in report["fits"].items():
        if key.endswith("/best") and report["best_gate"] == "raw/probability":
            continue  # the same fit as the raw/probability one
        h = fit["held_out"]
        ax.scatter([h["large_tokens"]], [h["accuracy"]], marker="*", s=90, zorder=6)
        ax.annotate(key, (h["large_tokens"], h["accuracy"]), fontsize=6)
    ax.set_xlabel("large model's forward tokens (fraction of large-only)")
    ax.set_ylabel("accuracy (mean over fields)")
    ax.set_title(f"{report.get('dataset') or report['schema']}: held-out n={report['n_held_out']}")
    ax.legend(fontsize=6, loc="lower right")
    ax.grid(alpha=0.3)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
