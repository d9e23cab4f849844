"""Few-shot examples: `(input text, answer)` pairs checked against a compiled schema.

Examples come from three places, each a list:

- a Pydantic model's `model_config = ConfigDict(json_schema_extra={"examples": [...]})`;
- `@decision(examples=[...])` (after the model_config's, if both are given);
- a decision call's `examples=` (it replaces the schema's own for that call).

One example is `{"input": text, "output": answer}`, `(text, answer)`, where the answer is
a dict shaped like the model's JSON (a nested model's fields in a nested dict, a
discriminated union's chosen branch as a dict with its discriminator, a multi-label field
as a list of labels), or an instance of the schema's own model (`Model(...)`, or a
decision's `.value`).

Every field must be answered, except an `Optional` one, which may be left out (it is then
written as `null`, as the model's `None`). A value must be one of the field's allowed
answers, and a `choices_by` child's one of those allowed with the parent's value. A bad
example raises `InvalidExampleError` naming the list it came from, its index, the field
and the accepted values. A generated field's value (`str`, `float`, a date, ...) is
checked against its annotation (lengths, pattern, bounds) and written as its JSON. The
checked examples are `Example`s: choice indices per scored field, `Written` values per
generated one.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from pydantic import BaseModel

from ..errors import InvalidExampleError
from .spec import Answer, Example, FieldSpec, Schema, Written, value_adapter

__all__ = [
    "EXAMPLE_KEYS",
    "model_config_examples",
    "parse_examples",
    "with_examples",
    "with_wrapper_examples",
]

EXAMPLE_KEYS = ("input", "output")
_SENTINEL = "\x00"  # the prompt builder's context marker uses NUL; an input may not
_SHOWN = 20  # accepted values listed in a message


def model_config_examples(cls: type[BaseModel]) -> Any | None:
    """The raw `examples` of a model's `model_config["json_schema_extra"]`, or None."""
    extra = cls.model_config.get("json_schema_extra")
    if isinstance(extra, Mapping) and "examples" in extra:
        return extra["examples"]
    return None


def with_examples(schema: Schema, raw: Any, source: str = "examples=") -> Schema:
    """The schema with `raw` as its examples (replacing any it had), each checked.

    Args:
        schema: The compiled schema.
        raw: A list of examples (see the module docstring); `[]` for none.
        source: Where the list came from, for messages.

    A part of a schema (`Schema.part`) is asked under its whole's prompt, so the examples
    are its whole's: they replace the whole's, and the same part of it is returned.

    Raises:
        InvalidExampleError: for a malformed example or an answer the schema does not allow.
    """
    if schema.whole is not None:
        return with_examples(schema.whole, raw, source).part(schema.field_names)
    return replace(schema, examples=parse_examples(schema, raw, source))


def with_wrapper_examples(schema: Schema, wrapper: Any) -> Schema:
    """The dict form's examples: `{"name", "instructions", "fields", "examples": [...]}`.

    `StructuredSchema` passes the wrapper it unwrapped (None when it was given the fields
    themselves, whose own keys are field names). Returns `schema` unchanged when
    `wrapper` is not a mapping with an `examples` key.

    Raises:
        InvalidExampleError: as for `with_examples`.
    """
    if isinstance(wrapper, Mapping) and "examples" in wrapper:
        return with_examples(schema, wrapper["examples"], "the schema's 'examples'")
    return schema


def parse_examples(schema: Schema, raw: Any, source: str) -> tuple[Example, ...]:
    """Checks a list of examples against `schema`.

    Raises:
        InvalidExampleError: for a malformed example or an answer the schema does not allow.
    """
    if isinstance(raw, (str, bytes, Mapping)) or not isinstance(raw, Sequence):
        raise InvalidExampleError(
            f"{schema.name}: {source} must be a list of examples; got {type(raw).__name__}. "
            "Accepted: [{'input': text, 'output': {field: value, ...}}, ...] or "
            "[(text, Model(...)), ...].",
            index=-1,
            source=source,
            model=schema.name,
        )
    return tuple(_Checker(schema, source, i).example(item) for i, item in enumerate(raw))


class _Checker:
    """Checks one example, raising `InvalidExampleError` that names it."""

    def __init__(self, schema: Schema, source: str, index: int):
        self.schema = schema
        self.source = source
        self.index = index

    def fail(self, what: str, field: str | None = None) -> InvalidExampleError:
        where = f" field {field!r}:" if field else ""
        return InvalidExampleError(
            f"{self.schema.name}: example #{self.index} of {self.source}:{where} {what}",
            index=self.index,
            source=self.source,
            model=self.schema.name,
            field=field,
        )

    def example(self, item: Any) -> Example:
        if isinstance(item, Mapping):
            unknown = [k for k in item if k not in EXAMPLE_KEYS]
            missing = [k for k in EXAMPLE_KEYS if k not in item]
            if unknown or missing:
                got = f"unknown key(s) {unknown}" if unknown else f"no {missing}"
                raise self.fail(
                    f"{got}; accepted: a dict with exactly the keys {list(EXAMPLE_KEYS)}."
                )
            text, output = item["input"], item["output"]
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            text, output = item
        else:
            raise self.fail(
                f"got {type(item).__name__} {_short(item)}; accepted: {{'input': text, "
                "'output': {field: value, ...}} or (text, answer)."
            )
        if not isinstance(text, str) or not text.strip() or _SENTINEL in text:
            raise self.fail(
                f"input {_short(text)} is not usable; accepted: a non-empty str without NUL "
                "characters."
            )
        if isinstance(output, BaseModel):
            if not isinstance(output, self.schema.model):
                raise self.fail(
                    f"output is a {type(output).__name__}; accepted: an instance of "
                    f"{self.schema.model.__name__} or a dict of its fields."
                )
            output = output.model_dump(mode="json")
        if not isinstance(output, Mapping):
            raise self.fail(
                f"output is a {type(output).__name__}; accepted: a dict of the fields "
                f"{self.schema.field_names} (nested models as nested dicts)."
            )
        return Example(text, self.answers(output))

    def answers(self, output: Mapping[str, Any]) -> tuple[tuple[str, Answer], ...]:
        got: dict[str, Answer] = {}
        used: set[tuple[str, ...]] = set()
        for f in self.schema.fields:
            if f.branch is not None and got.get(f.branch[0]) != f.branch[1]:
                continue  # a union branch the example did not take
            path = tuple(f.key.split("."))
            found, value = _lookup(output, path)
            if not found and not (f.optional and f.kind != "multilabel"):
                raise self.fail(
                    f"no value for {'.'.join(path)!r}; accepted: every field answered (only "
                    f"an Optional field may be left out), one of {_accepted(f)}.",
                    f.name,
                )
            used.add(path)
            got[f.name] = self.value(f, value if found else None, got)
        extra = sorted(".".join(p) for p in _leaf_paths(output) if p not in used)
        if extra:
            keys = sorted(".".join(p) for p in used)
            raise self.fail(
                f"unknown key(s) {extra}; accepted keys: {keys} (a union's fields only for "
                "the branch its discriminator names)."
            )
        return tuple((f.name, got[f.name]) for f in self.schema.fields if f.name in got)

    def value(self, f: FieldSpec, v: Any, got: Mapping[str, Answer]) -> Answer:
        if f.generation is not None:
            return self.written(f, v)
        if f.kind == "multilabel":
            return self.labels(f, v)
        i = _match(f, v)
        if i is None:
            raise self.fail(
                f"{_short(v)} is not an allowed value; accepted: {_accepted(f)}.", f.name
            )
        if f.choices_by is not None:
            parent, table = f.choices_by
            pi = got.get(parent)
            if isinstance(pi, int) and i not in table[pi]:
                pl = self.schema.field(parent).choices[pi].label
                ok = [f.choices[j].label for j in table[pi]]
                raise self.fail(
                    f"{_short(v)} is not allowed when {parent!r} is {pl!r}; accepted: {ok}.",
                    f.name,
                )
        return i

    def written(self, f: FieldSpec, v: Any) -> Written:
        """A generated field's value, checked against its annotation (lengths, pattern,
        bounds) and written as the decoder would: its JSON."""
        from pydantic import ValidationError

        assert f.generation is not None
        adapter = value_adapter(f.generation, f.optional)
        try:
            native = adapter.validate_python(v)
        except ValidationError as e:
            what = "; ".join(err["msg"] for err in e.errors())
            raise self.fail(
                f"{_short(v)} is not a valid value ({what}); accepted: "
                f"{f.generation.json_schema(f.optional)}.",
                f.name,
            ) from None
        return Written(json.dumps(adapter.dump_python(native, mode="json"), ensure_ascii=False))

    def labels(self, f: FieldSpec, v: Any) -> tuple[int, ...]:
        if isinstance(v, (str, bytes, Mapping)) or not isinstance(v, (list, tuple, set, frozenset)):
            raise self.fail(
                f"{_short(v)} is not a list of labels; accepted: a list of some of {f.labels}.",
                f.name,
            )
        idx: list[int] = []
        for item in v:
            i = _match(f, item)
            if i is None or i in idx:
                what = "is not one of its labels" if i is None else "is given twice"
                raise self.fail(f"label {_short(item)} {what}; accepted: {f.labels}.", f.name)
            idx.append(i)
        high = f.max_labels if f.max_labels is not None else len(f.choices)
        if not f.min_labels <= len(idx) <= high:
            raise self.fail(
                f"{len(idx)} label(s) given; accepted: {f.min_labels} to {high} of {f.labels}.",
                f.name,
            )
        return tuple(sorted(idx))


def _lookup(output: Mapping[str, Any], path: tuple[str, ...]) -> tuple[bool, Any]:
    node: Any = output
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return False, None
        node = node[key]
    return True, node


def _leaf_paths(node: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for k, v in node.items():
        path = (*prefix, str(k))
        if isinstance(v, Mapping) and v:
            out.extend(_leaf_paths(v, path))
        else:
            out.append(path)
    return out


def _match(f: FieldSpec, v: Any) -> int | None:
    """The index of the choice `v` is (its JSON value, or its Enum member); strict about
    types, so `1` is not `True` and `"1"` is not `1`."""
    key = v.value if isinstance(v, enum.Enum) else v
    for i, c in enumerate(f.choices):
        if key is None and c.label is None:
            return i
        if key is not None and type(key) is type(c.label) and key == c.label:
            return i
    return None


def _accepted(f: FieldSpec) -> str:
    null = " or null" if f.optional else ""
    ints = [c.label for c in f.choices if c.label is not None]
    if f.ordered and len(ints) > _SHOWN:
        step = ints[1] - ints[0]
        every = f" in steps of {step}" if step != 1 else ""
        return f"an int from {ints[0]} to {ints[-1]}{every}{null}"
    labels = f.labels
    if len(labels) > _SHOWN:
        return f"{labels[:_SHOWN]} ... and {len(labels) - _SHOWN} more"
    return repr(labels)


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."
