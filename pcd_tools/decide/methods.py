"""How a decision call scores: a side of the trie and a label-free correction, as objects.

A call's candidate scores come from two choices, resolved once per call into a `Method`:

- the **side** (`"full"`, `"constrained"` or `"auto"`): the model's probability of each
  candidate given that it answers with one, the probability renormalised at each trie
  node, or full except a large single-choice field, scored constrained so that certified
  pruning can skip most of its trie (`pcd_tools.engine.passes.prune.auto_constrained`);
- the **label-free correction** (`RAW`, `PMI`, `CONTEXTUAL`): what is subtracted from the
  log scores, and what that needs. Each declares it: the content-free texts it scores
  (none, the empty context, or the decider's content-free inputs), the sides it takes,
  and whether it needs every candidate's score (then nothing is pruned and a schema with
  generated fields is refused: its content-free scores would need the generated text).

The options keep their names: `scoring="pmi"` is the PMI correction on the full side,
`calibration="contextual"` the contextual one. The orchestrators (`decide.scored`,
`decide.generated`) and the label-free tools (`decide.loo`, `eval.fit_data`) read the
objects instead of comparing strings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..answers.softmax import log_softmax
from ..engine.passes.prune import Pruning, auto_constrained, pruning_for
from ..errors import InvalidArgumentError
from .contextual import ContentFreeScores, Correction, LabelFree, ZPair

if TYPE_CHECKING:
    from ..prompt import Question
    from ..schema import Schema

__all__ = [
    "CONTEXTUAL",
    "CORRECTIONS",
    "PMI",
    "RAW",
    "RAW_FULL",
    "LabelFree",
    "Method",
    "label_free_of",
]

_TINY = 1e-300


class _Raw(LabelFree):
    """No correction: the model's scores as they are."""


class _PMI(LabelFree):
    """Domain-conditional PMI: minus the full log scores with an empty context."""

    name = "pmi"
    option = "scoring='pmi'"
    what = "its empty-context scores"
    sides = ("full",)
    needs_every_score = True
    options = (("calibration", "none"), ("scoring", "pmi"))

    def texts(self, cache: ContentFreeScores) -> tuple[str, ...]:
        return ("",)

    def offsets(
        self,
        entry: dict[str, dict[Question, ZPair]],
        questions: Sequence[Question],
        texts: Sequence[str],
        *,
        constrained: bool,
        mean: str,
    ) -> list[np.ndarray]:
        return [entry[""][q][0] for q in questions]


class _Contextual(LabelFree):
    """Contextual calibration: minus `log p_cf`, the answer prior measured on the
    decider's content-free inputs (`pcd_tools.decide.contextual`)."""

    name = "contextual"
    option = "calibration='contextual'"
    what = "its content-free scores"
    sides = ("full", "constrained")
    needs_every_score = True
    options = (("calibration", "contextual"),)

    def texts(self, cache: ContentFreeScores) -> tuple[str, ...]:
        return cache.inputs

    def offsets(
        self,
        entry: dict[str, dict[Question, ZPair]],
        questions: Sequence[Question],
        texts: Sequence[str],
        *,
        constrained: bool,
        mean: str,
    ) -> list[np.ndarray]:
        side = 1 if constrained else 0
        out = []
        for q in questions:
            logp = np.array([log_softmax(entry[t][q][side]) for t in texts])
            if mean == "arithmetic":
                out.append(np.log(np.maximum(np.exp(logp).mean(axis=0), _TINY)))
            else:
                out.append(log_softmax(logp.mean(axis=0)))
        return out


RAW: LabelFree = _Raw()
PMI: LabelFree = _PMI()
CONTEXTUAL: LabelFree = _Contextual()
CORRECTIONS = {c.name: c for c in (RAW, PMI, CONTEXTUAL)}


def label_free_of(calibration_method: str, scoring: str) -> str:
    """The correction a `Decision`'s scores had, from what it reports: `pmi`,
    `contextual` or `none`; `calibration_method` may be `calibration="auto"`'s report,
    `"auto:<recipe>"`."""
    return PMI.name if scoring == PMI.name else calibration_method.removeprefix("auto:")


@dataclass(frozen=True)
class Method:
    """A call's scoring, resolved: the side its scores are read on and its correction.

    Build it with `Method.resolve`, which applies the rules of `scoring="auto"` and
    refuses PMI with contextual calibration.

    Attributes:
        side: `"auto"`, `"full"` or `"constrained"`.
        correction: `RAW`, `PMI` or `CONTEXTUAL`.
    """

    side: str
    correction: LabelFree = RAW

    @classmethod
    def resolve(
        cls,
        scoring: str,
        default: str,
        requested: str | None = None,
        calibration: Any = None,
    ) -> Method:
        """A call's method from its options and its decider.

        `scoring="auto"` scores a large single-choice field (over `AUTO_NODES` trie
        positions) constrained, where certified pruning can then skip most of its trie,
        and every other field full. It stays `"auto"` unless:

        - the decider has a fitted calibration: its temperatures and biases were fitted
          on one scoring's scores, so `"auto"` is the scoring it was fitted with (which
          may be `"auto"` itself: large fields constrained, the others full);
        - the correction is contextual calibration: it cannot prune, and its content-free
          scores are on one side for every field, so `"auto"` is `"full"`.

        Args:
            scoring: The call's checked `scoring` option.
            default: The decider's label-free method, `"none"` or `"contextual"`.
            requested: The call's `calibration` option (`"none"`, `"contextual"`), or
                None for the decider's.
            calibration: The decider's fitted `Calibration`, or None.

        Raises:
            InvalidArgumentError: for contextual calibration with `scoring="pmi"`.
        """
        label_free = CORRECTIONS[requested if requested is not None else default]
        if scoring == PMI.name and label_free is CONTEXTUAL:
            how = "this call" if requested is not None else "the decider"
            raise InvalidArgumentError(
                f"scoring='pmi' with contextual calibration (asked by {how}): both divide "
                "out the model's answer prior, so they are not combined; accepted: "
                "scoring='pmi' with calibration='none', or contextual calibration with "
                "scoring 'full' or 'constrained'."
            )
        side = scoring
        if scoring == "auto" and calibration is not None:
            fitted = getattr(calibration, "scoring", "full")
            side = fitted if fitted in ("auto", "full", "constrained", PMI.name) else "full"
            if fitted == PMI.name and label_free is CONTEXTUAL:  # refused by the calibration
                side = "full"
        elif scoring == "auto" and label_free is CONTEXTUAL:
            side = "full"
        if side == PMI.name:
            return cls("full", PMI)
        return cls(side, label_free)

    @property
    def scoring(self) -> str:
        """The scoring a `Decision` reports: the side, or `"pmi"`."""
        return PMI.name if self.correction is PMI else self.side

    @property
    def method(self) -> str:
        """The decider-level label-free method a `Decision` reports in
        `calibration_method`: `"contextual"` or `"none"` (PMI is a scoring)."""
        return CONTEXTUAL.name if self.correction is CONTEXTUAL else RAW.name

    @property
    def label_free(self) -> str:
        """The correction's name, as a `Calibration` file records it."""
        return self.correction.name

    def constrained_side(self, schema: Schema) -> Callable[[Any, Any], bool]:
        """Given a question and its trie, whether its scores are constrained ones: all on
        the constrained side, the large single-choice fields under `"auto"`, none
        otherwise."""
        if self.side == "auto":
            return auto_constrained(schema)
        constrained = self.side == "constrained"
        return lambda q, trie: constrained

    def field_scoring(self, constrained: bool) -> str:
        """What a `FieldResult.scoring` reports for a field read on `constrained`."""
        return "constrained" if constrained else PMI.name if self.correction is PMI else "full"

    def correction_for(
        self,
        cache: ContentFreeScores,
        schema: Schema,
        order: dict[str, Sequence[int]] | None,
    ) -> Correction | None:
        """The call's `Correction` on one listing order, or None for raw scores."""
        if not self.correction.needs_every_score:
            return None
        return Correction(
            cache, schema, order, self.correction, constrained=self.side == "constrained"
        )

    def pruning(
        self, schema: Schema, pruning: str, *, mode: str, whole: frozenset[str]
    ) -> Pruning | None:
        """The call's certified pruning, or None where it cannot prune.

        Args:
            schema: The compiled schema.
            pruning: `"auto"`, `"on"` or `"off"`.
            mode: The call's pass layout (only `"packed"` prunes).
            whole: Fields scored whole under `"auto"` (those with fitted biases).

        Raises:
            InvalidArgumentError: for `pruning="on"` with a correction that needs every
                score or off the packed pass.
        """
        packed = mode == "packed"
        if pruning == "on" and (self.correction.needs_every_score or not packed):
            why = self.correction.option if self.correction.needs_every_score else f"mode={mode!r}"
            raise InvalidArgumentError(
                f"pruning='on' cannot be combined with {why}: the correction needs every "
                "candidate's score, and only the packed pass prunes; accepted: "
                "pruning='auto' or 'off' with it."
            )
        if self.correction.needs_every_score or not packed:
            return None
        return pruning_for(
            schema,
            pruning,
            constrained=self.side == "constrained",
            auto_scoring=self.side == "auto",
            whole=whole,
        )


RAW_FULL = Method("full")
