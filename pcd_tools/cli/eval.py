"""`pcd eval`: evaluate a schema on labelled data, PCD against constrained generation.

`--shots K` shows both methods K examples drawn from the calibration split (stratified,
never from the evaluation sample; the report lists their ids). `--calibration` takes a
calibration file, or `contextual` / `none` for PCD's label-free calibration; `--scoring
pmi` runs domain-conditional PMI. `--label-free-grid` measures every shot count of
`--grid-shots` against raw, contextual, PMI and fitted (`pcd_tools.eval.label_free`).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._common import UsageError, check_at_least, check_file, check_temperature, load_decider
from ._data import add_data_arguments, dataset_from_args

if TYPE_CHECKING:
    from ..eval.datasets import Dataset
    from ..eval.evaluate import EvalReport

HELP = "evaluate a schema on labelled data (PCD vs constrained generation)"
LABEL_FREE = ("contextual", "none")


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
    _label_free_arguments(parser)
    _cascade_arguments(parser)


def _cascade_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("cascade (pcd_tools.eval.cascade)")
    g.add_argument(
        "--cascade",
        default=None,
        metavar="SMALL,LARGE",
        help="measure a small->large cascade: each a `pcd eval --out` report of this sample "
        "or a model as --model names it (`embedded`, a path or an id; then it is run, and "
        "the cascade's wall time is measured once)",
    )
    g.add_argument(
        "--cascade-contextual",
        default=None,
        metavar="REPORT",
        help="the small model's `pcd eval --calibration contextual --out` report (a gate source)",
    )
    g.add_argument(
        "--cascade-top-k",
        type=int,
        default=None,
        metavar="K",
        help="simulate a stage narrowed to the small model's top K (default: all candidates)",
    )
    g.add_argument(
        "--cascade-seed", type=int, default=0, help="seed of the calibration/held-out split"
    )
    g.add_argument(
        "--cascade-wall",
        default=None,
        metavar="SMALL,LARGE",
        help="the two models (when --cascade gave reports; named as --model names them: "
        "`embedded`, a path or an id): time one real batched cascade at the fitted thresholds against the "
        "large model alone on the held-out items",
    )
    g.add_argument(
        "--cascade-wall-fit",
        default="max_accuracy_loss/best",
        choices=WALL_FITS,
        help="which fitted thresholds the real run uses (default: the best gate's fit for "
        "--max-accuracy-loss); a fit on contextual confidences runs the raw one",
    )
    g.add_argument(
        "--cascade-wall-n",
        type=int,
        default=None,
        metavar="N",
        help="time the real run on the first N held-out items only (default all)",
    )
    g.add_argument(
        "--max-escalation", type=float, default=0.3, help="fit target: escalation budget"
    )
    g.add_argument(
        "--max-accuracy-loss",
        type=float,
        default=0.01,
        help="fit target: accuracy loss against large-only (0.01 = 1 point)",
    )


def _label_free_arguments(parser: argparse.ArgumentParser) -> None:
    """`--calibration` also takes `contextual`/`none`; `--scoring`, `--shots`, the grid."""
    cal = parser._option_string_actions["--calibration"]  # added by the dispatcher
    cal.dest = "calibration_arg"  # checked here: it may name a method, not a file
    cal.metavar = "FILE|contextual|none"
    cal.help = (
        "a calibration JSON file to apply, or a label-free calibration for PCD: "
        "contextual (contextual calibration) or none"
    )
    parser.add_argument(
        "--scoring",
        choices=["full", "constrained", "pmi"],
        default="full",
        help="PCD's scoring (default full); pmi is domain-conditional PMI",
    )
    parser.add_argument(
        "--pruning",
        choices=["off", "auto", "on"],
        default="off",
        help="PCD's pruned scoring of large fields (default off: the report then holds "
        "every candidate's score); auto or on to measure pruning",
    )
    parser.add_argument(
        "--shots",
        type=int,
        default=0,
        metavar="K",
        help="show K examples drawn from the calibration split, stratified over the first "
        "field's labels (default 0); the report lists their ids",
    )
    parser.add_argument("--shots-seed", type=int, default=1, help="seed of the shots' draw")
    g = parser.add_argument_group("label-free grid")
    g.add_argument(
        "--label-free-grid",
        action="store_true",
        help="measure shots x (raw, contextual, PMI, fitted): accuracy, macro-F1, ECE, latency",
    )
    g.add_argument("--grid-shots", default="0,4,8", help="shot counts of the grid (default 0,4,8)")
    g.add_argument(
        "--cal-n", type=int, default=200, help="grid: calibration items for 'fitted' (default 200)"
    )
    g.add_argument("--cal-seed", type=int, default=1, help="grid: seed of the calibration sample")
    g.add_argument(
        "--latency-n",
        type=int,
        default=10,
        help="grid: warm requests timed per method (default 10)",
    )
    g.add_argument(
        "--baseline-n",
        type=int,
        default=100,
        help="grid: items for constrained generation with the same examples (default 100; "
        "--no-baseline skips it)",
    )
    g.add_argument(
        "--baseline-shots",
        default=None,
        help="grid: shot counts the baseline runs at (default: the largest of --grid-shots)",
    )


def _shot_counts(text: str, flag: str) -> list[int]:
    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        ks = []
    if not ks or min(ks) < 0:
        raise UsageError(
            f"{flag} takes comma-separated shot counts >= 0 (e.g. 0,4,8); got {text!r}."
        )
    return ks


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
    from ..answers.calibration import Calibration, CalibrationError

    check_temperature(args.temperature)
    check_at_least(args, 1, "n", "batch_size", "order_bias_n", "cal_n", "latency_n")
    check_at_least(args, 0, "order_bias", "shots", "baseline_n")
    if args.from_report:
        check_file(args.from_report, "--from-report")
    _shot_counts(args.grid_shots, "--grid-shots")
    if args.baseline_shots is not None:
        _shot_counts(args.baseline_shots, "--baseline-shots")
    given = args.calibration_arg
    args.calibration, args.label_free = None, None
    if given in LABEL_FREE:
        args.label_free = given
    elif given:
        check_file(given, "--calibration")
        try:
            Calibration.load(given)
        except CalibrationError as e:
            raise UsageError(f"--calibration: {e}") from e
        args.calibration = given
    if args.label_free_grid and (given or args.scoring != "full" or args.from_report):
        raise UsageError(
            "--label-free-grid runs raw, contextual, PMI and fitted itself; give it neither "
            f"--calibration, --scoring nor --from-report (got --calibration {given!r}, "
            f"--scoring {args.scoring!r}, --from-report {args.from_report!r})."
        )
    if args.from_report and (args.label_free or args.scoring != "full" or args.shots):
        raise UsageError(
            "--from-report recomputes a saved report under a calibration file; its scores, "
            "shots and label-free correction are those it was made with, so --calibration "
            f"{given!r}, --scoring {args.scoring!r} and --shots {args.shots} do not apply "
            "(accepted with --from-report: --calibration FILE)."
        )
    if args.cascade is not None:
        parts = [p.strip() for p in args.cascade.split(",")]
        if len(parts) != 2 or not all(parts):
            raise UsageError(
                "--cascade takes SMALL,LARGE: two `pcd eval --out` reports or models, "
                f"comma-separated; got {args.cascade!r}."
            )
        if args.label_free_grid or args.from_report or given:
            raise UsageError(
                "--cascade runs its own gates (raw, fitted, contextual); give it neither "
                "--label-free-grid, --from-report nor --calibration."
            )
        for flag, v in (
            ("--max-escalation", args.max_escalation),
            ("--max-accuracy-loss", args.max_accuracy_loss),
        ):
            if not 0.0 <= v <= 1.0:
                raise UsageError(f"{flag} must lie in [0, 1] (a fraction); got {v}.")
        wall = args.cascade_wall
        if wall is not None and (len(wall.split(",")) != 2 or not all(wall.split(","))):
            raise UsageError(f"--cascade-wall takes SMALL,LARGE (two models); got {wall!r}.")
        if args.cascade_wall_n is not None and args.cascade_wall_n < 1:
            raise UsageError(f"--cascade-wall-n must be >= 1; got {args.cascade_wall_n}.")
        if args.cascade_top_k is not None and args.cascade_top_k < 1:
            raise UsageError(f"--cascade-top-k must be >= 1; got {args.cascade_top_k}.")
        if args.cascade_contextual:
            check_file(args.cascade_contextual, "--cascade-contextual")
    if args.scoring == "pmi" and args.label_free == "contextual":
        raise UsageError(
            "--scoring pmi with --calibration contextual: both divide out the model's answer "
            "prior, so they are not combined; accepted: one of them."
        )


def run(args: argparse.Namespace) -> int:
    """Runs `pcd eval`: evaluate (or rescore a saved report), then print or save the report.

    Args:
        args: The parsed arguments.

    Returns:
        The exit code.
    """
    from rich.console import Console

    from ..answers.calibration import Calibration, read_json
    from ..eval.evaluate import EvalError, evaluate, rescore
    from ..eval.order_bias import order_bias

    check_args(args)
    t0 = time.perf_counter()
    err = Console(stderr=True)
    ds = dataset_from_args(args)
    if args.label_free_grid:
        return _grid(args, ds)
    if args.cascade:
        return _cascade(args, ds)
    if args.from_report:
        saved = read_json(args.from_report, "report", EvalError)
        cal = Calibration.load(args.calibration) if args.calibration else None
        _check_disjoint(cal, ds.name, [it.get("id") for it in saved.get("items") or []])
        report = rescore(saved, ds.schema, cal, temperature=args.temperature)
        return _finish(args, ds, report, t0=None)
    from ..eval.shots import draw_shots

    split = ds.eval_sample(args.n, args.seed)
    shots = draw_shots(ds, args.shots, seed=args.shots_seed, eval_ids=split.ids)
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
        shots=shots,
        calibration=args.label_free,
        scoring=args.scoring,
        pruning=args.pruning,
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


def _grid(args: argparse.Namespace, ds: Dataset) -> int:
    """`pcd eval --label-free-grid`: the grid, printed and optionally saved (`--out`)."""
    from rich.console import Console

    from ..eval.label_free import label_free_grid
    from ..eval.report import print_label_free_grid

    with Console(stderr=True).status("Loading model..."):
        decider = load_decider(args)
    ks = _shot_counts(args.grid_shots, "--grid-shots")
    grid = label_free_grid(
        ds,
        decider=decider,
        shots=ks,
        n=args.n,
        seed=args.seed,
        cal_n=args.cal_n,
        cal_seed=args.cal_seed,
        shots_seed=args.shots_seed,
        batch_size=args.batch_size,
        latency_n=args.latency_n,
        baseline_n=0 if args.no_baseline else args.baseline_n,
        baseline_shots=(
            _shot_counts(args.baseline_shots, "--baseline-shots")
            if args.baseline_shots is not None
            else None
        ),
        progress=True,
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(grid, indent=1, default=str) + "\n")
    if args.json:
        print(json.dumps(grid, indent=2, default=str))
    else:
        print_label_free_grid(Console(width=150), grid)
    return 0


def _cascade_run(args: argparse.Namespace, ds: Dataset, what: str, split: Any) -> tuple[Any, Any]:
    """`(ModelRun, Decider or None)` of one `--cascade` part: a saved report, or a model
    run on the evaluation sample."""
    from ..answers.calibration import read_json
    from ..decide.decider import Decider
    from ..engine.load.sources import model_source
    from ..eval.cascade import ModelRun
    from ..eval.runner import run_pcd

    if Path(what).is_file() and what.endswith(".json"):
        return ModelRun.from_report(read_json(what, "report"), where=what), None
    decider = Decider.load(model_source(what))
    decisions, _ = run_pcd(
        decider,
        ds.schema,
        [t for t, _ in split.examples],
        batch_size=args.batch_size,
        progress=True,
        label=f"PCD {decider.model_id}",
    )
    return (
        ModelRun.from_decisions(
            ds.schema, decisions, [lab for _, lab in split.examples], split.ids
        ),
        decider,
    )


def _cascade(args: argparse.Namespace, ds: Dataset) -> int:
    """`pcd eval --cascade SMALL,LARGE`: sweep, gates and fits from both models' results;
    with two models, one real batched cascade run at the fitted thresholds, timed against
    the large model alone on the held-out items."""
    from rich.console import Console

    from ..answers.calibration import read_json
    from ..eval.cascade import ModelRun, cascade_report
    from ..eval.report import print_cascade_report

    split = ds.eval_sample(args.n, args.seed)
    small_what, large_what = (p.strip() for p in args.cascade.split(","))
    small, small_d = _cascade_run(args, ds, small_what, split)
    large, large_d = _cascade_run(args, ds, large_what, split)
    ctx = None
    if args.cascade_contextual:
        ctx = ModelRun.from_report(
            read_json(args.cascade_contextual, "report"), where=args.cascade_contextual
        )
    report = cascade_report(
        ds.schema,
        small,
        large,
        contextual=ctx,
        seed=args.cascade_seed,
        top_k=args.cascade_top_k,
        max_escalation=args.max_escalation,
        max_accuracy_loss=args.max_accuracy_loss,
        dataset=ds.name,
    )
    if args.cascade_wall:
        from ..decide.decider import Decider
        from ..engine.load.sources import model_source

        small_d, large_d = (Decider.load(model_source(p)) for p in args.cascade_wall.split(","))
    if small_d is not None and large_d is not None:
        report["wall"] = _cascade_wall(args, ds, split, report, small, small_d, large_d)
    if args.diagrams:
        from ..eval.plots import cascade_curve

        cascade_curve(report, Path(args.diagrams) / f"cascade-{ds.name}.png")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1, default=str) + "\n")
    if args.json:
        skip = ("gates", "calibration_ids", "held_out_ids")  # in --out
        print(json.dumps({k: v for k, v in report.items() if k not in skip}, indent=2, default=str))
    else:
        print_cascade_report(Console(width=150), report)
    return 0


# The fits `cascade_report` makes, which `--cascade-wall-fit` may time.
WALL_FITS = (
    "max_accuracy_loss/best",
    "max_escalation/best",
    "max_escalation/best/bound",
    "max_accuracy_loss/raw/probability",
    "max_escalation/raw/probability",
    "max_accuracy_loss/raw/probability/bound",
)


def _cascade_wall(
    args: argparse.Namespace,
    ds: Dataset,
    split: Any,
    report: dict[str, Any],
    small_run: Any,
    small: Any,
    large: Any,
) -> dict[str, Any]:
    """The real cascade (`Cascade.batch`) at the `--cascade-wall-fit` thresholds on the
    held-out items, and the large model alone on them, each timed once. A fit on the small
    model's fitted calibration runs with that calibration (fitted on the calibration
    items, as the report's); a fit on contextual confidences runs the same target's
    raw-probability fit instead."""
    from ..agents.cascade import Cascade
    from ..eval.cascade import fitted_calibration
    from ..schema import compile_schema

    held = set(report["held_out_ids"])
    rows = [(t, lab) for (t, lab), i in zip(split.examples, split.ids) if i in held]
    rows = rows[: args.cascade_wall_n]
    texts = [t for t, _ in rows]
    fit = report["fits"][args.cascade_wall_fit]
    source = fit["gate"].split("/")[0]
    if source == "fitted":
        cal_run = small_run.subset(report["calibration_ids"])
        small = small.with_calibration(fitted_calibration(compile_schema(ds.schema), cal_run))
    elif source != "raw":  # say which fit ran
        fit = report["fits"][f"{fit['target']}/raw/probability"]
    per_field = {n: (sc, t) for n, (sc, t) in fit["thresholds"].items()}
    casc = Cascade(ds.schema, [small, large], threshold=0.0, per_field=per_field)
    for d in (small, large):  # warm: the schema's prompt cache, loaded weights
        d.decide(ds.schema, texts[0])
    t0 = time.perf_counter()
    alone = large.decide_many(ds.schema, texts, batch_size=args.batch_size)
    large_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    small.decide_many(ds.schema, texts, batch_size=args.batch_size)
    small_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = casc.batch(texts)
    casc_s = time.perf_counter() - t0
    names = list(fit["thresholds"])

    def accuracy(decisions: Sequence[Any]) -> float:
        ok = [
            sum(o.fields[n].label == lab.get(n) for n in names if lab.get(n) is not None)
            / max(1, sum(lab.get(n) is not None for n in names))
            for o, (_, lab) in zip(decisions, rows)
        ]
        return sum(ok) / max(1, len(ok))

    escalated = sum(1 for o in out if len(o.stages) > 1)
    return {
        "fit": fit["target"] + "/" + fit["gate"],
        "small_calibration": small.calibration is not None,
        "n": len(texts),
        "large_only_s": large_s,
        "small_only_s": small_s,
        "cascade_s": casc_s,
        "ratio": casc_s / large_s if large_s else float("nan"),
        "escalation": escalated / max(1, len(texts)),
        "accuracy": accuracy(out),
        "large_accuracy": accuracy(alone),
    }


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
