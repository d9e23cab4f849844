"""What the orchestrators read from a decider, so that none of them imports it.

`Decider` sits above its orchestrators (`decide.scored`, `decide.generated`,
`decide.batches`, `decide.loo`, `decide.aio`): it calls them, and they do not import it,
not even for type hints. They read a `DecideState`, a frozen snapshot of the decider's
engine, model, calibrations and caches, which `Decider.state` builds on each call (so a
clone from `with_calibration` or a reassigned attribute is always current). `loo` and
`aio` also call back into `decide_many`; they take the decider as a `DecidesMany`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..answers.calibration import Calibration
    from ..answers.result import Decision, LabelFreeChoice
    from ..engine.load.sources import LoadedModel
    from ..engine.scorer import Engine
    from ..schema import Schema
    from .contextual import ContentFreeScores
    from .options import DecideOptions

__all__ = ["ChoiceCache", "DecideState", "DecidesMany"]


@dataclass(frozen=True)
class DecideState:
    """A decider's parts, as its orchestrators read them.

    Attributes:
        engine: The engine that runs the passes.
        loaded: The loaded model (its id, device, compute, tokenizer, end-of-text ids).
        calibration: The fitted `Calibration`, or None.
        label_free: The label-free correction of calls that name none, `"none"` or
            `"contextual"`.
        content_free: The content-free scores of contextual calibration and PMI.
        loo_choices: The cached `calibration="auto"` choices (`decide.loo.LooChoices`).
    """

    engine: Engine
    loaded: LoadedModel
    calibration: Calibration | None
    label_free: str
    content_free: ContentFreeScores
    loo_choices: ChoiceCache


class DecidesMany(Protocol):
    """What `loo` and `aio` call back into: a decider's `decide_many`, and its state."""

    @property
    def state(self) -> DecideState: ...

    def decide_many(
        self,
        schema: Any,
        contexts: Sequence[str],
        *,
        options: DecideOptions | None = None,
        batch_size: int = 32,
    ) -> list[Decision[Any]]: ...


class ChoiceCache(Protocol):
    """The `calibration="auto"` choice cache (`decide.loo.LooChoices`)."""

    def get(
        self, decider: DecidesMany, schema: Schema, options: DecideOptions
    ) -> LabelFreeChoice: ...
