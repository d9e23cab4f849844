"""Typed errors. Every error pcd-tools raises on purpose derives from `PcdToolsError`.

Each subclass also derives from the built-in exception that fits (`TypeError`,
`ValueError`, `FileNotFoundError`, ...) so callers that catch the built-ins keep working.
"""

from __future__ import annotations

__all__ = [
    "BlasSetupError",
    "ChoicesByError",
    "ContextTooLongError",
    "DecodeUnavailableError",
    "DependencyCycleError",
    "DuplicateChoiceError",
    "EmptySchemaError",
    "GenerationError",
    "GenerationLimitError",
    "InvalidArgumentError",
    "InvalidChoiceError",
    "InvalidContextError",
    "InvalidFieldNameError",
    "InvalidFieldOptionError",
    "InvalidJsonSchemaError",
    "LabelSetTooLargeError",
    "ModelLoadError",
    "NativeBuildError",
    "NestingTooDeepError",
    "PcdToolsError",
    "SchemaError",
    "SchemaTooLargeError",
    "TooFewChoicesError",
    "TooManyChoicesError",
    "UnknownKeyError",
    "UnknownParentError",
    "UnportableFieldError",
    "UnsupportedFieldError",
    "UnsupportedSchemaKeywordError",
    "UnsupportedUnionError",
]


class PcdToolsError(Exception):
    """Root of every error raised by pcd-tools."""


# --- schema -------------------------------------------------------------------------------


class SchemaError(PcdToolsError, ValueError):
    """A schema (Pydantic model or dict spec) cannot be scored.

    Attributes:
        model: Name of the model or schema the problem is in.
        field: Name of the offending field, if any.
    """

    def __init__(self, message: str, *, model: str | None = None, field: str | None = None):
        super().__init__(message)
        self.model = model
        self.field = field


class UnsupportedFieldError(SchemaError, TypeError):
    """A field's annotation or declared type is not one PCD can score."""


class UnsupportedUnionError(UnsupportedFieldError):
    """A union has no discriminator, or a branch holds fields PCD cannot score."""


class UnportableFieldError(UnsupportedFieldError):
    """A schema has a field (or few-shot examples) that the OpenAI Decisions API cannot
    ask, so it cannot be ported to `/v1/decisions` as it is decided
    (`pcd_tools.schema.decisions_request`)."""


class UnknownKeyError(SchemaError):
    """A dict schema (the wrapper or a field spec) has a key it does not accept, often a typo.

    Attributes:
        key: The unknown key.
        suggestion: The closest accepted key, if one is close enough.
    """

    def __init__(
        self,
        message: str,
        *,
        key: str,
        suggestion: str | None = None,
        model: str | None = None,
        field: str | None = None,
    ):
        super().__init__(message, model=model, field=field)
        self.key = key
        self.suggestion = suggestion


class TooManyChoicesError(SchemaError):
    """A field declares more values than it can take: a multi-label field or a scored int
    range more than 255, a Decisions API question more than 255, or a single-choice field
    whose token trie would not fit in memory (`LabelSetTooLargeError`)."""


class LabelSetTooLargeError(TooManyChoicesError):
    """A single-choice field's labels need more memory for their token trie than this
    process can give them; the message has the numbers."""


class TooFewChoicesError(SchemaError):
    """A field declares no choices (an empty enum, or an int range with no integer)."""


class DuplicateChoiceError(SchemaError):
    """An enum field declares the same choice twice."""


class InvalidChoiceError(SchemaError):
    """A choice is empty, of the wrong type, or otherwise not scoreable."""


class InvalidFieldNameError(SchemaError):
    """A field name is not a Python identifier."""


class EmptySchemaError(SchemaError):
    """A schema declares no fields."""


class InvalidFieldOptionError(SchemaError):
    """A field option (`threshold`, `min_length`/`max_length`, ...) is out of range."""


class UnknownParentError(SchemaError):
    """A field depends on (or takes its choices by) a field that does not exist."""


class DependencyCycleError(SchemaError):
    """Fields depend on each other in a cycle."""


class ChoicesByError(SchemaError):
    """A `choices_by` mapping names values that are not the parent's or the field's."""


class NestingTooDeepError(SchemaError):
    """Nested models go deeper than the limit, or a model contains itself."""


class UnsupportedSchemaKeywordError(UnsupportedFieldError):
    """A JSON schema uses a keyword (or a `type`) PCD cannot score, e.g. free text or numbers.

    Attributes:
        keyword: The JSON-schema keyword, e.g. `"pattern"`, `"type"` or `"anyOf"`.
        path: Where it is, as a JSON pointer into the schema, e.g.
            `/properties/customer/properties/name` (`""` is the schema's top).
    """

    def __init__(
        self,
        message: str,
        *,
        keyword: str,
        path: str,
        model: str | None = None,
        field: str | None = None,
    ):
        super().__init__(message, model=model, field=field)
        self.keyword = keyword
        self.path = path


class InvalidJsonSchemaError(SchemaError):
    """A JSON schema is malformed: not an object, `properties` not an object, a `$ref`
    that points nowhere, an `enum` that is not a list...

    Attributes:
        path: Where the problem is, as a JSON pointer into the schema (`""` is the top).
    """

    def __init__(
        self, message: str, *, path: str, model: str | None = None, field: str | None = None
    ):
        super().__init__(message, model=model, field=field)
        self.path = path


class SchemaTooLargeError(SchemaError):
    """A schema has more fields than the caller's limit (`max_fields`).

    Attributes:
        count: The number of fields the schema compiles to.
        limit: The most fields accepted.
    """

    def __init__(self, message: str, *, count: int, limit: int, model: str | None = None):
        super().__init__(message, model=model)
        self.count = count
        self.limit = limit


# --- inputs -------------------------------------------------------------------------------


class InvalidArgumentError(PcdToolsError, ValueError):
    """An argument (temperature, scoring, mode, batch size...) is out of range."""


class InvalidContextError(PcdToolsError, TypeError):
    """The context given to a decision is not a string."""


class ContextTooLongError(PcdToolsError, ValueError):
    """The prompt does not fit in the model's context window; nothing is truncated.

    Attributes:
        prompt_tokens: Tokens the full prompt (with the field passes) needs.
        max_tokens: The model's context window.
    """

    def __init__(self, prompt_tokens: int, max_tokens: int, *, detail: str = ""):
        msg = (
            f"The prompt needs {prompt_tokens} tokens but the model's context window is "
            f"{max_tokens} tokens. pcd-tools never truncates input: shorten the context"
            f" or use a model with a longer window.{(' ' + detail) if detail else ''}"
        )
        super().__init__(msg)
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens


# --- models and platform --------------------------------------------------------------------


class ModelLoadError(PcdToolsError, RuntimeError):
    """A model could not be loaded. The message names the source and the fix.

    Attributes:
        source: What the caller asked to load (path, repo id, or "embedded").
    """

    def __init__(self, message: str, *, source: str | None = None):
        super().__init__(message)
        self.source = source


class BlasSetupError(PcdToolsError, RuntimeError):
    """A requested BLAS library could not be bound into MLX."""


class NativeBuildError(PcdToolsError, RuntimeError):
    """A bundled C helper could not be compiled (no compiler, or the compile failed)."""


# --- batch jobs (`pcd batch`, `pcd_tools.batch`, `pcd_tools.ray`) ---------------------------


class BatchError(PcdToolsError, RuntimeError):
    """A batch job cannot start or go on (its rows' own failures are results, not this)."""


class OutputExistsError(BatchError, FileExistsError):
    """The output file exists and no checkpoint says it belongs to this job.

    Attributes:
        path: The output file.
    """

    def __init__(self, message: str, *, path: str):
        super().__init__(message)
        self.path = path


class CheckpointMismatchError(BatchError, ValueError):
    """A checkpoint was left by a different job (other input, schema, model or options).

    Attributes:
        differences: Each differing setting: `(name, checkpoint's value, this job's value)`.
    """

    def __init__(self, message: str, *, differences: list[tuple[str, object, object]]):
        super().__init__(message)
        self.differences = differences


class BatchLockedError(BatchError):
    """Another process is writing the same output."""


class InputNotFoundError(BatchError, FileNotFoundError):
    """A batch job's input file does not exist."""


class InvalidExampleError(SchemaError):
    """A few-shot example does not fit its schema (a missing or unknown key, a value that
    is not an allowed answer, an empty input).

    Attributes:
        index: The example's position in the list it was given in.
        source: Where the list came from (`model_config`, `@decision(examples=...)`, ...).
    """

    def __init__(
        self,
        message: str,
        *,
        index: int,
        source: str,
        model: str | None = None,
        field: str | None = None,
    ):
        super().__init__(message, model=model, field=field)
        self.index = index
        self.source = source


# --- generated fields ---------------------------------------------------------------------


class GenerationError(PcdToolsError, RuntimeError):
    """A generated field could not be decoded under its grammar (the vocabulary cannot
    continue it, or its grammar cannot be built for this tokenizer).

    Attributes:
        field: The generated field.
        partial_text: The value's text decoded so far.
    """

    def __init__(self, message: str, *, field: str, partial_text: str = ""):
        super().__init__(message)
        self.field = field
        self.partial_text = partial_text


class GenerationLimitError(GenerationError):
    """A generated field reached its `max_new_tokens` before its grammar let it end.

    Nothing is truncated: the error carries what was generated.

    Attributes:
        field: The generated field.
        limit: The token limit it reached.
        partial_text: The value's text decoded so far (`limit` tokens).
        context_index: The context it happened on, within the call's contexts.
    """

    def __init__(
        self,
        message: str,
        *,
        field: str,
        limit: int,
        partial_text: str,
        context_index: int | None = None,
    ):
        super().__init__(message, field=field, partial_text=partial_text)
        self.limit = limit
        self.context_index = context_index


class DecodeUnavailableError(PcdToolsError, RuntimeError):
    """Native int8 decoding (`decode="int8"`) was asked for but cannot run here.

    Attributes:
        reason: Why (the device, the model's architecture, no C compiler, ...).
    """

    def __init__(self, message: str, *, reason: str):
        super().__init__(message)
        self.reason = reason
