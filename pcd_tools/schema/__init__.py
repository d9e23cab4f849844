"""Schemas: Pydantic models or the seed's dict spec, compiled into a `Schema` of `FieldSpec`s.

Every field PCD scores is a closed set of candidates:

| annotation                 | kind    | candidates                         |
|----------------------------|---------|------------------------------------|
| `bool`                     | boolean | `true`, `false`                    |
| `Literal[...]` (str, int)  | enum    | the values                         |
| `Enum` subclass            | enum    | the member values                  |
| `Optional[X]` / `X | None` | as X    | plus `null` ("not stated")         |

Fields that are not a closed set (`str`, `float`, a wide or unbounded `int`, `list[str]`,
`datetime.date` / `datetime.datetime`) are generated under a grammar instead, in
declaration order on the same cache (`generated`, `Generation`).

Field descriptions are prompts: they come from `Field(description=...)` or from the
attribute's docstring, and per-choice descriptions from
`json_schema_extra={"choice_descriptions": {...}}`.

The package holds one idea per module:

- `spec`: the compiled `Schema`, `FieldSpec` and `Choice`, and the choice limits;
- `choices`: validating a field's candidate values and their descriptions;
- `models`: a Pydantic model (annotations, docstrings) -> `Schema`;
- `dict_form`: the seed-compatible `StructuredSchema` and `FieldDefinition`;
- `json_schema`: a JSON schema (`Model.model_json_schema()`, OpenAI's strict form, a tool's
  `parameters`) -> `Schema`, via a Pydantic model it builds (`compile_json_schema`);
  `json_schema_values` holds its leaves, errors and model building;
- `compile`: `compile_schema`, the one entry point for every accepted form;
- `examples`: few-shot examples, checked against the compiled schema;
- `generated`: generated fields, and the segments a schema with them is answered in;
- `decisions_port`: a schema as an OpenAI Decisions request (`decisions_request`), asked
  by `/v1/decisions` as `decide` asks it.

The errors live in `pcd_tools.errors`; the `@decision` decorator, which reaches the
decider, lives in `pcd_tools.decide.decorator`.
"""

from __future__ import annotations

from .compile import compile_schema
from .decisions_port import decisions_request
from .dict_form import FieldDefinition, StructuredSchema
from .examples import with_examples
from .labels import Labels, TaxonomyCycleError
from .spec import MAX_CHOICES, Choice, Example, FieldSpec, Generation, Schema, Taxonomy

__all__ = [
    "MAX_CHOICES",
    "Choice",
    "Example",
    "FieldDefinition",
    "FieldSpec",
    "Generation",
    "Labels",
    "Schema",
    "StructuredSchema",
    "Taxonomy",
    "TaxonomyCycleError",
    "compile_schema",
    "decisions_request",
    "with_examples",
]
