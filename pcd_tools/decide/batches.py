"""What both orchestrators share: contexts batched by length, the fitted calibration's
check, and each `Decision` built from its row and the call's `BatchTiming`.

`decide.scored` (scored schemas) and `decide.generated` (schemas with generated fields)
differ in how a batch is run; everything around the run is here, once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..answers.result import BatchTiming, Decision, FieldResult
from ..prompt import Segment

if TYPE_CHECKING:
    from ..schema import Schema
    from .methods import Method
    from .state import DecideState

__all__ = ["CallRecord", "length_batches"]


def length_batches(ctxs: Sequence[str], batch_size: int) -> Iterator[list[int]]:
    """The indices of `ctxs` in batches of at most `batch_size`, shortest first, so that
    a batch holds contexts of similar length (less padding). Callers answer in input
    order by index."""
    by_len = sorted(range(len(ctxs)), key=lambda i: len(ctxs[i]))
    for start in range(0, len(ctxs), batch_size):
        yield by_len[start : start + batch_size]


@dataclass(frozen=True)
class CallRecord:
    """What every `Decision` of one call reports about how it was made.

    Build it with `CallRecord.start`, which also checks the decider's fitted
    calibration against the schema and the label-free correction.

    Attributes:
        model_id: The decider's model.
        device: `cpu`, `metal` or `cuda`.
        compute: The model's matrix arithmetic (`LoadedModel.compute`).
        temperature: The softmax temperature.
        scoring: The call's scoring, resolved (`methods.Method.scoring`).
        mode: The pass layout, the engine's default filled in.
        calibration: The decider's fitted `Calibration`, or None.
        method: The label-free correction, `"contextual"` or `"none"`.
        examples: The schema's few-shot examples.
    """

    model_id: str
    device: str
    compute: str
    temperature: float
    scoring: str
    mode: str
    calibration: Any
    method: str
    examples: int

    @classmethod
    def start(
        cls,
        state: DecideState,
        compiled: Schema,
        ctxs: Sequence[str],
        *,
        temperature: float,
        mode: str | None,
        method: Method,
    ) -> CallRecord:
        """The call's record, once its fitted calibration is checked.

        Raises:
            CalibrationMismatchError: if the decider's calibration was fitted for another
                schema or on top of another label-free correction.
        """
        cal = state.calibration
        if cal is not None and ctxs:
            cal.check_schema(compiled)
            cal.check_label_free(method.label_free)
        return cls(
            model_id=state.loaded.model_id,
            device=state.loaded.device,
            compute=state.loaded.compute,
            temperature=temperature,
            scoring=method.scoring,
            mode=mode or state.engine.default_mode,
            calibration=cal,
            method=method.method,
            examples=len(compiled.examples),
        )

    def decision(
        self,
        compiled: Schema,
        fields: dict[str, FieldResult],
        joint: Any,
        timing: BatchTiming,
        *,
        passes: int,
        prompt_tokens: int,
        prefix_cache_hit: bool,
        segments: Sequence[Segment] = (),
    ) -> Decision[Any]:
        """One row's `Decision`: its value built from `fields`, and an equal share of the
        batch's times (so the shares of a batch add up to its wall time)."""
        n = timing.size
        cal = self.calibration
        return Decision(
            value=compiled.build({name: f.value for name, f in fields.items()}),
            fields=fields,
            prefill_ms=timing.prefill_ms / n,
            suffix_eval_ms=timing.suffix_eval_ms / n,
            elapsed_ms=timing.elapsed_ms / n,
            sequential_forward_passes=passes,
            prompt_tokens=prompt_tokens,
            prefix_cache_hit=prefix_cache_hit,
            model_id=self.model_id,
            device=self.device,
            compute=self.compute,
            temperature=self.temperature,
            scoring=self.scoring,
            mode=self.mode,
            calibrated=cal is not None,
            calibration_file=getattr(cal, "path", None) if cal is not None else None,
            batch=timing,
            joint=joint,
            calibration_method=self.method,
            examples=self.examples,
            content_free_ms=timing.content_free_ms / n,
            generate_ms=timing.generate_ms / n,
            attention_ms=timing.attention_ms / n,
            segments=tuple(segments),
        )
