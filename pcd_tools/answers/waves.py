"""Dependent fields, answered in waves on the same KV cache.

The engine runs the first pass, then asks `WaveAnswers.next_questions` what each context
needs next: the fields whose parents are all answered, each written after its ancestors'
answers. Contexts whose earlier answers differ get different questions; the engine
groups the contexts that share them into one pass.

In a schema with generated fields, each run of scored fields (a segment) is answered the
same way on the cache that holds everything written before it: `WaveAnswers.within`
restricts the waves to the segment, and `chosen` gives the answers the segment writes
into the JSON for what follows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..prompt import Question, field_questions, questions
from ..schema import Schema
from ..schema.dependencies import ancestors
from ..schema.spec import Answer, FieldSpec
from .joint import answers
from .result import FieldResult

__all__ = ["WaveAnswers", "has_waves"]


def has_waves(schema: Schema) -> bool:
    """Whether some scored field is not answered by the first pass (so it takes later
    waves)."""
    return {q.field for q in questions(schema)} != {
        f.name for f in schema.fields if not f.generated
    }


def written(spec: FieldSpec, res: FieldResult) -> Answer:
    """A field's answer as it is written into the JSON: its choice's index, or for a
    multi-label field the indices of the labels it chose (those over the threshold, as
    the decision reports them), in declared order."""
    if spec.kind == "multilabel":
        return tuple(spec.labels.index(label) for label in res.label)
    return spec.labels.index(res.label)


@dataclass(frozen=True)
class WaveAnswers:
    """Chooses each wave's answers the way the decision will report them.

    Args:
        schema: The compiled schema.
        temperature: The decision's temperature.
        constrained_for: Given a question and its trie, whether its scores are
            constrained ones (`pcd_tools.decide.methods.Method.constrained_side`: all of
            them under `scoring="constrained"`, only some under `"auto"`).
        calibration: The decider's calibration, if any (biases can change an answer).
        correction: The decision's label-free correction, if any: called with the
            questions and their log scores, it returns the corrected scores
            (`pcd_tools.decide.contextual.Correction`).
        fields: The scored fields these waves answer (one segment of a schema with
            generated fields), or None for every field. Parents outside it are already
            written in the JSON before the segment, so they are neither waited for nor
            written again.
    """

    schema: Schema
    temperature: float
    constrained_for: Callable[[Question, Any], bool]
    calibration: Any = None
    correction: Any = None
    fields: frozenset[str] | None = None

    def within(self, names: Sequence[str]) -> WaveAnswers:
        """The same choices, with the waves restricted to the segment `names`."""
        return replace(self, fields=frozenset(names))

    def chosen(
        self, scored: Sequence[tuple[Question, Any, np.ndarray]]
    ) -> list[tuple[str, Answer]]:
        """The answers of this segment's fields, in declaration order, as they are
        written into the JSON (a union branch that was not taken writes nothing)."""
        done = self.results(scored)
        out: list[tuple[str, Answer]] = []
        for f in self.schema.fields:
            if (self.fields is not None and f.name not in self.fields) or f.name not in done:
                continue
            if f.branch is not None:
                kind, index = f.branch
                if kind in done and done[kind].label != self.schema.field(kind).labels[index]:
                    continue
            out.append((f.name, written(f, done[f.name])))
        return out

    def results(self, scored: Sequence[tuple[Question, Any, np.ndarray]]) -> dict[str, FieldResult]:
        """The field results of a context's scored questions so far."""
        qs = [q for q, _, _ in scored]
        side = self.constrained_for
        logz = [t.scores(e, constrained=side(q, t)) for q, t, e in scored]
        if self.correction is not None:
            logz = self.correction(qs, logz)
        return answers(self.schema, qs, logz, self.temperature, self.calibration)[0]

    def next_questions(self, scored: Sequence[tuple[Question, Any, np.ndarray]]) -> list[Question]:
        """The next wave's questions for one context, or [] when every field is answered."""
        done = self.results(scored)
        fields = self.schema.fields
        inside = self.fields
        out: list[Question] = []
        for f in fields:
            if f.generated or (inside is not None and f.name not in inside):
                continue
            if f.name in done or not all(
                p in done or (inside is not None and p not in inside) for p in f.depends_on
            ):
                continue
            if f.branch is not None:  # a union branch that was not taken is not asked
                kind, index = f.branch
                if done[kind].label != self.schema.field(kind).choices[index].label:
                    continue
            given = []
            for a in ancestors(fields, f.name):
                if inside is not None and a not in inside:
                    continue  # written before the segment
                given.append((a, written(self.schema.field(a), done[a])))
            out.extend(field_questions(self.schema, f, given))
        return out
