"""`calibration="auto"`: the label-free recipe chosen by leave-one-out over the examples.

A call's few-shot examples are a few labelled items. With `calibration="auto"`, a call
whose schema has examples (its own or the call's `examples=`), on a decider without a
fitted calibration, chooses among three recipes:

- `"none"`: the raw scores (the call's scoring, `"auto"` or `"full"`);
- `"pmi"`: domain-conditional PMI (`scoring="pmi"`);
- `"contextual"`: contextual calibration (`calibration="contextual"`, scored full).

Each example is decided with the other examples as the shots (the same prompt a call
has, less that example), under each recipe, by the library itself; a recipe's
leave-one-out accuracy is the fraction of the examples' scored answers it gets right
(one answer per scored field an example answers; each label of a multi-label field is
one answer). The recipe with the best accuracy is chosen, under two rules:

- a recipe must beat raw by at least `MIN_GAIN` (2) answers: a tie with raw, a loss, or
  a lead of a single answer (one flip, +25 points on 4 examples) keeps raw. So the
  choice never loses to raw on the examples. On the six shared sets, the one-answer
  lead was a loss on held-out items (sms_spam, 4 shots: PMI 3 of 4 against raw's 2 of 4
  on the examples, 0.68 against 0.72 on 100 held-out items; EVAL.md);
- between PMI and contextual calibration at the same accuracy, PMI (listed first in
  `RECIPES`) wins.

The choice is cached on the decider per schema (its fingerprint covers the examples),
scoring, listing order and content-free inputs (`LooChoices`): the leave-one-out runs once
per schema, and later calls reuse it. Each `Decision` says what was chosen
(`calibration_method`, e.g. `"auto:pmi"`) and why (`calibration_choice`: every recipe's
leave-one-out accuracy and a one-line reason).

Without examples there is nothing to choose on, and with a fitted calibration the
calibration fixes the label-free correction (it was fitted on top of one): the call then
uses the decider's own setting, and `calibration_choice.reason` says so.

Cost, paid on the first call only: per example, its own prompt prefix, the content-free
passes of that prompt, and one decision (every field a plain enum or bool: PMI and
contextual calibration are the raw full scores minus the cached content-free offsets,
as the library computes them) or three (one per recipe, otherwise).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..answers.result import LabelFreeChoice
from ..errors import InvalidArgumentError
from .contextual import Correction
from .methods import CONTEXTUAL, CORRECTIONS, PMI, Method
from .options import DecideOptions

if TYPE_CHECKING:
    from ..answers.result import Decision, FieldResult
    from ..engine.scorer import Engine
    from ..schema import Example, FieldSpec, Schema
    from .state import DecidesMany

__all__ = ["MIN_GAIN", "RECIPES", "LooChoices", "check_auto", "choose", "loo_accuracies", "pick"]

# The recipes "auto" chooses among, in the order ties are broken (raw first).
RECIPES = ("none", "pmi", "contextual")
# How many more of the examples' answers a recipe must get right than raw to be chosen:
# a one-answer lead is one coin flip (on 4 examples it reads as +25 points).
MIN_GAIN = 2
_NAMES = {"none": "raw", "pmi": "PMI", "contextual": "contextual"}


def recipe_options(options: DecideOptions, recipe: str) -> DecideOptions:
    """The call's options with `recipe`'s calibration and scoring (`"auto"` resolved)."""
    return DecideOptions.build(options, **dict(CORRECTIONS[recipe].options))


def _answers(spec: FieldSpec, gold: Any, got: FieldResult) -> tuple[int, int]:
    """(right, counted) for one field of one example."""
    if spec.kind == "multilabel":
        want = {spec.choices[i].label for i in gold}
        chosen = set(got.label or ())
        right = sum((c.label in chosen) == (c.label in want) for c in spec.choices)
        return right, len(spec.choices)
    return int(got.label == spec.choices[gold].label), 1


def _score_example(schema: Schema, example: Example, decision: Decision[Any]) -> tuple[int, int]:
    right = counted = 0
    for spec in schema.fields:
        gold = example.answer(spec.name)
        got = decision.fields.get(spec.name)
        if gold is None or got is None or spec.kind == "generated":
            continue
        r, c = _answers(spec, gold, got)
        right, counted = right + r, counted + c
    return right, counted


def _derivable(engine: Engine, schema: Schema, options: DecideOptions) -> bool:
    """Whether PMI's and contextual calibration's answers follow from the raw full scores
    and the content-free offsets alone: every field is one first-pass question over its
    declared choices (no multi-label, joint, union or later-wave field), listed in the
    declared order, and raw under the call's scoring is raw full."""
    if options.orders > 1 or options.choice_order:
        return False
    plan = engine.plan(schema, None)
    names = [q.field for q in plan.questions]
    if len(set(names)) != len(names) or set(names) != {f.name for f in schema.fields}:
        return False
    for q in plan.questions:
        spec = schema.field(q.field)
        if q.given or q.choices is not None or q.label is not None:
            return False
        if spec.kind not in ("enum", "boolean") or spec.depends_on:
            return False
    side = Method(options.scoring).constrained_side(schema)
    return not any(side(q, trie) for q, trie in zip(plan.questions, plan.tries))


def _derived(
    decider: DecidesMany, held_out: Schema, example: Example, options: DecideOptions
) -> dict[str, tuple[int, int]]:
    """Each recipe's (right, counted) on one example from one raw full decision and the
    cached content-free offsets (`z - offset`, as the library corrects scores)."""
    opts = dataclasses.replace(options, calibration="none", scoring="full", allow_empty=True)
    d = decider.decide_many(held_out, [example.input], options=opts, batch_size=1)[0]
    state = decider.state
    questions = state.engine.plan(held_out, None).questions
    offsets = {}
    for kind in (CONTEXTUAL, PMI):  # on the raw full scores
        corr = Correction(state.content_free, held_out, None, kind)
        offsets[kind.name] = dict(zip([q.field for q in questions], corr.offsets(questions)))
    out = {}
    for recipe in RECIPES:
        right = counted = 0
        for spec in held_out.fields:
            gold = example.answer(spec.name)
            if gold is None:
                continue
            z = np.asarray(d.fields[spec.name].log_scores, dtype=np.float64)
            if recipe != "none":
                z = z - offsets[recipe][spec.name]
            right += int(int(np.argmax(z)) == gold)
            counted += 1
        out[recipe] = (right, counted)
    return out


def loo_accuracies(
    decider: DecidesMany,
    schema: Schema,
    options: DecideOptions,
    recipes: Sequence[str] = RECIPES,
) -> tuple[dict[str, float], int]:
    """Each recipe's leave-one-out accuracy over `schema`'s examples.

    Every example is decided, by `decider`, with the other examples as the shots and
    each recipe's options. Where the corrected answers follow from the raw scores (every
    field a plain enum or bool, `_derivable`), each example is decided once, raw and
    full, and PMI and contextual calibration subtract their cached content-free offsets
    from its scores, as the library does; otherwise each recipe decides it.

    Returns:
        Recipe -> accuracy, and the number of answers counted per recipe.
    """
    examples = schema.examples
    right = dict.fromkeys(recipes, 0)
    counted = 0
    derive = tuple(recipes) == RECIPES and _derivable(decider.state.engine, schema, options)
    for i, example in enumerate(examples):
        held_out = dataclasses.replace(schema, examples=examples[:i] + examples[i + 1 :])
        if derive:
            got = _derived(decider, held_out, example, options)
            for recipe in recipes:
                right[recipe] += got[recipe][0]
            counted += got["none"][1]
            continue
        c = 0
        for recipe in recipes:
            opts = dataclasses.replace(recipe_options(options, recipe), allow_empty=True)
            d = decider.decide_many(held_out, [example.input], options=opts, batch_size=1)[0]
            r, c = _score_example(schema, example, d)
            right[recipe] += r
        counted += c
    return {r: right[r] / counted if counted else 0.0 for r in recipes}, counted


def pick(accuracy: dict[str, float], answers: int, min_gain: int = MIN_GAIN) -> str:
    """The recipe with the best accuracy, if it gets at least `min_gain` more of the
    `answers` right than raw; raw otherwise. Ties between the others go to the one listed
    first in `RECIPES`."""
    best = "none"
    for recipe in RECIPES[1:]:
        if recipe in accuracy and accuracy[recipe] > accuracy[best]:
            best = recipe
    gain = round((accuracy[best] - accuracy["none"]) * answers)
    return best if best != "none" and gain >= min_gain else "none"


def _reason(accuracy: dict[str, float], chosen: str, k: int, n: int) -> str:
    accs = ", ".join(f"{_NAMES[r]} {accuracy[r]:.3f}" for r in RECIPES if r in accuracy)
    head = f"leave-one-out over {k} examples ({n} answers): {accs}; "
    if chosen != "none":
        gain = round((accuracy[chosen] - accuracy["none"]) * n)
        return head + f"{_NAMES[chosen]} is best, {gain} answers above raw"
    return head + f"no recipe gets {MIN_GAIN} or more answers above raw, raw kept"


class LooChoices:
    """The decider's cached `calibration="auto"` choices (a bounded LRU, thread-safe).

    Attributes:
        stats: `hits` (calls that found their choice cached), `misses` and `runs`
            (leave-one-out runs).
    """

    def __init__(self, max_entries: int = 64) -> None:
        self.max_entries = max(1, int(max_entries))
        self._choices: OrderedDict[Any, LabelFreeChoice] = OrderedDict()
        self._lock = threading.Lock()
        self.stats: dict[str, int] = {"hits": 0, "misses": 0, "runs": 0}

    def __len__(self) -> int:
        return len(self._choices)

    def clear(self) -> None:
        """Drops every cached choice."""
        with self._lock:
            self._choices.clear()

    def get(self, decider: DecidesMany, schema: Schema, options: DecideOptions) -> LabelFreeChoice:
        """The choice for this schema and options, running the leave-one-out once."""
        cf = decider.state.content_free
        key = (
            schema.fingerprint(),
            options.scoring,
            options.choice_order,
            options.orders,
            options.mode,
            cf.inputs,
            cf.mean,
        )
        with self._lock:  # one leave-one-out at a time; a second caller waits for it
            got = self._choices.get(key)
            if got is not None:
                self._choices.move_to_end(key)
                self.stats["hits"] += 1
                return got
            self.stats["misses"] += 1
            self.stats["runs"] += 1
            accuracy, n = loo_accuracies(decider, schema, options)
            chosen = pick(accuracy, n)
            choice = LabelFreeChoice(
                method=chosen,
                accuracy=accuracy,
                examples=len(schema.examples),
                answers=n,
                reason=_reason(accuracy, chosen, len(schema.examples), n),
            )
            self._choices[key] = choice
            while len(self._choices) > self.max_entries:
                self._choices.popitem(last=False)
            return choice


def check_auto(schema: Schema) -> None:
    """Refuses `calibration="auto"` on a schema with generated fields.

    Raises:
        InvalidArgumentError: naming the generated fields: PMI and contextual
            calibration, which `"auto"` may choose, do not take them.
    """
    generated = [f.name for f in schema.fields if f.generated]
    if generated:
        raise InvalidArgumentError(
            f"{schema.name} has generated fields {generated}: calibration='auto' chooses "
            "between raw, PMI and contextual calibration, and the last two do not take "
            "generated fields; accepted: calibration 'none' (or None) with them."
        )


def choose(
    decider: DecidesMany, schema: Schema, options: DecideOptions
) -> tuple[DecideOptions, LabelFreeChoice]:
    """A `calibration="auto"` call's options, with the chosen recipe, and the choice.

    A part of a schema (`Schema.part`) takes its whole's choice: the examples and the
    prompt are the whole's, and so is the leave-one-out over them.

    Raises:
        InvalidArgumentError: for a schema with generated fields (`check_auto`).
    """
    schema = schema.shown
    check_auto(schema)
    state = decider.state
    if state.calibration is not None or not schema.examples:
        method = state.label_free
        why = (
            "the decider's fitted calibration fixes the label-free correction"
            if state.calibration is not None
            else "no examples to choose on"
        )
        choice = LabelFreeChoice(
            method=method,
            accuracy={},
            examples=len(schema.examples),
            answers=0,
            reason=f"{why}: the decider's own setting ({_NAMES[method]}) is kept",
        )
        return dataclasses.replace(options, calibration=None), choice
    choice = state.loo_choices.get(decider, schema, options)
    return recipe_options(options, choice.method), choice
