"""pcd-tools: answer bounded decisions by scoring the allowed answers with one shared pass.

`import pcd_tools` is light: MLX, LangChain and FastAPI load only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_names
from .decide.decorator import decision
from .errors import (
    ContextTooLongError,
    ModelLoadError,
    PcdToolsError,
    SchemaError,
)
from .schema import FieldDefinition, Labels, StructuredSchema

if TYPE_CHECKING:
    from .answers.result import Decision, FieldResult
    from .decide.decider import Decider
    from .decide.seed import run_parallel_generation

__version__ = "0.1.0"

__all__ = [
    "ContextTooLongError",
    "Decider",
    "Decision",
    "FieldDefinition",
    "FieldResult",
    "Labels",
    "ModelLoadError",
    "PcdToolsError",
    "SchemaError",
    "StructuredSchema",
    "decision",
    "run_parallel_generation",
]

_LAZY = {
    "Decider": "decide.decider",
    "run_parallel_generation": "decide.seed",
    "Decision": "answers.result",
    "FieldResult": "answers.result",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__, globals())
