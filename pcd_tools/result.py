"""Results: `Decision[T]`, per-field `FieldResult`, and the seed-compatible response dict."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from .schema import FieldSpec

__all__ = ["Decision", "FieldResult", "softmax_scores"]

T = TypeVar("T")


def softmax_scores(logz: np.ndarray, temperature: float) -> np.ndarray:
    """`softmax(logz / T)` in float64, stable."""
    z = np.asarray(logz, dtype=np.float64) / float(temperature)
    z = z - z.max()
    e = np.exp(z)
    return e / e.sum()


@dataclass(frozen=True)
class FieldResult:
    """The answer for one field.

    Args:
        name: Field name.
        value: Native value (`bool`, `Enum` member, `str`, `int` or `None`).
        label: JSON value of the answer.
        probability: Probability of the answer.
        distribution: Every candidate's JSON value -> probability, in declaration order.
        log_scores: Each candidate's log score `z_c` before temperature.
        spec: The compiled field.
    """

    name: str
    value: Any
    label: Any
    probability: float
    distribution: dict[Any, float]
    log_scores: tuple[float, ...]
    spec: FieldSpec = field(repr=False)

    @classmethod
    def from_probs(cls, spec: FieldSpec, probs: np.ndarray, log_scores: Any) -> FieldResult:
        """The answer with the highest probability (ties: the first declared candidate)."""
        best = int(np.argmax(probs))
        choice = spec.choices[best]
        return cls(
            name=spec.name,
            value=choice.value,
            label=choice.label,
            probability=float(probs[best]),
            distribution={c.label: float(q) for c, q in zip(spec.choices, probs)},
            log_scores=tuple(float(z) for z in log_scores),
            spec=spec,
        )

    @property
    def top_choices(self) -> list[tuple[Any, float]]:
        """All candidates as `(label, probability)`, most probable first (ties: declared order)."""
        items = list(self.distribution.items())
        order = sorted(range(len(items)), key=lambda i: (-items[i][1], i))
        return [items[i] for i in order]

    @property
    def margin(self) -> float:
        """Probability of the answer minus that of the runner-up."""
        top = self.top_choices
        return top[0][1] - (top[1][1] if len(top) > 1 else 0.0)

    @property
    def entropy(self) -> float:
        """Shannon entropy of the distribution, in nats."""
        return float(-sum(p * math.log(p) for p in self.distribution.values() if p > 0))

    @property
    def cardinality(self) -> int:
        """Number of candidates."""
        return len(self.distribution)


@dataclass(frozen=True)
class Decision(Generic[T]):
    """A scored decision.

    Args:
        value: An instance of the schema's model with native types.
        fields: Per-field results.
        prefill_ms: Wall time of the prompt prefill.
        suffix_eval_ms: Wall time of the fields pass (field stems and trie nodes).
        elapsed_ms: Wall time of the whole call.
        sequential_forward_passes: Model calls that ran one after another (measured).
        prompt_tokens: Prompt length in tokens.
        prefix_cache_hit: Whether the schema part of the prompt came from the cache.
        model_id: The model that scored it.
        device: `cpu`, `metal` or `cuda`.
        temperature: Softmax temperature used (calibrated temperatures are per field).
        scoring: `"full"` or `"constrained"`.
        mode: Layout of the fields pass.
        calibrated: Whether per-field temperatures from a calibration file were applied.
        calibration_file: That file, if any.
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

    @property
    def confidence(self) -> float:
        """The lowest answer probability over all fields."""
        return min(f.probability for f in self.fields.values())

    def low_confidence(self, threshold: float) -> list[str]:
        """Names of fields whose probability is below `threshold`."""
        return [n for n, f in self.fields.items() if f.probability < threshold]

    def to_response(self) -> dict[str, Any]:
        """The seed-compatible response dict (DESIGN §3), JSON-serialisable."""
        parsed = {
            n: {"value": f.label, "prob": round(f.probability, 6)} for n, f in self.fields.items()
        }
        telemetry = {
            n: {
                "confidence": round(f.probability, 6),
                "cardinality": f.cardinality,
                "margin": round(f.margin, 6),
                "entropy": round(f.entropy, 6),
                "top_choices": [
                    {"choice": c, "probability": round(p, 6)} for c, p in f.top_choices
                ],
            }
            for n, f in self.fields.items()
        }
        return {
            "mode": "parallel_constrained_calibrated"
            if self.calibrated
            else "parallel_constrained",
            "elapsed_ms": round(self.elapsed_ms, 3),
            "prefill_ms": round(self.prefill_ms, 3),
            "suffix_eval_ms": round(self.suffix_eval_ms, 3),
            "sequential_forward_passes": self.sequential_forward_passes,
            "is_valid_json": True,
            "schema_match": True,
            "parsed_json": parsed,
            "field_telemetry": telemetry,
            "model": self.model_id,
            "device": self.device,
            "temperature": self.temperature,
            "scoring": self.scoring,
            "prompt_tokens": self.prompt_tokens,
            "prefix_cache_hit": self.prefix_cache_hit,
            "calibrated": self.calibrated,
            "calibration_file": self.calibration_file,
        }
