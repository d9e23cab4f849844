"""`pcd calibrate`: fit a calibration per field on labelled data.

It fits on a calibration sample kept apart from the evaluation sample, saves the
calibration JSON, and optionally chooses thresholds, draws before/after diagrams and
writes the raw scores (with the content-free offsets of the label-free corrections),
from which `--from-scores` refits without the model.

The default `--method auto` (before this release: `temperature`) chooses per field, by
cross-validation on the calibration sample only, among no change, temperature,
temperature and biases, and the label-free corrections with or without a temperature,
never one that does worse than no change (`pcd_tools.eval.auto`). `--shots K` fits for
the schema with the K examples `pcd eval --shots K` draws (same seeds), kept out of the
calibration sample.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from ._common import UsageError, check_at_least, check_file, load_decider
from ._data import add_data_arguments, dataset_from_args

HELP = "fit a calibration per field on labelled data (default: auto)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `pcd calibrate` options (the dispatcher adds `--model` and `--json`).

    Args:
        parser: The sub-command's parser.
    """
    from ..eval.calibration import METHODS, OBJECTIVES

    add_data_arguments(parser)
    parser.add_argument("--n", type=int, default=300, help="calibration sample size (default 300)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the calibration sample")
    parser.add_argument(
        "--eval-n",
        type=int,
        default=300,
        help="size of the evaluation sample to keep out (default 300)",
    )
    parser.add_argument("--eval-seed", type=int, default=0, help="seed of that evaluation sample")
    parser.add_argument(
        "--out", default=None, help="output JSON (default calibration-<dataset>.json)"
    )
    parser.add_argument("--diagrams", default=None, help="folder for before/after reliability PNGs")
    parser.add_argument(
        "--target-risk",
        type=float,
        default=None,
        help="also choose per-field thresholds for this error rate (on 5-fold cross-fitted "
        "calibrated confidences)",
    )
    parser.add_argument(
        "--target-coverage",
        type=float,
        default=None,
        help="also choose per-field thresholds for this coverage (cross-fitted likewise)",
    )
    parser.add_argument(
        "--objective",
        choices=sorted(OBJECTIVES),
        default=None,
        help="loss the temperatures minimise (default: top_label_nll for auto, nll "
        "otherwise); with biases, top_label_nll refits the temperature on the answer's "
        "correctness after the biases",
    )
    parser.add_argument(
        "--conformal-folds",
        type=int,
        default=None,
        metavar="K",
        help="prediction sets' conformal scores under the calibration refitted without "
        "each item's fold (K folds) instead of the one fitted on every item",
    )
    parser.add_argument(
        "--method",
        choices=METHODS,
        default="auto",
        help="auto (default; before this release temperature): per field, no change, "
        "temperature, temperature+bias or a label-free correction, by cross-validated "
        "error of the top-label confidence, never worse than no change; temperature: one "
        "per field; temperature_bias: plus a bias per allowed value (can change answers)",
    )
    parser.add_argument(
        "--shots",
        type=int,
        default=0,
        metavar="K",
        help="fit for the schema with the K examples `pcd eval --shots K` draws (default 0)",
    )
    parser.add_argument("--shots-seed", type=int, default=1, help="seed of the shots' draw")
    parser.add_argument(
        "--scores", default=None, help="also write the raw log scores and gold labels (JSON)"
    )
    parser.add_argument(
        "--from-scores",
        default=None,
        metavar="SCORES",
        help="refit from a --scores file of an earlier run instead of running the model",
    )
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--cascade",
        default=None,
        metavar="LARGE",
        help="also fit per-field cascade thresholds to --cascade-target, for escalating to "
        "this larger model (run on the same calibration sample); Cascade(threshold='fitted') "
        "reads them",
    )
    parser.add_argument(
        "--cascade-target",
        default="max_accuracy_loss=0.01",
        metavar="NAME=VALUE",
        help="max_escalation=RATE (best accuracy within that budget) or "
        "max_accuracy_loss=POINTS (least escalation within that of large-only; default 0.01)",
    )
    parser.add_argument(
        "--cascade-confidence",
        type=float,
        default=None,
        metavar="LEVEL",
        help="hold the target to a one-sided confidence bound at this level (e.g. 0.9) "
        "instead of the point estimate: the loss's lower bound for max_accuracy_loss, the "
        "escalation rate's upper bound for max_escalation",
    )
    parser.add_argument(
        "--cascade-signal",
        choices=("probability", "margin", "entropy"),
        default="probability",
        help="the gate's signal (default probability)",
    )


def _read_scores(path: str) -> dict[str, Any]:
    """A `--scores` file of an earlier `pcd calibrate` run."""
    from ..answers.calibration import CalibrationError, read_json

    raw = read_json(path, "scores file")
    need = ("model_id", "schema_fingerprint", "fields")
    missing = [k for k in need if not isinstance(raw, dict) or k not in raw]
    if missing:
        raise CalibrationError(
            f"scores file {path!r} lacks {missing}; write it with `pcd calibrate --scores`."
        )
    return raw


def _saved_scores(args: argparse.Namespace, ds: Any, fingerprint: str) -> tuple[Any, ...]:
    """`(arrays, model_id, scoring, compute, fitted_on, offsets)` from the `--from-scores`
    file (compute None for a file written before it was recorded)."""
    from ..answers.calibration import CalibrationMismatchError

    saved = _read_scores(args.from_scores)
    if saved["schema_fingerprint"] != fingerprint:
        raise CalibrationMismatchError(
            f"scores file {args.from_scores!r} was written for schema fingerprint "
            f"{saved['schema_fingerprint']}, but {ds.name}'s schema is "
            f"{fingerprint}; rerun `pcd calibrate --scores`."
        )
    arrays = {
        n: (np.asarray(f["log_scores"], np.float64), np.asarray(f["gold"], np.int64))
        for n, f in saved["fields"].items()
    }
    fitted_on = dict(saved.get("fitted_on") or {"ids": saved.get("ids")})
    fitted_on["from_scores"] = str(args.from_scores)
    offsets = {
        m: {k: np.asarray(o, np.float64) for k, o in per.items()}
        for m, per in (saved.get("content_free_offsets") or {}).items()
    }
    scoring, compute = saved.get("scoring", "full"), saved.get("compute")
    return arrays, saved["model_id"], scoring, compute, fitted_on, offsets or None


def _calibration_split(args: argparse.Namespace, ds: Any) -> tuple[Any, Any]:
    """The calibration sample and the shots (kept out of it), as `pcd eval` draws them."""
    from ..eval.shots import draw_shots

    shared_pool = ds.calibration_split is ds.eval_split
    held = ds.eval_sample(args.eval_n, args.eval_seed).ids if shared_pool else []
    shots = draw_shots(ds, args.shots, seed=args.shots_seed, eval_ids=held)
    if not shots.k:
        split = ds.calibration_sample(
            args.n, args.seed, eval_n=args.eval_n, eval_seed=args.eval_seed
        )
    else:
        split = ds.calibration_split.sample(args.n, args.seed, exclude_ids=[*held, *shots.ids])
    return split, shots


def _new_scores(args: argparse.Namespace, ds: Any, compiled: Any, console: Any) -> tuple[Any, ...]:
    """`(arrays, model_id, scoring, compute, fitted_on, offsets)` from running the model."""
    from ..answers.calibration import CalibrationError
    from ..eval.calibration import content_free_offsets, field_arrays
    from ..eval.runner import run_pcd

    split, shots = _calibration_split(args, ds)
    shared_pool = ds.calibration_split is ds.eval_split
    with console.status("Loading model..."):
        decider = load_decider(args)
    labels = [lab for _, lab in split.examples]
    decisions, _ = run_pcd(
        decider,
        compiled,
        [t for t, _ in split.examples],
        batch_size=args.batch_size,
        progress=True,
        label="calibrating",
    )
    if not decisions:
        raise CalibrationError("calibrate needs at least one labelled example.")
    args.cascade_small = (split, decisions)
    fitted_on = {
        "dataset": ds.name,
        "source": ds.source,
        "split": split.name,
        "n": len(split),
        "seed": args.seed,
        "excluded_eval_sample": {"n": args.eval_n, "seed": args.eval_seed} if shared_pool else None,
        "ids": split.ids,
    }
    if shots.k:
        fitted_on["shots"] = {k: v for k, v in shots.to_dict().items() if k != "examples"}
    arrays = field_arrays(compiled, decisions, labels)
    first = decisions[0]
    model_id, scoring = first.model_id, first.scoring
    offsets = None
    if first.calibration_method == "none" and scoring != "pmi":  # kept in --scores too
        offsets = content_free_offsets(decider, compiled, scoring)
    if args.scores:
        Path(args.scores).write_text(
            json.dumps(
                {
                    "model_id": model_id,
                    "schema_fingerprint": compiled.fingerprint(),
                    "scoring": scoring,
                    "compute": first.compute,
                    "fitted_on": fitted_on,
                    "ids": split.ids,
                    "fields": {
                        n: {"log_scores": z.round(5).tolist(), "gold": g.tolist()}
                        for n, (z, g) in arrays.items()
                    },
                    "content_free_offsets": {
                        m: {k: o.round(6).tolist() for k, o in per.items()}
                        for m, per in (offsets or {}).items()
                    },
                }
            )
        )
    return arrays, model_id, scoring, first.compute, fitted_on, offsets


def _fit_cascade(args: argparse.Namespace, compiled: Any, cal: Any, console: Any) -> Any:
    """`--cascade LARGE`: runs the large model on the calibration sample and fits the
    per-field thresholds on the small model's calibrated confidences, cross-fitted: each
    item scored by `cal` refitted without its fold (`cross_fit`), since `cal` itself was
    fitted on these items and is surer on them than on new ones."""
    from ..decide.decider import Decider
    from ..engine.load.sources import model_source
    from ..eval.cascade import ModelRun, cross_fit, fit_cascade
    from ..eval.runner import run_pcd

    split, small = args.cascade_small
    labels = [lab for _, lab in split.examples]
    with console.status(f"Loading {args.cascade}..."):
        large = Decider.load(model_source(args.cascade))
    big, _ = run_pcd(
        large,
        compiled,
        [t for t, _ in split.examples],
        batch_size=args.batch_size,
        progress=True,
        label=f"cascade: {large.model_id}",
    )
    small_run = ModelRun.from_decisions(compiled, small, labels, split.ids)
    return fit_cascade(
        compiled,
        small_run,
        ModelRun.from_decisions(compiled, big, labels, split.ids),
        signal=args.cascade_signal,
        calibration=cross_fit(compiled, small_run, cal, folds=max(2, min(5, len(split.ids)))),
        confidence_level=args.cascade_confidence,
        **cascade_target(args.cascade_target),  # type: ignore[arg-type]
    )


def check_args(args: argparse.Namespace) -> None:
    """Checks the `pcd calibrate` options that need no data or model.

    Args:
        args: The parsed arguments.

    Raises:
        UsageError: naming the first bad option (`pcd` exits 2).
    """
    check_at_least(args, 1, "n", "batch_size")
    check_at_least(args, 0, "eval_n", "shots")
    if args.conformal_folds is not None and args.conformal_folds < 2:
        raise UsageError(f"--conformal-folds must be at least 2; got {args.conformal_folds}.")
    risk, cov = args.target_risk, args.target_coverage
    if risk is not None and cov is not None:
        raise UsageError(
            f"give one of --target-risk or --target-coverage, not both; got --target-risk {risk} "
            f"and --target-coverage {cov}."
        )
    if risk is not None and not 0.0 <= risk <= 1.0:
        raise UsageError(f"--target-risk must lie in [0, 1] (an error rate); got {risk}.")
    if cov is not None and not 0.0 < cov <= 1.0:
        raise UsageError(f"--target-coverage must lie in (0, 1] (a fraction); got {cov}.")
    if args.from_scores:
        check_file(args.from_scores, "--from-scores")
    if args.cascade is not None:
        if args.from_scores:
            raise UsageError(
                "--cascade runs both models on the calibration sample, so it cannot refit "
                "from --from-scores; drop one of them."
            )
        cascade_target(args.cascade_target)
        level = args.cascade_confidence
        if level is not None and not 0.5 <= level < 1.0:
            raise UsageError(f"--cascade-confidence must lie in [0.5, 1); got {level}.")


def cascade_target(text: str) -> dict[str, float]:
    """`--cascade-target NAME=VALUE` as `fit_cascade`'s keyword.

    Raises:
        UsageError: for another name or a value outside [0, 1].
    """
    name, _, value = text.partition("=")
    names = ("max_escalation", "max_accuracy_loss")
    try:
        v = float(value)
    except ValueError:
        v = math.nan
    if name.strip() not in names or not 0.0 <= v <= 1.0:
        raise UsageError(
            f"--cascade-target takes NAME=VALUE with NAME one of {list(names)} and VALUE a "
            f"fraction in [0, 1] (e.g. max_escalation=0.3); got {text!r}."
        )
    return {name.strip(): v}


def run(args: argparse.Namespace) -> int:
    """Runs `pcd calibrate`: fit, save, and optionally draw diagrams and choose thresholds.

    Args:
        args: The parsed arguments.

    Returns:
        The exit code.
    """
    from rich.console import Console

    from ..eval.calibration import calibration_from_scores
    from ..eval.report import print_calibration
    from ..eval.thresholds import choose_threshold
    from ..schema import compile_schema, with_examples

    check_args(args)
    console = Console(stderr=True)
    ds = dataset_from_args(args)
    compiled = compile_schema(ds.schema)
    if args.shots:
        shots = _calibration_split(args, ds)[1]
        compiled = with_examples(compiled, shots.examples, "the drawn shots")
    t0 = time.perf_counter()
    if args.from_scores:
        got = _saved_scores(args, ds, compiled.fingerprint())
    else:
        got = _new_scores(args, ds, compiled, console)
    arrays, model_id, scoring, compute, fitted_on, offsets = got
    cal = calibration_from_scores(
        compiled,
        arrays,
        model_id=model_id,
        scoring=scoring,
        compute=compute,
        fitted_on=fitted_on,
        objective=args.objective,
        method=args.method,
        offsets=offsets if args.method == "auto" else None,
        conformal_folds=args.conformal_folds,
    )
    if args.target_risk is not None or args.target_coverage is not None:
        from ..eval.refit import out_of_fold

        for name, (z, g) in arrays.items():
            # the threshold sees each item as the calibration refitted without its fold
            # sees it: the calibration fitted on these items is surer here than on new ones
            after = (
                out_of_fold(cal, name, z, g, folds=min(5, len(g)))
                if len(g) >= 2
                else cal.probabilities(name, z)
            )
            cal.thresholds[name] = choose_threshold(
                after.max(axis=1),
                after.argmax(axis=1) == g,
                target_risk=args.target_risk,
                target_coverage=args.target_coverage,
            ).to_dict()
    if args.cascade:
        _fit_cascade(args, compiled, cal, console).attach(cal)
    if args.diagrams:
        from ..eval.plots import calibration_diagrams

        calibration_diagrams(cal, arrays, args.diagrams, name=ds.name)
    out = cal.save(args.out or f"calibration-{ds.name}.json")
    elapsed = time.perf_counter() - t0
    if args.json:
        print(
            json.dumps(
                {**cal.to_dict(), "path": str(out), "elapsed_s": round(elapsed, 1)}, indent=2
            )
        )
        return 0
    out_console = Console(width=150)
    print_calibration(out_console, cal, dataset=ds.name)
    out_console.print(f"saved {out}  ({elapsed:.1f} s)")
    return 0
