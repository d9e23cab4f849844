"""What a cascade returns: the final answer per field (`FieldOutcome`), what each stage did
(`StageRecord`) and the whole result (`CascadeResult`); `pcd_tools.agents.cascade` runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["CascadeResult", "FieldOutcome", "Row", "StageRecord"]


@dataclass(frozen=True)
class FieldOutcome:
    """The final answer for one field.

    Args:
        name: Field name.
        value: Native value (`bool`, `Enum` member, `str`, `int` or `None`).
        label: JSON value.
        stage: Name of the stage that decided it.
        probability: That stage's probability, or None for stages without one.
    """

    name: str
    value: Any
    label: Any
    stage: str
    probability: float | None


@dataclass(frozen=True)
class StageRecord:
    """What one stage did.

    Args:
        name: Stage name.
        kind: `"decider"`, `"chat_model"`, `"human"` or a custom stage's kind.
        asked: Fields the stage was asked to decide.
        candidates: Labels offered per field, most probable first.
        answered: Fields it answered.
        escalated: Fields passed on to the next stage (below threshold, missing or failed).
        latency_ms: Wall time of the stage.
        error: `"ExceptionType: message"` if the stage failed (its fields escalate).
        exception: The exception itself, if the stage failed.
    """

    name: str
    kind: str
    asked: list[str]
    candidates: dict[str, list[Any]]
    answered: list[str]
    escalated: list[str]
    latency_ms: float
    error: str | None = None
    exception: BaseException | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class CascadeResult:
    """A cascade's answer.

    Args:
        value: An instance of the schema's model.
        fields: Per-field `FieldOutcome`.
        stages: One `StageRecord` per stage that ran, in order.
        unresolved: Fields still below threshold after the last stage (answer kept).
        decision: The first stage's `Decision`, if it was a `Decider` and succeeded.
        elapsed_ms: Wall time of the whole cascade.
    """

    value: Any
    fields: dict[str, FieldOutcome]
    stages: list[StageRecord]
    unresolved: list[str]
    decision: Any
    elapsed_ms: float

    @property
    def decided_by(self) -> dict[str, str]:
        """Field name -> name of the stage that decided it."""
        return {n: f.stage for n, f in self.fields.items()}

    @property
    def probabilities(self) -> dict[str, float | None]:
        """Field name -> probability from the deciding stage (None if it had none)."""
        return {n: f.probability for n, f in self.fields.items()}

    @property
    def latency_ms(self) -> dict[str, float]:
        """Stage name -> wall time."""
        return {s.name: s.latency_ms for s in self.stages}

    @property
    def errors(self) -> dict[str, str]:
        """Stage name -> `"ExceptionType: message"`, for each stage that failed."""
        return {s.name: s.error for s in self.stages if s.error is not None}


@dataclass
class Row:
    """One input's progress through a cascade's stages (internal to `Cascade`)."""

    text: str
    pending: list[str]
    outcome: dict[str, FieldOutcome] = field(default_factory=dict)
    dists: dict[str, dict[Any, float]] = field(default_factory=dict)
    sets: dict[str, list[Any]] = field(default_factory=dict)
    records: list[StageRecord] = field(default_factory=list)
    first: Any = None
