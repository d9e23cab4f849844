"""Label-free calibration: contextual calibration and domain-conditional PMI.

A model leans towards some answers whatever the text says (a value listed first, a
common word, a label the examples used). Both corrections here measure that lean on the
same prompt (schema, examples, listing order) without the text, and divide it out. No
labelled data is needed.

**Contextual calibration** (`calibration="contextual"`; Zhao et al. 2021, "Calibrate
Before Use"). The schema is scored on content-free inputs (`CONTENT_FREE`: `"N/A"`, `""`
and `"[MASK]"`, decided as with `allow_empty`); per scored question, the candidates'
probabilities on those inputs are averaged into `p_cf`, and a decision's distribution
becomes `softmax((z - log p_cf) / t)` over its log scores `z`: the paper's
`W = diag(p_cf)^-1` with `b = 0`, then the caller's temperature `t`. With
`scoring="constrained"`, `z` and `p_cf` are both constrained scores.

The average is geometric by default (`MEANS`): `log p_cf` is the mean of the inputs'
log-probabilities, renormalised. A lean that enters the model as an input-independent
bias on the candidates' logits then cancels exactly (for single-token candidates), however
many inputs there are and however differently the model reads them. The paper's
arithmetic mean of probabilities (`Decider.with_content_free(..., mean="arithmetic")`)
cancels it exactly only with one input: with several it is dominated by the input the
model is surest on, and on the tests' random-weight model it left a 0.17 difference in
probability where the geometric mean leaves 1e-8. With one input the two are the same.

**Domain-conditional PMI** (`scoring="pmi"`; Holtzman et al. 2021). Each candidate scores
`log P(c | prompt with the context) - log P(c | prompt with an empty context)` (both full
log-probabilities), then the softmax with the temperature. It is the same subtraction
with the single content-free input `""` and raw scores (which differ from `log p_cf` by a
constant per question, so the distribution is the same). PMI and contextual calibration
correct the same lean; a call asking for both is refused.

**What is corrected.** Every scored question on its own, then the answers are combined
as without a correction:

- an enum or bool field: each candidate (an `Optional` field's `null` too);
- an int range: each integer is a candidate with its own `p_cf`, so a lean towards
  particular numbers is removed; the order of the numbers plays no part, and the
  `expected` value is that of the corrected distribution;
- a multi-label field: each label's yes/no question, so its `P(yes)` is measured against
  the label's content-free `P(yes)` before the threshold applies;
- a `choices_by` pair scored jointly: the parent's distribution and each conditional
  `P(child | parent = v)` (scored with `v` written, on the content-free inputs too, over
  the values allowed with `v`) are corrected, then multiplied into the joint table;
- a discriminated union: the discriminator and each branch's fields (conditioned on their
  branch) likewise, and the branch is chosen from the corrected ones;
- a later wave (`depends_on`): its questions, with the earlier answers written, are scored
  on the content-free inputs when a decision first asks them (then cached); the earlier
  answers written are the corrected ones;
- `orders=k`: each listing order is its own prompt with its own `p_cf`; the k corrected
  distributions are averaged;
- a fitted `Calibration` applies to the corrected scores (the correction first, then the
  fitted temperature and biases); its file records the correction in `label_free`.

The content-free scores are kept per schema plan (the schema with its examples and the
listing order, as the prefix cache keys it) in a bounded LRU on the decider
(`ContentFreeScores`), so their passes run once per plan; `Decision.content_free_ms`
shows what a call spent on them.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..engine.passes.pack import plan_key
from ..errors import InvalidArgumentError
from ..prompt import Question
from ..schema import Schema

if TYPE_CHECKING:
    from ..answers.calibration import Calibration
    from ..engine.scorer import Engine

__all__ = [
    "CONTENT_FREE",
    "MEANS",
    "ContentFreeScores",
    "Correction",
    "LabelFree",
    "ZPair",
    "check_inputs",
    "check_method",
    "method_with",
]

CONTENT_FREE = ("N/A", "", "[MASK]")
# How the content-free inputs' distributions are averaged into `p_cf`.
MEANS = ("geometric", "arithmetic")

# A question's candidate log scores on one content-free input: (full, constrained).
ZPair = tuple[np.ndarray, np.ndarray]


class LabelFree:
    """A label-free correction of candidate log scores, and what it needs (the three,
    `RAW`, `PMI` and `CONTEXTUAL`, are in `pcd_tools.decide.methods`).

    Attributes:
        name: What a `Calibration` file records in `label_free`: `none`, `pmi` or
            `contextual`.
        option: How a call asks for it, for messages.
        what: What it reads without the text, for messages.
        sides: The sides its scores may be read on.
        needs_every_score: Whether it subtracts a per-candidate offset, so that every
            candidate must be scored (no pruning) on the same prompt without the text (no
            generated fields before it).
        options: The decision options that ask for it, as `(name, value)` pairs
            (`calibration="auto"` sets them for the recipe it chose).
    """

    name: ClassVar[str] = "none"
    option: ClassVar[str] = "calibration='none'"
    what: ClassVar[str] = "raw scores"
    sides: ClassVar[tuple[str, ...]] = ("auto", "full", "constrained")
    needs_every_score: ClassVar[bool] = False
    options: ClassVar[tuple[tuple[str, str], ...]] = (("calibration", "none"),)

    def texts(self, cache: ContentFreeScores) -> tuple[str, ...]:
        """The content-free texts whose scores it reads."""
        return ()

    def offsets(
        self,
        entry: dict[str, dict[Question, ZPair]],
        questions: Sequence[Question],
        texts: Sequence[str],
        *,
        constrained: bool,
        mean: str,
    ) -> list[np.ndarray]:
        """Per question, what is subtracted from its candidates' log scores.

        Args:
            entry: The plan's content-free scores (text -> question -> (full,
                constrained)).
            questions: The questions.
            texts: The content-free texts read (`texts`).
            constrained: Whether the decision's scores are constrained ones.
            mean: How several content-free inputs are averaged (`geometric` or
                `arithmetic`).
        """
        raise NotImplementedError(f"{type(self).__name__} subtracts nothing")

    def __repr__(self) -> str:
        return type(self).__name__.upper() if self.name != "none" else "RAW"


def check_inputs(inputs: Any) -> tuple[str, ...]:
    """Validates content-free inputs.

    Raises:
        InvalidArgumentError: unless `inputs` is a non-empty list of distinct str.
    """
    if isinstance(inputs, str) or not isinstance(inputs, Sequence) or not inputs:
        raise InvalidArgumentError(
            f"content-free inputs must be a non-empty list of str; got {inputs!r}."
        )
    bad = [x for x in inputs if not isinstance(x, str)]
    if bad or len(set(inputs)) != len(inputs):
        raise InvalidArgumentError(
            f"content-free inputs must be distinct str; got {list(inputs)!r}; accepted: "
            f"texts that say nothing about the answer, e.g. {list(CONTENT_FREE)}."
        )
    return tuple(inputs)


def check_method(method: str, calibration: Calibration) -> None:
    """Raises `CalibrationMismatchError` unless a decider with label-free `method`
    (`"contextual"` or `"none"`) can apply `calibration`."""
    want = "contextual" if calibration.label_free == "contextual" else "none"
    if method != want:
        calibration.check_label_free(method)


def method_with(default: str, calibration: Calibration | None) -> str:
    """The decider's label-free method once `calibration` is on it: a calibration fitted
    on top of contextual calibration turns it on.

    Raises:
        CalibrationMismatchError: when the decider's method and the calibration's differ
            otherwise.
    """
    if calibration is None:
        return default
    if default == "none" and calibration.label_free == "contextual":
        return "contextual"
    check_method(default, calibration)
    return default


class ContentFreeScores:
    """Candidate log scores of every scored question on content-free inputs, per plan.

    Kept in a bounded LRU keyed like the plans (the schema's fingerprint, examples
    included, and the listing order). Thread-safe: it runs under the engine's lock.

    Args:
        engine: The engine that scores them.
        inputs: The content-free inputs of contextual calibration.
        max_plans: Plans kept.
        mean: How contextual calibration averages the inputs' distributions:
            `"geometric"` or `"arithmetic"` (see the module docstring).

    Attributes:
        stats: `hits` and `misses` (calls that found everything cached, or ran passes),
            `passes` (model calls run one after another) and `ms` (their wall time).
    """

    def __init__(
        self,
        engine: Engine,
        inputs: Sequence[str] = CONTENT_FREE,
        max_plans: int = 16,
        mean: str = "geometric",
    ) -> None:
        if mean not in MEANS:
            raise InvalidArgumentError(
                f"unknown mean {mean!r} for content-free inputs; accepted: {list(MEANS)}."
            )
        self.engine = engine
        self.inputs = check_inputs(inputs)
        self.mean = mean
        self.max_plans = max(1, int(max_plans))
        self._plans: OrderedDict[Any, dict[str, dict[Question, ZPair]]] = OrderedDict()
        self.stats: dict[str, float] = {"hits": 0, "misses": 0, "passes": 0, "ms": 0.0}

    def __len__(self) -> int:
        return len(self._plans)

    def clear(self) -> None:
        """Drops every plan's scores."""
        with self.engine.lock:
            self._plans.clear()

    def scores(
        self,
        schema: Schema,
        order: dict[str, Sequence[int]] | None,
        texts: Sequence[str],
        questions: Sequence[Question],
    ) -> tuple[dict[str, dict[Question, ZPair]], float]:
        """Every `(text, question)`'s scores, running the passes still missing.

        Returns:
            The plan's scores (content-free text -> question -> (full, constrained)
            candidate log scores) and the milliseconds spent on passes now.
        """
        key = plan_key(schema, order)
        with self.engine.lock:  # also held by a decision's waves, which may call in here
            entry = self._plans.setdefault(key, {})
            self._plans.move_to_end(key)
            need = [
                q for q in dict.fromkeys(questions) if any(q not in entry.get(t, {}) for t in texts)
            ]
            if not need:
                self.stats["hits"] += 1
                return entry, 0.0
            self.stats["misses"] += 1
            t0 = time.perf_counter()
            run = [t for t in texts if any(q not in entry.get(t, {}) for q in need)]
            self._fill(schema, order, run, need, entry)
            ms = (time.perf_counter() - t0) * 1e3
            self.stats["ms"] += ms
            while len(self._plans) > self.max_plans:
                self._plans.popitem(last=False)
            return entry, ms

    def _fill(
        self,
        schema: Schema,
        order: dict[str, Sequence[int]] | None,
        texts: list[str],
        need: list[Question],
        entry: dict[str, dict[Question, ZPair]],
    ) -> None:
        """One engine call on the content-free texts: the first pass, plus one wave that
        asks the needed questions the first pass does not (a dependent field's, with
        earlier answers written)."""
        plan = self.engine.plan(schema, order)
        first = set(plan.questions)
        later = [q for q in need if q not in first]
        n_first = len(plan.questions)

        def ask_later(scored: list[Any]) -> list[Question]:
            return list(later) if len(scored) == n_first else []

        batch = self.engine.score(
            schema, texts, choice_order=order, follow_up=ask_later if later else None
        )
        self.stats["passes"] += batch.sequential_forward_passes
        for r, text in enumerate(texts):
            qs = batch.questions[r] if batch.questions else plan.questions
            tries = batch.tries[r] if batch.tries else plan.tries
            got = entry.setdefault(text, {})
            for q, trie, edge in zip(qs, tries, batch.edge_logp[r]):
                got[q] = (trie.score(edge), trie.score(edge, constrained=True))


@dataclass
class Correction:
    """What one decision call subtracts from each question's candidate log scores.

    Build it with `pcd_tools.decide.methods.Method.correction_for`, or directly with a
    correction that needs content-free scores (`PMI`, `CONTEXTUAL`).

    Args:
        cache: The decider's content-free scores.
        schema: The compiled schema (with its examples).
        order: The listing order of the prompt, or None.
        kind: The correction, `PMI` or `CONTEXTUAL` (`pcd_tools.decide.methods`).
        constrained: Whether the decision's scores are constrained (contextual only).
        ms: Wall time of the content-free passes this call ran so far.
    """

    cache: ContentFreeScores
    schema: Schema
    order: dict[str, Sequence[int]] | None
    kind: LabelFree
    constrained: bool = False
    ms: float = 0.0

    @property
    def texts(self) -> tuple[str, ...]:
        """The content-free inputs this correction reads."""
        return self.kind.texts(self.cache)

    def prepare(self, questions: Sequence[Question]) -> None:
        """Makes sure the questions' content-free scores are cached."""
        self.ms += self.cache.scores(self.schema, self.order, self.texts, questions)[1]

    def offsets(self, questions: Sequence[Question]) -> list[np.ndarray]:
        """Per question, what is subtracted from its candidates' log scores: `log p_cf`
        (contextual) or the empty context's log scores (PMI)."""
        texts = self.texts
        entry, ms = self.cache.scores(self.schema, self.order, texts, questions)
        self.ms += ms
        return self.kind.offsets(
            entry, questions, texts, constrained=self.constrained, mean=self.cache.mean
        )

    def __call__(self, questions: Sequence[Question], logz: Sequence[Any]) -> list[np.ndarray]:
        """The corrected log scores of `questions`."""
        offs = self.offsets(questions)
        return [np.asarray(z, dtype=np.float64) - o for z, o in zip(logz, offs)]
