"""The label-free grid: few-shot examples × label-free corrections, on one dataset.

`label_free_grid(dataset)` measures, for each shot count (default 0, 4 and 8 examples
drawn by `shots.draw_shots` from the calibration split) and each method:

- `raw`: PCD's scores as they come out;
- `contextual`: contextual calibration (`decide(..., calibration="contextual")`);
- `pmi`: domain-conditional PMI (`scoring="pmi"`);
- `fitted`: the default `auto` calibration (`pcd_tools.eval.auto`), fitted on a
  calibration sample scored with the same examples (disjoint from the evaluation
  sample and from every shot);
- `auto`: `decide(..., calibration="auto")`, the label-free recipe (raw, PMI or
  contextual) chosen by leave-one-out over the shots themselves (`pcd_tools.decide.loo`;
  raw at zero shots). Its metrics are the chosen recipe's; the row's `auto` says what
  was chosen and each recipe's leave-one-out accuracy,

accuracy, macro-F1, ECE (with its floor) and everything else `metrics.field_metrics`
gives, per field, plus the warm latency of one request.

**One scoring pass per shot count.** Both label-free corrections subtract a fixed
per-value offset, measured once on the content-free inputs of the same prompt, from the
raw scores (`fit_data.content_free_offsets`). So the evaluation sample is scored once
raw, and `contextual` and `pmi` are the raw scores minus the cached offsets, as the
library computes them. The latency items are decided by the library with each method,
which both times them and checks that derivation (`consistency`: the largest difference
between the library's corrected log scores and the derived ones). A field the offsets do
not cover (scored jointly or in a later wave) gets its own pass with that method.

**Warm latency.** After one untimed request has put the prompt's prefix (schema and
examples) in the cache, `latency_n` requests are decided one at a time with each method;
the table gives their median wall time. `fitted` is timed with the calibration on the
decider.

**Warm ratio across shot counts.** Because the per-row timings above are taken minutes
apart, the grid also times the shot counts side by side: for each of `latency_n` texts,
one raw request per shot count, one after the other (every prefix already cached), and
reports each shot count's median and range of its time over the zero-shot time of the same
text (`warm_ratio`). That ratio holds under a changing background load.

**Baseline.** With `baseline_n > 0`, grammar-constrained generation is run, given the
same examples in the same prompt, on a stratified subsample of `baseline_n` evaluation
items for each shot count in `baseline_shots`, and PCD's methods are scored on the same
items beside it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..answers.calibration import Calibration
from ..answers.softmax import softmax
from ..decide.loo import choose
from ..decide.options import DecideOptions
from ..errors import InvalidArgumentError
from ..schema import Schema, compile_schema, with_examples
from .calibration import calibration_from_scores, content_free_offsets, field_arrays
from .datasets import Dataset, Split
from .fit_data import label_free_scores
from .metrics import field_metrics
from .runner import progress_bar, run_pcd
from .scoring import baseline_method
from .shots import Shots, draw_shots

if TYPE_CHECKING:
    from ..decide.decider import Decider

__all__ = ["GRID_METHODS", "label_free_grid"]

GRID_METHODS = ("raw", "contextual", "pmi", "fitted", "auto")
# `calibration="auto"`'s recipes as the grid's methods
_AUTO_METHOD = {"none": "raw", "pmi": "pmi", "contextual": "contextual"}
Arrays = dict[str, tuple[np.ndarray, np.ndarray]]


def _finite(x: Any) -> Any:
    """NaN and infinities as `None`, recursively, so the grid is strict JSON."""
    if isinstance(x, float) and not np.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _metrics(arrays: Arrays, probs_of: Callable[[str, np.ndarray], np.ndarray]) -> dict[str, Any]:
    return {k: field_metrics(probs_of(k, z), g).to_dict() for k, (z, g) in arrays.items()}


def _subset(arrays: Arrays, rows: Mapping[str, np.ndarray]) -> Arrays:
    return {k: (z[rows[k]], g[rows[k]]) for k, (z, g) in arrays.items()}


def _score(
    decider: Decider,
    schema: Schema,
    split: Split,
    batch_size: int,
    progress: bool,
    label: str,
    **how: Any,
) -> Arrays:
    """Field key -> (log scores, gold) of the split, decided as `how` says."""
    decisions, _ = run_pcd(
        decider,
        schema,
        [t for t, _ in split.examples],
        batch_size=batch_size,
        progress=progress,
        label=label,
        **how,
    )
    return field_arrays(schema, decisions, [lab for _, lab in split.examples])


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1e3, out


def _latency(
    decider: Decider, cal: Calibration, schema: Schema, texts: Sequence[str], offsets: Any
) -> tuple[dict[str, float], dict[str, float]]:
    """Median warm wall time of one request per method, and the largest difference
    between the library's corrected log scores and `raw - offset`."""
    fitted = decider.with_calibration(cal)
    calls: dict[str, Callable[[str], Any]] = {
        "raw": lambda t: decider.decide(schema, t, calibration="none"),
        "contextual": lambda t: decider.decide(schema, t, calibration="contextual"),
        "pmi": lambda t: decider.decide(schema, t, scoring="pmi", calibration="none"),
        "fitted": lambda t: fitted.decide(schema, t),
    }
    for call in calls.values():  # the prefix and the content-free scores, cached
        call(texts[0])
    ms: dict[str, list[float]] = {m: [] for m in calls}
    diff = {"contextual": 0.0, "pmi": 0.0}
    for text in texts:
        got = {}
        for m, call in calls.items():
            wall, got[m] = _timed(lambda: call(text))  # noqa: B023 - called at once
            ms[m].append(wall)
        for m in diff:
            for name, f in got[m].fields.items():
                o = offsets.get(m, {}).get(name)
                if o is None or f.labels is not None:
                    continue
                want = np.asarray(got["raw"].fields[name].log_scores) - o
                diff[m] = max(diff[m], float(np.abs(np.asarray(f.log_scores) - want).max()))
    return {m: statistics.median(v) for m, v in ms.items()}, diff


def _warm_ratio(
    decider: Decider, schemas: Mapping[int, Schema], texts: Sequence[str]
) -> dict[str, dict[str, float]]:
    """Per shot count: median, min and max over `texts` of its warm raw request time
    over the first shot count's time on the same text, the requests interleaved."""
    for schema in schemas.values():  # every prefix in the cache
        decider.decide(schema, texts[0], calibration="none")
    ks = list(schemas)
    ratios: dict[int, list[float]] = {k: [] for k in ks[1:]}
    for text in texts:
        ms = {
            k: _timed(lambda: decider.decide(schemas[k], text, calibration="none"))[0]  # noqa: B023
            for k in ks
        }
        for k in ks[1:]:
            ratios[k].append(ms[k] / ms[ks[0]])
    return {
        str(k): {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
        for k, v in ratios.items()
    }


def _baseline(
    decider: Decider,
    schema: Schema,
    sub: Split,
    progress: bool,
    label: str,
) -> tuple[dict[str, Any], list[float]]:
    from ..baselines.generation import constrained_json

    results, ms = [], []
    with progress_bar(len(sub), label, progress) as advance:
        for text, _ in sub.examples:
            wall, res = _timed(lambda: constrained_json(decider, schema, text))  # noqa: B023
            results.append(res)
            ms.append(float(getattr(res, "wall_ms", None) or wall))
            advance(1)
    m = baseline_method(schema, results, [lab for _, lab in sub.examples], ms)
    return m.to_dict(), ms


def _one_shot_count(
    ds: Dataset,
    decider: Decider,
    compiled: Schema,
    shots: Shots,
    ev: Split,
    cal_split: Split,
    opts: dict[str, Any],
) -> dict[str, Any]:
    """One row of the grid: every method at one shot count (see `label_free_grid`)."""
    k = shots.k
    schema = with_examples(compiled, shots.examples, "the drawn shots") if k else compiled
    progress, bs = opts["progress"], opts["batch_size"]
    offsets = content_free_offsets(decider, schema, "full")
    decider.decide(schema, ev.examples[0][0], calibration="none")  # warm the prefix
    raw = _score(decider, schema, ev, bs, progress, f"{k}-shot raw", calibration="none")
    cal_arrays = _score(
        decider, schema, cal_split, bs, progress, f"{k}-shot calibration", calibration="none"
    )
    cal = calibration_from_scores(
        schema,
        cal_arrays,
        model_id=decider.model_id,
        compute=decider.loaded.compute,
        fitted_on={"dataset": ds.name, "split": cal_split.name, "n": len(cal_split)},
        offsets=offsets,
    )
    per_method: dict[str, Arrays] = {"raw": raw}
    how = {"contextual": {"calibration": "contextual"}, "pmi": {"scoring": "pmi"}}
    derived = {}
    for m in ("contextual", "pmi"):
        derived[m] = all(key in offsets[m] for key in raw)
        if derived[m]:
            per_method[m] = label_free_scores(raw, offsets[m])
        else:
            per_method[m] = _score(decider, schema, ev, bs, progress, f"{k}-shot {m}", **how[m])

    def plain(_: str, z: np.ndarray) -> np.ndarray:
        return softmax(z, 1.0)

    fields = {m: _metrics(per_method[m], plain) for m in ("raw", "contextual", "pmi")}
    fields["fitted"] = _metrics(raw, lambda key, z: np.asarray(cal.probabilities(key, z)))
    t_loo, (_, choice) = _timed(lambda: choose(decider, schema, DecideOptions()))
    auto = _AUTO_METHOD[choice.method]
    fields["auto"] = fields[auto]
    texts = [t for t, _ in ev.examples[: opts["latency_n"]]]
    latency, consistency = _latency(decider, cal, schema, texts, offsets)
    latency["auto"] = latency[auto]
    out: dict[str, Any] = {
        "shots": k,
        "shot_ids": list(shots.ids),
        "fields": fields,
        "auto": {**choice.to_dict(), "grid_method": auto, "loo_ms": t_loo},
        "latency_ms": latency,
        "latency_n": len(texts),
        "consistency": {m: consistency[m] for m in derived if derived[m]},
        "derived": derived,
        "calibration": {
            key: {
                kk: v
                for kk, v in m.items()
                if kk in ("method", "why", "cv", "label_free", "n", "ece_after", "ece_before")
            }
            for key, m in cal.metrics.items()
        },
        "fingerprint": schema.fingerprint(),
    }
    if opts["baseline_n"] and k in opts["baseline_shots"]:
        sub = ev.sample(opts["baseline_n"], opts["seed"])
        keep = set(sub.ids)
        rows = {}
        for key in raw:
            name = key.split("[")[0]
            labelled = [i for i, (_, lab) in zip(ev.ids, ev.examples) if name in lab]
            rows[key] = np.array([j for j, i in enumerate(labelled) if i in keep], dtype=np.int64)
        base, _ = _baseline(decider, schema, sub, progress, f"{k}-shot baseline")
        pcd = {
            m: _metrics(_subset(per_method[m], rows), plain) for m in ("raw", "contextual", "pmi")
        }
        pcd["fitted"] = _metrics(
            _subset(raw, rows), lambda key, z: np.asarray(cal.probabilities(key, z))
        )
        pcd["auto"] = pcd[auto]
        out["baseline"] = {"n": len(sub), "ids": sub.ids, "method": base, "pcd": pcd}
    return out


def label_free_grid(
    dataset: Dataset,
    *,
    decider: Decider,
    shots: Sequence[int] = (0, 4, 8),
    n: int = 300,
    seed: int = 0,
    cal_n: int = 200,
    cal_seed: int = 1,
    shots_seed: int = 1,
    batch_size: int = 8,
    latency_n: int = 10,
    baseline_n: int = 0,
    baseline_shots: Sequence[int] | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Shot counts × label-free methods on one dataset (see the module docstring).

    Args:
        dataset: The dataset.
        decider: A decider without a fitted calibration and with label-free setting
            `none` (the grid runs each method itself).
        shots: The shot counts.
        n: Size of the stratified evaluation sample.
        seed: Its seed (and that of the baseline's subsample).
        cal_n: Size of the calibration sample the `fitted` method is fitted on (disjoint
            from the evaluation sample and from every shot).
        cal_seed: Its seed.
        shots_seed: Seed of the shots' draw.
        batch_size: PCD contexts per pass.
        latency_n: Requests timed one at a time per method and shot count (>= 1).
        baseline_n: Items for the constrained-generation baseline; 0 skips it.
        baseline_shots: The shot counts the baseline runs at (default: the largest).
        progress: Show progress bars on stderr.

    Returns:
        A strict-JSON dict: the dataset, model, samples, the main field, and `rows`, one
        per shot count, each with `shots`, `shot_ids`, `fields` (method -> field key ->
        `FieldMetrics.to_dict()`), `auto` (what `calibration="auto"` chose, its
        leave-one-out accuracies and reason, and `loo_ms`, the time it took),
        `latency_ms` (method -> median warm ms),
        `consistency`, `derived`, `calibration` (per field: the `auto` choice, its `why`
        and `cv`) and, where the baseline ran, `baseline` (its metrics and PCD's on the
        same items); and `warm_ratio` (shot count -> median, min and max of its warm raw
        time over the smallest shot count's, interleaved on the same texts).

    Raises:
        InvalidArgumentError: for a decider with a fitted calibration or label-free
            setting, or a bad shot count or size.
        DatasetError: when the calibration split has too few items for the shots.
    """
    if getattr(decider, "calibration", None) is not None or decider.label_free != "none":
        raise InvalidArgumentError(
            "the label-free grid runs every method itself; give it a decider without a "
            "fitted calibration and with calibration 'none' (no --calibration)."
        )
    ks = sorted(dict.fromkeys(int(k) for k in shots))
    if not ks or ks[0] < 0 or n < 1 or cal_n < 1 or latency_n < 1 or baseline_n < 0:
        raise InvalidArgumentError(
            f"bad grid sizes: shots {list(shots)}, n {n}, cal_n {cal_n}, latency_n "
            f"{latency_n}, baseline_n {baseline_n}; accepted: shot counts >= 0, n, cal_n "
            "and latency_n >= 1, baseline_n >= 0."
        )
    t0 = time.perf_counter()
    compiled = compile_schema(dataset.schema)
    ev = dataset.eval_sample(n, seed)
    draws = {k: draw_shots(dataset, k, seed=shots_seed, eval_ids=ev.ids) for k in ks}
    held = [*ev.ids, *(i for s in draws.values() for i in s.ids)]
    cal_split = dataset.calibration_split.sample(cal_n, cal_seed, exclude_ids=held)
    opts = {
        "progress": progress,
        "batch_size": batch_size,
        "latency_n": latency_n,
        "baseline_n": baseline_n,
        "baseline_shots": set(baseline_shots if baseline_shots is not None else ks[-1:]),
        "seed": seed,
    }
    rows = [_one_shot_count(dataset, decider, compiled, draws[k], ev, cal_split, opts) for k in ks]
    schemas = {
        k: with_examples(compiled, draws[k].examples, "the drawn shots") if k else compiled
        for k in ks
    }
    texts = [t for t, _ in ev.examples[:latency_n]]
    grid = {
        "dataset": dataset.name,
        "schema": compiled.name,
        "model_id": decider.model_id,
        "main_field": compiled.fields[0].name,
        "n": len(ev),
        "seed": seed,
        "cal_n": len(cal_split),
        "cal_seed": cal_seed,
        "cal_split": cal_split.name,
        "shots_seed": shots_seed,
        "batch_size": batch_size,
        "methods": list(GRID_METHODS),
        "rows": rows,
        "warm_ratio": {"over_shots": ks[0], **_warm_ratio(decider, schemas, texts)},
        "elapsed_s": time.perf_counter() - t0,
    }
    out: dict[str, Any] = _finite(grid)
    return out
