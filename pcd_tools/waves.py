"""Dependent fields, answered in waves on the same KV cache.

The engine runs the first pass, then asks `WaveAnswers.next_questions` what each context
needs next: the fields whose parents are all answered, each written after its ancestors'
answers. Contexts whose earlier answers differ get different questions; the engine
groups the contexts that share them into one pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .joint import answers
from .prompt import Question, field_questions, questions
from .result import FieldResult
from .schema import Schema
from .schema.dependencies import ancestors

__all__ = ["WaveAnswers", "has_waves"]


def has_waves(schema: Schema) -> bool:
    """Whether some field is not answered by the first pass (so it takes later waves)."""
    return {q.field for q in questions(schema)} != set(schema.field_names)


@dataclass(frozen=True)
class WaveAnswers:
    """Chooses each wave's answers the way the decision will report them.

    Args:
        schema: The compiled schema.
        temperature: The decision's temperature.
        scoring: `"full"`, `"constrained"` or `"pmi"` (whose raw scores are full ones).
        calibration: The decider's calibration, if any (biases can change an answer).
        correction: The decision's label-free correction, if any: called with the
            questions and their log scores, it returns the corrected scores
            (`pcd_tools.contextual.Correction`).
    """

    schema: Schema
    temperature: float
    scoring: str
    calibration: Any = None
    correction: Any = None

    def results(self, scored: Sequence[tuple[Question, Any, np.ndarray]]) -> dict[str, FieldResult]:
        """The field results of a context's scored questions so far."""
        qs = [q for q, _, _ in scored]
        logz = [t.score(e, constrained=self.scoring == "constrained") for _, t, e in scored]
        if self.correction is not None:
            logz = self.correction(qs, logz)
        return answers(self.schema, qs, logz, self.temperature, self.calibration)[0]

    def next_questions(self, scored: Sequence[tuple[Question, Any, np.ndarray]]) -> list[Question]:
        """The next wave's questions for one context, or [] when every field is answered."""
        done = self.results(scored)
        fields = self.schema.fields
        out: list[Question] = []
        for f in fields:
            if f.name in done or not all(p in done for p in f.depends_on):
                continue
            if f.branch is not None:  # a union branch that was not taken is not asked
                kind, index = f.branch
                if done[kind].label != self.schema.field(kind).choices[index].label:
                    continue
            given = []
            for a in ancestors(fields, f.name):
                spec, res = self.schema.field(a), done[a]
                given.append((a, spec.labels.index(res.label)))
            out.extend(field_questions(self.schema, f, given))
        return out
