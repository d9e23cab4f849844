"""The seed's entry point, `run_parallel_generation`: one decision as the response dict."""

from __future__ import annotations

from typing import Any

from .checks import Scoring
from .decider import Decider, default_decider

__all__ = ["run_parallel_generation"]


def run_parallel_generation(
    context: str,
    schema: Any,
    temperature: float = 1.0,
    decider: Decider | None = None,
    *,
    scoring: Scoring = "full",
) -> dict[str, Any]:
    """The seed's entry point: scores `schema` for `context` and returns the response dict.

    Args:
        context: The text to decide on.
        schema: A `StructuredSchema`, dict spec, list of `FieldDefinition` or Pydantic model.
        temperature: Softmax temperature (> 0).
        decider: The decider to use; defaults to the embedded model.
        scoring: `"full"` or `"constrained"`.
    """
    d = decider or default_decider()
    return d.decide(schema, context, temperature=temperature, scoring=scoring).to_response()
