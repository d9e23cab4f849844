"""`pcd eval`: evaluate a schema on labelled data, PCD against constrained generation."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._common import check_at_least, check_file, check_temperature, load_decider
from ._data import add_data_arguments, dataset_from_args

if TYPE_CHECKING:
    from ..eval.datasets import Dataset
    from ..eval.evaluate import EvalReport

HELP = "evaluate a schema on labelled data (PCD vs constrained generation)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `pcd eval` options (the dispatcher adds `--model`, `--json`, `--calibration`).

    Args:
        parser: The sub-command's parser.
    """
    from ..eval.order_bias import DESIGNS

    add_data_arguments(parser)
    parser.add_argument("--n", type=int, default=300, help="stratified sample size (default 300)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    parser.add_argument("--batch-size", type=int, default=8, help="PCD contexts per pass")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--no-baseline", action="store_true", help="skip constrained generation")
    parser.add_argument(
        "--order-bias",
        type=int,
        default=None,
        metavar="K",
        help="measure the order-flip rate (K >= 2 also averages over K orders)",
    )
    parser.add_argument(
        "--order-bias-n", type=int, default=100, help="items for the order-bias measurement"
    )
    parser.add_argument(
        "--order-design",
        choices=DESIGNS,
        default=DESIGNS[0],
        help="how the K orders are built: evenly spaced rotations (default) or random",
    )
    parser.add_argument("--diagrams", default=None, help="folder for reliability-diagram PNGs")
    parser.add_argument("--out", default=None, help="write the full report (with items) as JSON")
    parser.add_argument(
        "--from-report",
        default=None,
        metavar="REPORT",
        help="recompute a saved report (--out) under --calibration, without the model",
    )


def _check_disjoint(calibration: Any, dataset: str, ids: Sequence[str]) -> None:
    """Refuses to evaluate on items the calibration was fitted on."""
    from ..eval.evaluate import EvalError

    fitted = getattr(calibration, "fitted_on", None) or {}
    if fitted.get("dataset") != dataset:
        return
    overlap = set(fitted.get("ids") or ()) & set(ids)
    if overlap:
        raise EvalError(
            f"calibration {getattr(calibration, 'path', None)!r} was fitted on {len(overlap)} of the items being "
            f"evaluated (e.g. {sorted(overlap)[:3]}); fit it on a disjoint split "
            "(pcd calibrate --eval-n/--eval-seed matching this run)."
        )


def check_args(args: argparse.Namespace) -> None:
    """Checks the `pcd eval` options that need no data or model.

    Args:
        args: The parsed arguments.

    Raises:
        UsageError: naming the first bad option (`pcd` exits 2).
    """
    check_temperature(args.temperature)
    check_at_least(args, 1, "n", "batch_size", "order_bias_n")
    check_at_least(args, 0, "order_bias")
    if args.from_report:
        check_file(args.from_report, "--from-report")


def run(args: argparse.Namespace) -> int:
    """Runs `pcd eval`: evaluate (or rescore a saved report), then print or save the report.

    Args:
        args: The parsed arguments.

    Returns:
        The exit code.
    """
    from rich.console import Console

    from ..calibration import Calibration, read_json
    from ..eval.evaluate import EvalError, evaluate, rescore
    from ..eval.order_bias import order_bias

    check_args(args)
    t0 = time.perf_counter()
    err = Console(stderr=True)
    ds = dataset_from_args(args)
    if args.from_report:
        saved = read_json(args.from_report, "report", EvalError)
        cal = Calibration.load(args.calibration) if args.calibration else None
        _check_disjoint(cal, ds.name, [it.get("id") for it in saved.get("items") or []])
        report = rescore(saved, ds.schema, cal, temperature=args.temperature)
        return _finish(args, ds, report, t0=None)
    split = ds.eval_sample(args.n, args.seed)
    with err.status("Loading model..."):
        decider = load_decider(args)
    _check_disjoint(getattr(decider, "calibration", None), ds.name, split.ids)
    report = evaluate(
        ds.schema,
        split,
        decider=decider,
        baseline=not args.no_baseline,
        batch_size=args.batch_size,
        temperature=args.temperature,
        progress=True,
        name=ds.name,
    )
    report.seed = args.seed
    if args.order_bias is not None:
        texts = [t for t, _ in split.examples[: args.order_bias_n]]
        with err.status(f"Measuring order bias on {len(texts)} items..."):
            report.order_bias = order_bias(
                ds.schema,
                texts,
                decider=decider,
                k=args.order_bias,
                seed=args.seed,
                temperature=args.temperature,
                batch_size=args.batch_size,
                design=args.order_design,
            ).to_dict()
    return _finish(args, ds, report, t0)


def _finish(args: argparse.Namespace, ds: Dataset, report: EvalReport, t0: float | None) -> int:
    """Diagrams, the `--out` file and the printed report of `pcd eval`."""
    from rich.console import Console

    from ..eval.plots import eval_diagrams
    from ..eval.report import print_eval_report
    from ..schema import compile_schema

    if args.diagrams:
        fields = compile_schema(ds.schema).field_names
        eval_diagrams(report, args.diagrams, name=ds.name, fields=fields)
    if t0 is not None:
        report.elapsed_s = time.perf_counter() - t0
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps(report.to_dict(items=True, curves=True), indent=1, default=str) + "\n"
        )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print_eval_report(Console(width=150), report)
    return 0
