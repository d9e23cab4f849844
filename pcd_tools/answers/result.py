"""Results: `Decision[T]`, per-field `FieldResult`, and the seed-compatible response dict."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from ..prompt import Segment
from ..schema import FieldSpec
from .bounds import SearchReport
from .conformal import ConformalScores, NoConformalScoresError
from .taxonomy import PathStep, taxonomy_path, top_down, tree_index

if TYPE_CHECKING:
    pass

__all__ = [
    "BatchTiming",
    "Decision",
    "FieldResult",
    "LabelFreeChoice",
    "PathStep",
    "Segment",
    "choose_labels",
]

T = TypeVar("T")


@dataclass(frozen=True)
class FieldResult:
    """The answer for one field.

    A generated field (`spec.generated`) has no candidates: its `probability` is None,
    `distribution` and `log_scores` are empty, and `tokens`, `generation_ms` and
    `mean_logprob` say how it was decoded.

    Args:
        name: Field name.
        value: Native value (`bool`, `Enum` member, `str`, `int`, a generated field's
            `str`, `float`, `int`, `list[str]`, `date` or `datetime`, or `None`).
        label: JSON value of the answer (a generated date: its ISO string).
        probability: Probability of the answer; None for a generated field.
        distribution: Every candidate's JSON value -> probability, in declaration order.
        log_scores: Each candidate's log score `z_c` before temperature, after the
            decision's label-free correction if any (`z_c - log p_cf(c)` for contextual
            calibration, `z_c - z_c(empty context)` for `scoring="pmi"`).
        spec: The compiled field.
        flip_rate: With `decide(..., orders=k)`: the fraction of the k listing orders
            whose own answer differs from the averaged one; `None` for one order.
        labels: For a multi-label field, every label's probability of applying (its
            JSON value -> P(yes)); `None` for other fields. The `value` is then the list
            of chosen labels, `distribution` equals `labels`, `log_scores` hold each
            label's log-odds, and `probability` is that of the least certain label
            decision.
        tokens: For a generated field, the tokens its value took (its terminator
            included); None for a scored field.
        generation_ms: For a generated field, the wall time of writing its key and
            decoding it.
        mean_logprob: For a generated field, the mean full-vocabulary log-probability of
            its tokens (greedy decoding under the grammar); not a probability of the value.
        certified: For a field scored by pruned search (`pruning`), whether the answer is
            provably the most probable candidate; None for a field scored whole. The
            `distribution` of a pruned field holds each scored candidate at the upper
            bound of its probability and 0.0 for candidates that were never scored: under
            constrained scoring, where every unread prefix's total is known, that is its
            probability among all candidates (the values then sum to one less the unread
            mass); under full scoring, its share of the scored mass.
        unscored_mass: For a pruned field, an upper bound of the total probability the
            unscored candidates can hold; None otherwise.
        probability_bounds: For a pruned field, (lower, upper) bounds of the answer's
            true probability (the exhaustive pass's); `probability` is the upper one.
        certified_top: For a pruned field, how many of its most probable answers are
            certified, in order (`top_choices[:certified_top]` equal the exhaustive
            pass's ranking); the search certifies at least the answer unless `certified`
            is False. None for a field scored whole (every rank is exact).
        search: For a pruned field, what its search did (`SearchReport`): the levels,
            the trie positions read and their share, and whether it fell back to the
            exhaustive pass (out of levels uncertified; the answer is then exact and
            `certified` is True). None for a field scored whole.
        path: For a taxonomy (`Labels` with parents), the answer's path from the top
            level down, each level with its probability given the levels above
            (`PathStep`); they multiply to `probability`. For a pruned field each level's
            mass also counts the unread prefixes inside it where their totals are exact
            (constrained scoring), so the levels show where the model got unsure even
            where little was read, and they multiply to the answer's probability among
            all the mass (`probability_bounds[0]` at temperature 1). None for other fields.
        scoring: How this field's candidate scores were computed: `"full"`,
            `"constrained"` or `"pmi"`. Under `decide(..., scoring="auto")` (the default)
            it is `"constrained"` for a large field read by certified pruning and
            `"full"` for the others; None for a generated field.
        conformal: The split-conformal data `prediction_set` reads (the calibration's
            nonconformity scores for this field and the field's calibrated probabilities
            at temperature 1); None when the decider's calibration has none for it.
    """

    name: str
    value: Any
    label: Any
    probability: float | None
    distribution: dict[Any, float]
    log_scores: tuple[float, ...]
    spec: FieldSpec = field(repr=False)
    flip_rate: float | None = None
    labels: dict[Any, float] | None = None
    tokens: int | None = None
    generation_ms: float | None = None
    mean_logprob: float | None = None
    certified: bool | None = None
    unscored_mass: float | None = None
    probability_bounds: tuple[float, float] | None = None
    certified_top: int | None = None
    search: SearchReport | None = None
    path: tuple[PathStep, ...] | None = None
    scoring: str | None = None
    conformal: ConformalScores | None = field(default=None, repr=False, compare=False)

    def prediction_set(self, coverage: float = 0.9) -> list[Any]:
        """The smallest set of answers that holds the true one with probability at least
        `coverage`, marginally over items like the calibration split (split conformal
        prediction, `pcd_tools.answers.conformal`).

        The set holds every answer whose calibrated probability (at temperature 1,
        whatever temperature the decision used) is at least `1 - q`, where `q` is the
        `ceil((n + 1) * coverage)`-th smallest of the `n` calibration items' scores
        `1 - p(true label)`; the most probable answer is always in it. A set of one is an
        answer the calibration vouches for at that coverage; a larger one says which
        answers remain plausible.

        Args:
            coverage: `1 - alpha`, strictly between 0 and 1 (default 0.9).

        Returns:
            The answers' JSON values (labels), most probable first (ties: declared order).

        Raises:
            NoConformalScoresError: when the decider's calibration has no conformal scores
                for this field (no calibration, a file written before they were added, or
                a field that is generated, multi-label, pruned or scored jointly).
            CoverageError: for a coverage outside (0, 1).
            TooFewCalibrationItemsError: when the calibration's `n` items cannot certify
                the coverage (`coverage > n / (n + 1)`).
        """
        if self.conformal is None:
            kind = (
                "a generated field has no candidates to form a set"
                if self.generated
                else "a multi-label field has no single answer to cover"
                if self.labels is not None
                else "the decider's calibration has no conformal scores for it (no "
                "calibration, a file written before prediction sets, or a field scored "
                "jointly (`choices_by`) or by pruned search)"
            )
            raise NoConformalScoresError(
                f"field {self.name!r} has no prediction set: {kind}. Prediction sets need a "
                "calibration fitted on labelled items: `pcd calibrate --dataset ... --out "
                "cal.json` (or `pcd_tools.eval.calibration.calibrate(schema, examples)"
                ".save('cal.json')`), then `Decider.load(..., calibration='cal.json')`."
            )
        return [self.spec.choices[i].label for i in self.conformal.indices(coverage)]

    @classmethod
    def from_generated(
        cls,
        spec: FieldSpec,
        value: Any,
        label: Any,
        *,
        tokens: int,
        generation_ms: float,
        mean_logprob: float,
    ) -> FieldResult:
        """A generated field's answer: no probability, no distribution."""
        return cls(
            name=spec.name,
            value=value,
            label=label,
            probability=None,
            distribution={},
            log_scores=(),
            spec=spec,
            tokens=tokens,
            generation_ms=generation_ms,
            mean_logprob=mean_logprob,
        )

    @property
    def generated(self) -> bool:
        """Whether the value was generated (no probability) rather than scored."""
        return self.spec.generated

    @classmethod
    def from_probs(
        cls, spec: FieldSpec, probs: np.ndarray, log_scores: Any, best: int | None = None
    ) -> FieldResult:
        """The answer with the highest probability (ties: the first declared candidate),
        or the candidate `best` (a joint answer); a taxonomy decided level by level takes
        its most probable node at each level (`answers.taxonomy.top_down`)."""
        if best is None and spec.tree is not None and spec.tree.decide == "path":
            with np.errstate(divide="ignore"):
                best = top_down(tree_index(spec.tree), np.log(np.asarray(probs, float)))[0]
        best = int(np.argmax(probs)) if best is None else best
        choice = spec.choices[best]
        return cls(
            name=spec.name,
            value=choice.value,
            label=choice.label,
            probability=float(probs[best]),
            distribution={c.label: float(q) for c, q in zip(spec.choices, probs)},
            log_scores=tuple(float(z) for z in log_scores),
            spec=spec,
            path=taxonomy_path(spec, np.asarray(probs), best) if spec.tree else None,
        )

    def unsure_level(self, threshold: float) -> int | None:
        """For a taxonomy answer, the first level (0 = top) whose probability given the
        levels above is below `threshold`: where the model got unsure, so a cascade can
        escalate from there. None when every level clears it (or not a taxonomy)."""
        for i, step in enumerate(self.path or ()):
            if step.probability < threshold:
                return i
        return None

    @classmethod
    def from_labels(cls, spec: FieldSpec, p_yes: np.ndarray, log_odds: Any) -> FieldResult:
        """A multi-label answer: the labels with `P >= spec.threshold`, then the most
        probable ones added or kept to meet `spec.min_labels` / `spec.max_labels`."""
        p = np.asarray(p_yes, dtype=np.float64)
        chosen = choose_labels(p, spec.threshold, spec.min_labels, spec.max_labels)
        sure = [p[i] if i in chosen else 1.0 - p[i] for i in range(len(p))]
        probs = {c.label: float(q) for c, q in zip(spec.choices, p)}
        return cls(
            name=spec.name,
            value=[spec.choices[i].value for i in chosen],
            label=[spec.choices[i].label for i in chosen],
            probability=float(min(sure)),
            distribution=probs,
            log_scores=tuple(float(z) for z in log_odds),
            spec=spec,
            labels=dict(probs),
        )

    @property
    def top_choices(self) -> list[tuple[Any, float]]:
        """All candidates as `(label, probability)`, most probable first (ties: declared order)."""
        items = list(self.distribution.items())
        order = sorted(range(len(items)), key=lambda i: (-items[i][1], i))
        return [items[i] for i in order]

    @property
    def margin(self) -> float | None:
        """Probability of the answer minus that of the runner-up; None when generated."""
        if self.generated:
            return None
        if self.labels is not None:  # the least certain label: P(yes) - P(no), in absolute
            return float(min(abs(2.0 * q - 1.0) for q in self.labels.values()))
        top = self.top_choices
        return top[0][1] - (top[1][1] if len(top) > 1 else 0.0)

    @property
    def expected(self) -> float | None:
        """For an int range: the mean of the integers under the distribution (a `null`
        candidate's mass left out); `None` for other fields."""
        if not self.spec.ordered:
            return None
        ints = [(v, p) for v, p in self.distribution.items() if v is not None]
        mass = sum(p for _, p in ints)
        return float(sum(v * p for v, p in ints) / mass) if mass > 0 else None

    @property
    def entropy(self) -> float | None:
        """Shannon entropy of the distribution, in nats (multi-label: summed over labels'
        yes/no distributions); None when generated."""
        if self.generated:
            return None
        if self.labels is not None:
            return float(
                -sum(q * math.log(q) for p in self.labels.values() for q in (p, 1 - p) if q > 0)
            )
        return float(-sum(p * math.log(p) for p in self.distribution.values() if p > 0))

    @property
    def cardinality(self) -> int:
        """Number of candidates (0 for a generated field)."""
        return len(self.distribution)

    def telemetry(self) -> dict[str, Any]:
        """The field's entry in the response's `field_telemetry`."""
        if self.generated:
            return {
                "confidence": None,
                "cardinality": 0,
                "margin": None,
                "entropy": None,
                "top_choices": [],
                "generated": True,
                "tokens": self.tokens,
                "generation_ms": round(self.generation_ms or 0.0, 3),
                "mean_logprob": round(self.mean_logprob, 6)
                if self.mean_logprob is not None
                else None,
            }
        assert self.probability is not None and self.margin is not None
        return {
            "confidence": round(self.probability, 6),
            "cardinality": self.cardinality,
            "margin": round(self.margin, 6),
            "entropy": round(self.entropy or 0.0, 6),
            "top_choices": [{"choice": c, "probability": round(p, 6)} for c, p in self.top_choices],
            **({"expected": round(self.expected, 6)} if self.expected is not None else {}),
            **(self._pruned() if self.certified is not None else {}),
        }

    def _pruned(self) -> dict[str, Any]:
        assert self.probability_bounds is not None and self.unscored_mass is not None
        return {
            "certified": self.certified,
            "scoring": self.scoring,
            "unscored_mass": round(self.unscored_mass, 6),
            "probability_bounds": [round(b, 6) for b in self.probability_bounds],
        }


def choose_labels(
    p_yes: np.ndarray, threshold: float, min_labels: int = 0, max_labels: int | None = None
) -> list[int]:
    """Indices (in declared order) of the labels with `P >= threshold`, with the most
    probable others added up to `min_labels` and the least probable dropped down to
    `max_labels` (ties: declared order)."""
    ranked = sorted(range(len(p_yes)), key=lambda i: (-float(p_yes[i]), i))
    keep = [i for i in ranked if p_yes[i] >= threshold]
    if len(keep) < min_labels:
        keep = ranked[:min_labels]
    if max_labels is not None and len(keep) > max_labels:
        keep = keep[:max_labels]
    return sorted(keep)


@dataclass(frozen=True)
class BatchTiming:
    """The engine call that scored a decision, with its totals.

    `decide_many` scores several contexts in one call; a decision's own `elapsed_ms`,
    `prefill_ms` and `suffix_eval_ms` are its equal share of that call's wall times, so
    summing them over a batch gives the batch's times. These are the totals.

    Args:
        size: Contexts scored in the call.
        elapsed_ms: Wall time of the whole call.
        prefill_ms: Wall time of its prefill.
        suffix_eval_ms: Wall time of its fields pass.
        content_free_ms: Wall time of the content-free passes the call ran for a
            label-free correction (included in `elapsed_ms`); 0.0 when they came from the
            decider's cache.
        generate_ms: Wall time of decoding generated fields (their grammar indexes, the
            written keys and answers, and every decode step); 0.0 without generated fields.
        attention_ms: Of the prefill and fields passes, the time in the attention kernel,
            summed over the threads that ran them (0.0 where attention was not metered:
            MLX's own on a GPU, or generated fields' decode steps).
    """

    size: int
    elapsed_ms: float
    prefill_ms: float
    suffix_eval_ms: float
    content_free_ms: float = 0.0
    generate_ms: float = 0.0
    attention_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict, times rounded to microseconds (`generate_ms` only
        when something was generated)."""
        return {
            "size": self.size,
            "elapsed_ms": round(self.elapsed_ms, 3),
            "prefill_ms": round(self.prefill_ms, 3),
            "suffix_eval_ms": round(self.suffix_eval_ms, 3),
            "content_free_ms": round(self.content_free_ms, 3),
            "attention_ms": round(self.attention_ms, 3),
            **({"generate_ms": round(self.generate_ms, 3)} if self.generate_ms else {}),
        }


@dataclass(frozen=True)
class LabelFreeChoice:
    """What `calibration="auto"` chose for a call, and why (`pcd_tools.decide.loo`).

    Args:
        method: The recipe applied: `"none"` (raw), `"pmi"` or `"contextual"`.
        accuracy: Each recipe's leave-one-out accuracy over the examples (empty when none
            ran: no examples, or a fitted calibration on the decider).
        examples: The schema's examples.
        answers: The answers each recipe's accuracy counts.
        reason: One line saying why `method` was chosen.
    """

    method: str
    accuracy: dict[str, float]
    examples: int
    answers: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every attribute, the accuracies rounded to 6 digits."""
        return {
            "method": self.method,
            "accuracy": {k: round(v, 6) for k, v in self.accuracy.items()},
            "examples": self.examples,
            "answers": self.answers,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Decision(Generic[T]):
    """A scored decision.

    Args:
        value: An instance of the schema's model with native types.
        fields: Per-field results.
        prefill_ms: Wall time of the prompt prefill (this decision's share of its batch).
        suffix_eval_ms: Wall time of the fields pass (field stems and trie nodes; this
            decision's share of its batch).
        elapsed_ms: Wall time of the call (this decision's share of its batch: summing
            it over the results of `decide_many` gives the total). With generated fields,
            `prefill_ms + suffix_eval_ms + generate_ms` is the engine's part of it.
        sequential_forward_passes: Model calls that ran one after another (measured;
            every decode step of a generated field is one).
        prompt_tokens: Prompt length in tokens.
        prefix_cache_hit: Whether the schema part of the prompt came from the cache.
        model_id: The model that scored it.
        device: `cpu`, `metal` or `cuda`.
        compute: The arithmetic of the model's matrix products: `float32`, `int8` or
            `bf16` on CPU (`Decider.load(compute=...)`), `mlx` on a GPU.
        temperature: Softmax temperature used (calibrated temperatures are per field).
        scoring: `"auto"`, `"full"`, `"constrained"` or `"pmi"` (domain-conditional PMI),
            as asked (under a fitted calibration `"auto"` is the scoring it was fitted
            with). Under `"auto"` each field's `FieldResult.scoring` says which it got.
        mode: Layout of the fields pass.
        calibrated: Whether per-field temperatures from a calibration file were applied.
        calibration_file: That file, if any.
        calibration_method: The label-free calibration applied before any fitted one:
            `"contextual"` or `"none"` (PMI is a `scoring`); under `calibration="auto"`,
            `"auto:"` and the recipe it chose: `"auto:none"`, `"auto:pmi"` or
            `"auto:contextual"`.
        calibration_choice: Under `calibration="auto"`, what was chosen and why (each
            recipe's leave-one-out accuracy over the examples); None otherwise.
        examples: Few-shot examples in the prompt's schema part.
        content_free_ms: This decision's share of the content-free passes its call ran
            (0.0 when the decider had them cached); included in `elapsed_ms`.
        batch: The engine call that scored it: its size and total times.
        orders: Listing orders averaged over (`decide(..., orders=k)`); timings and
            `sequential_forward_passes` are then sums over the k orders.
        joint: For fields scored jointly (`choices_by`): `(parent, child)` -> a dict from
            `(parent value, child value)` to its probability, summing to 1.
        generate_ms: Wall time of decoding the generated fields (this decision's share of
            its batch); 0.0 without generated fields.
        segments: With generated fields, the segments in the order they ran, each with
            the JSON text it saw and wrote (`json_text` joins them); empty otherwise.
        attention_ms: Of `prefill_ms + suffix_eval_ms`, the time in the attention kernel
            (this decision's share of its batch, summed over the threads that ran its
            passes): on long inputs attention, not the matrix products, grows fastest.
            0.0 where attention was not metered (MLX's own, on a GPU).
    """

    value: T
    fields: dict[str, FieldResult]
    prefill_ms: float
    suffix_eval_ms: float
    elapsed_ms: float
    sequential_forward_passes: int
    prompt_tokens: int
    prefix_cache_hit: bool
    model_id: str
    device: str
    temperature: float
    scoring: str
    mode: str
    calibrated: bool = False
    calibration_file: str | None = None
    batch: BatchTiming | None = None
    orders: int = 1
    joint: dict[tuple[str, str], dict[tuple[Any, Any], float]] = field(default_factory=dict)
    calibration_method: str = "none"
    examples: int = 0
    content_free_ms: float = 0.0
    generate_ms: float = 0.0
    segments: tuple[Segment, ...] = ()
    calibration_choice: LabelFreeChoice | None = None
    compute: str = "float32"
    attention_ms: float = 0.0

    @property
    def json_text(self) -> str | None:
        """With generated fields: the answer as the one JSON object the model saw and
        wrote, in declaration order (`{`, every segment's text, closed with `\\n}`);
        None for a schema of scored fields only (they are scored in parallel)."""
        if not self.segments:
            return None
        body = "{" + "".join(s.text for s in self.segments)
        return body if body.endswith("}") else body.rstrip(",") + "\n}"

    @property
    def flip_rate(self) -> float | None:
        """With `orders=k`: the largest field `flip_rate`, else `None`.

        0.0 means every listing order gave the averaged answer on every field.
        """
        rates = [f.flip_rate for f in self.fields.values() if f.flip_rate is not None]
        return max(rates) if rates else None

    @property
    def confidence(self) -> float | None:
        """The lowest answer probability over the scored fields; None when every field
        is generated (no field has a probability)."""
        probs = [f.probability for f in self.fields.values() if f.probability is not None]
        return min(probs) if probs else None

    @property
    def certified(self) -> bool | None:
        """Whether every field scored by pruned search has a certified answer (the
        exhaustive pass's argmax); None when no field was pruned."""
        flags = [f.certified for f in self.fields.values() if f.certified is not None]
        return all(flags) if flags else None

    def low_confidence(self, threshold: float) -> list[str]:
        """Names of scored fields whose probability is below `threshold` (a generated
        field has no probability, so it is never listed)."""
        return [
            n
            for n, f in self.fields.items()
            if f.probability is not None and f.probability < threshold
        ]

    def to_response(self) -> dict[str, Any]:
        """The seed-compatible response dict (DESIGN §3), JSON-serialisable. A generated
        field's `prob` and `confidence` are None; with generated fields the dict also has
        `generate_ms` and `json_text`."""
        parsed = {
            n: {
                "value": f.label,
                "prob": round(f.probability, 6) if f.probability is not None else None,
            }
            for n, f in self.fields.items()
        }
        telemetry = {n: f.telemetry() for n, f in self.fields.items()}
        return {
            "mode": "parallel_constrained_calibrated"
            if self.calibrated
            else "parallel_constrained",
            "elapsed_ms": round(self.elapsed_ms, 3),
            "prefill_ms": round(self.prefill_ms, 3),
            "suffix_eval_ms": round(self.suffix_eval_ms, 3),
            "attention_ms": round(self.attention_ms, 3),
            "sequential_forward_passes": self.sequential_forward_passes,
            "is_valid_json": True,
            "schema_match": True,
            "parsed_json": parsed,
            "field_telemetry": telemetry,
            "model": self.model_id,
            "device": self.device,
            "compute": self.compute,
            "temperature": self.temperature,
            "scoring": self.scoring,
            "prompt_tokens": self.prompt_tokens,
            "prefix_cache_hit": self.prefix_cache_hit,
            "calibrated": self.calibrated,
            "calibration_file": self.calibration_file,
            "calibration_method": self.calibration_method,
            "examples": self.examples,
            "content_free_ms": round(self.content_free_ms, 3),
            "batch": self.batch.to_dict() if self.batch is not None else None,
            "orders": self.orders,
            "flip_rate": self.flip_rate,
            **({"joint": self._joint_rows()} if self.joint else {}),
            **(
                {"calibration_choice": self.calibration_choice.to_dict()}
                if self.calibration_choice is not None
                else {}
            ),
            **(
                {"generate_ms": round(self.generate_ms, 3), "json_text": self.json_text}
                if self.segments
                else {}
            ),
        }

    def _joint_rows(self) -> list[dict[str, Any]]:
        return [
            {
                "fields": list(pair),
                "table": [
                    {"values": list(vals), "probability": round(p, 6)} for vals, p in table.items()
                ],
            }
            for pair, table in self.joint.items()
        ]
