"""The leaves of a JSON schema and what `json_schema` builds from it.

`json_schema` walks a schema's structure (`$ref`, objects, unions, arrays); this module
holds what that walk is made of: `At` (where a node is, and the typed errors naming it),
the scalar values (`enum`/`const` -> `Literal[...]` or `bool`, an integer with
`minimum`/`maximum` -> a bounded `int`), the parsed objects and unions, and the Pydantic
models built from them (`build_model`).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, create_model
from pydantic import Field as PydField

from ..errors import (
    InvalidJsonSchemaError,
    NestingTooDeepError,
    UnsupportedSchemaKeywordError,
)
from .spec import MAX_CHOICES, MIN_CHOICES

__all__ = [
    "PCD_KEYS",
    "At",
    "FieldMeta",
    "ParsedObject",
    "ParsedUnion",
    "build_model",
    "enum_type",
    "int_range",
    "number_type",
    "text_type",
    "values_type",
]

_MODULE = f"{__name__}.built"  # the built models' `__module__`: no source file to search

PCD_KEYS = (
    "depends_on",
    "choices_by",
    "threshold",
    "reading",
    "choice_descriptions",
    "max_new_tokens",
    "pruning",
    "taxonomy",
)
"""The `json_schema_extra` keys PCD reads, carried over from a property."""

Node = Mapping[str, Any]
TYPES = ("string", "number", "integer", "boolean", "null", "object", "array")
# A plain string's keywords (`text_type` reads them; on other nodes they are refused).
TEXT = ("pattern", "format", "minLength", "maxLength")
UNSUPPORTED = (
    *TEXT, "contentEncoding", "contentMediaType", "not", "if", "then", "else", "patternProperties", "propertyNames", "minProperties",
    "maxProperties", "dependencies", "dependentRequired", "dependentSchemas", "contains",
    "unevaluatedProperties", "unevaluatedItems", "prefixItems", "additionalItems",
    "minContains", "maxContains", "$dynamicRef", "$recursiveRef",
)  # fmt: skip
FREE = (
    "a plain `string` (`minLength`, `maxLength`, `pattern`, `format` date/date-time), a "
    "`number` or an `integer` without a small range is generated, not scored"
)
SCORED = (
    "accepted: an `enum` (or `const`s in `oneOf`) of str or int values, a `boolean`, an "
    f"`integer` with `minimum` and `maximum` ({MIN_CHOICES} to {MAX_CHOICES} values), an "
    "`object` with `properties`, an `array` of enum `items`, a discriminated `oneOf` of "
    'objects, or one of these in `anyOf` with `{"type": "null"}`'
)
ACCEPTED = {  # what a refused keyword's message offers instead (else `SCORED`)
    "$ref": "accepted: a local reference such as '#/$defs/Name'",
    "items": "accepted: an `array` whose `items` is an `enum` (each label is scored yes/no)",
    "additionalProperties": "accepted: fixed `properties`, `additionalProperties: false`",
    "multipleOf": "accepted: a positive int `multipleOf` on an integer",
    "discriminator": "accepted: branches whose discriminator property is one `const` value",
    "object": "accepted: a required object (its fields can each be nullable)",
    "array": "accepted: a required array (an empty list says no label applies)",
    "union": "accepted: one schema and null, `const` values, or objects with a discriminator "
    "(a `discriminator.propertyName`, or a property that is a different `const` in each branch)",
}


@dataclass(frozen=True)
class At:
    """Where a node is (its JSON pointer, the dotted field it belongs to), and the typed
    errors that name it."""

    model: str
    path: str = ""
    fld: str = ""

    def __truediv__(self, key: Any) -> At:
        return replace(self, path=f"{self.path}/{str(key).replace('~', '~0').replace('/', '~1')}")

    def prop(self, name: str) -> At:
        return replace(self / "properties" / name, fld=f"{self.fld}.{name}" if self.fld else name)

    @property
    def where(self) -> str:
        return f"{self.model}{'.' + self.fld if self.fld else ''} (at #{self.path})"

    def no(self, kw: str, what: str, accepted: str | None = None) -> Exception:
        """An `UnsupportedSchemaKeywordError` for `kw` here, saying what is accepted."""
        return UnsupportedSchemaKeywordError(
            f"{self.where}: {what}; {accepted or ACCEPTED.get(kw, SCORED)}.",
            keyword=kw,
            path=self.path,
            model=self.model,
            field=self.fld or None,
        )

    def need(self, ok: Any, what: str) -> None:
        """Raises `InvalidJsonSchemaError` (what is malformed here) unless `ok`."""
        if not ok:
            msg = f"{self.where}: invalid JSON schema: {what}."
            raise InvalidJsonSchemaError(
                msg, path=self.path, model=self.model, field=self.fld or None
            )

    def deep(self, chain: list[str], why: str, max_depth: int) -> Exception:
        """A `NestingTooDeepError`: objects too deep, or a `$ref` that recurses."""
        return NestingTooDeepError(
            f"{self.where}: {why} ({' -> '.join(chain)}); accepted: at most {max_depth} levels "
            "of nested objects and union branches, without recursion.",
            model=self.model,
            field=self.fld or None,
        )


@dataclass
class FieldMeta:
    """What a property's `Field(...)` gets: its description, PCD keys and bounds."""

    description: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    bounds: dict[str, Any] = field(default_factory=dict)


@dataclass
class ParsedObject:
    """An object schema, parsed: each property's annotation (nested: a parsed object or
    union), its `FieldMeta`, and the object's measures."""

    name: str
    doc: str
    props: list[tuple[str, Any, FieldMeta]] = field(default_factory=list)
    height: int = 0  # levels of objects below it
    deepest: tuple[str, ...] = ()  # the names down its deepest chain, itself first
    count: int = 0  # the PCD fields it flattens to
    model: type[BaseModel] | None = None

    def measure(self) -> None:
        """Sets `height`, `deepest` and `count` from the properties."""
        for _, tp, _ in self.props:
            subs = tp.branches if isinstance(tp, ParsedUnion) else [tp]
            for s in (s for s in subs if isinstance(s, ParsedObject)):
                if s.height + 1 > self.height:
                    self.height, self.deepest = s.height + 1, (self.name, *s.deepest)
            if isinstance(tp, ParsedUnion):  # its kind, and each branch less its tag
                self.count += 1 + sum(b.count - 1 for b in tp.branches)
            else:
                self.count += tp.count if isinstance(tp, ParsedObject) else 1
        self.deepest = self.deepest or (self.name,)


@dataclass
class ParsedUnion:
    """A discriminated union: the tag property and one parsed object per branch."""

    tag: str
    branches: list[ParsedObject]


def enum_type(node: Node, at: At, types: list[str], nullable: bool) -> Any:
    """The annotation of an `enum` / `const` node (`type` may list the values' types)."""
    kw = "enum" if "enum" in node else "const"
    vals = node["enum"] if kw == "enum" else [node["const"]]
    at.need(isinstance(vals, list) and vals, "`enum` is not a non-empty list")
    if kw == "enum" and "const" in node:
        at.need(node["const"] in vals, "`const` is not one of the `enum` values")
        vals = [node["const"]]
    return values_type(vals, at, types, nullable, kw)


def values_type(vals: list[Any], at: At, types: list[str], nullable: bool, kw: str) -> Any:
    """`Literal[*vals]` (`bool` for true and false), `| None` if null is allowed."""
    optional = nullable or None in vals
    vals = [v for v in vals if v is not None]
    seen: set[str] = set()
    for v in vals:
        if not isinstance(v, (str, int)):
            what = f"the value {v!r} ({kind_of(v)}) is not scoreable"
            raise at.no(kw, what, "accepted: str, int or bool values, and null")
        jt = {bool: "boolean", str: "string"}.get(type(v), "integer")
        ok = not types or jt in types or (jt == "integer" and "number" in types)
        at.need(ok, f"the value {v!r} is not of `type` {types}")
        at.need(json.dumps(v) not in seen, f"`{kw}` lists {v!r} twice")
        seen.add(json.dumps(v))
    if not vals:
        raise at.no(kw, "a field that can only be null")
    two_bools = len(vals) == 2 and all(isinstance(v, bool) for v in vals)
    tp: Any = bool if two_bools else Literal[tuple(vals)]
    return tp | None if optional else tp


def int_range(node: Node, at: At, meta: FieldMeta) -> None:
    """Puts an integer's inclusive `ge`/`le` (and `multiple_of`) into `meta.bounds`.

    With both bounds and at most 255 values the field is a scored range; otherwise (a
    bound missing, or a wider range) it is a generated integer within the bounds given,
    as `int` is in a Pydantic model (`pcd_tools.schema.generated`).

    Raises:
        UnsupportedSchemaKeywordError: for a non-int `multipleOf`, or a `multipleOf` on a
            generated integer.
    """
    low: int | None = None
    high: int | None = None
    for kw in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        v = node.get(kw)
        if v is None or isinstance(v, bool):  # draft 4's boolean `exclusive*`: read below
            continue
        at.need(isinstance(v, (int, float)) and math.isfinite(v), f"`{kw}` is {v!r}")
        excl = kw.startswith("exclusive") or node.get(f"exclusive{kw.title()}") is True
        if kw.lower().endswith("minimum"):
            b = math.floor(v) + 1 if excl else math.ceil(v)
            low = b if low is None else max(low, b)
        else:
            b = math.ceil(v) - 1 if excl else math.floor(v)
            high = b if high is None else min(high, b)
    step = node.get("multipleOf", 1)
    if not is_int(step) or step < 1:
        raise at.no("multipleOf", f"`multipleOf` {step!r} on an integer")
    at.need(low is None or high is None or low <= high, f"the bounds {low}..{high} are empty")
    count = None
    if low is not None and high is not None:
        first = low + (-low) % step
        count = (high - first) // step + 1 if high >= first else 0
    if step > 1 and (count is None or count > MAX_CHOICES):
        raise at.no(
            "multipleOf",
            f"`multipleOf` {step} on an integer that is generated (no range of at most "
            f"{MAX_CHOICES} values)",
            f"accepted: `multipleOf` on a `minimum`..`maximum` range of at most {MAX_CHOICES} "
            "values (scored), or a generated integer with `minimum`/`maximum` only",
        )
    bounds = {"ge": low, "le": high, "multiple_of": step if step > 1 else None}
    meta.bounds.update({k: v for k, v in bounds.items() if v is not None})


def text_type(node: Node, at: At, meta: FieldMeta, nullable: bool) -> Any:
    """A generated string: `str` with `min_length`/`max_length`/`pattern` from
    `minLength`/`maxLength`/`pattern`, or `date`/`datetime` for `format` `date` /
    `date-time`.

    Raises:
        UnsupportedSchemaKeywordError: for another `format`, or a `format` with length or
            pattern keywords.
        InvalidJsonSchemaError: for a length that is not an int >= 0 or a pattern that is
            not a str.
    """
    fmt = node.get("format")
    if fmt is not None:
        if fmt not in ("date", "date-time"):
            raise at.no(
                "format",
                f"`format` {fmt!r} on a string",
                "accepted: `format` 'date' or 'date-time' (an ISO 8601 value), or a string "
                "without `format` (free text, with `minLength`, `maxLength`, `pattern`)",
            )
        mixed = [k for k in ("minLength", "maxLength", "pattern") if k in node]
        if mixed:
            raise at.no(
                mixed[0],
                f"`{mixed[0]}` beside `format` {fmt!r}",
                "accepted: a `format` alone (its grammar fixes the text)",
            )
        tp: Any = datetime.date if fmt == "date" else datetime.datetime
        return tp | None if nullable else tp
    for kw, bound in (("minLength", "min_length"), ("maxLength", "max_length")):
        v = node.get(kw)
        at.need(v is None or (is_int(v) and v >= 0), f"`{kw}` is not an int >= 0")
        if v is not None:
            meta.bounds[bound] = v
    pattern = node.get("pattern")
    at.need(pattern is None or isinstance(pattern, str), "`pattern` is not a str")
    if pattern is not None:
        meta.bounds["pattern"] = pattern
    return str | None if nullable else str


def number_type(node: Node, at: At, meta: FieldMeta, nullable: bool) -> Any:
    """A generated number: `float` with `ge`/`le` from `minimum`/`maximum`.

    Raises:
        UnsupportedSchemaKeywordError: for `exclusiveMinimum`/`exclusiveMaximum` or
            `multipleOf`, which a number's grammar does not enforce.
        InvalidJsonSchemaError: for a bound that is not a finite number.
    """
    for kw in ("exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
        if node.get(kw) is not None and node.get(kw) is not False:  # (0 == False)
            raise at.no(
                kw,
                f"`{kw}` on a number",
                "accepted: a number with inclusive `minimum`/`maximum`, which its grammar enforces",
            )
    for kw, bound in (("minimum", "ge"), ("maximum", "le")):
        v = node.get(kw)
        ok = v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
        at.need(ok and (v is None or math.isfinite(v)), f"`{kw}` is {v!r}")
        if v is not None:
            meta.bounds[bound] = v
    if "ge" in meta.bounds and "le" in meta.bounds:
        at.need(meta.bounds["ge"] <= meta.bounds["le"], "`minimum` is above `maximum`")
    return float | None if nullable else float


def build_model(obj: ParsedObject) -> type[BaseModel]:
    """The Pydantic model of a parsed object (built once per object; extra keys forbidden)."""
    if obj.model is not None:
        return obj.model
    defs: dict[str, Any] = {}
    for pname, tp, meta in obj.props:
        if isinstance(tp, ParsedObject):
            tp = build_model(tp)
        elif isinstance(tp, ParsedUnion):
            models = tuple(build_model(b) for b in tp.branches)
            tp = Annotated[Union[models], PydField(discriminator=tp.tag)]  # noqa: UP007
        extra = dict(meta.extra) or None
        defs[pname] = (
            tp,
            PydField(description=meta.description, json_schema_extra=extra, **meta.bounds),
        )
    name = re.sub(r"\W", "_", obj.name.rsplit("/", 1)[-1]) or "Model"
    name = "_" + name if name[0].isdigit() else name
    shadow = any(hasattr(BaseModel, n) for n in defs)  # `json`, `copy`: Pydantic warns
    try:
        with warnings.catch_warnings() if shadow else contextlib.nullcontext():
            if shadow:
                warnings.simplefilter("ignore", UserWarning)
            config = ConfigDict(extra="forbid")
            doc = obj.doc or None  # (a module without source: no docstring search in files)
            obj.model = create_model(
                name, __config__=config, __doc__=doc, __module__=_MODULE, **defs
            )
    except (TypeError, ValueError, NameError) as e:  # what Pydantic refuses to build
        msg = f"{obj.name}: the JSON schema cannot be built as a Pydantic model: {e}"
        raise InvalidJsonSchemaError(msg, path="", model=obj.name) from e
    return obj.model


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_null(node: Node) -> bool:
    t, enum = node.get("type"), node.get("enum")
    return t in ("null", ["null"]) or ("const" in node and node["const"] is None) or enum == [None]


def objectish(node: Node) -> bool:
    t = node.get("type")
    return t == "object" or (isinstance(t, list) and "object" in t) or "properties" in node


def describe(node: Node) -> str:
    """What a node holds, for messages: "objects", "string values"..."""
    t = node.get("type")
    if objectish(node) or "enum" in node or "const" in node:
        return "objects" if objectish(node) else "enum values"
    if "anyOf" in node or "oneOf" in node:
        return "a union"
    return f"{t} values" if isinstance(t, str) else "untyped values"


def kind_of(v: Any) -> str:
    for tp, text in ((Mapping, "an object"), (list, "a list"), (str, "a str"), (bool, "a bool")):
        if isinstance(v, tp):
            return text
    return "null" if v is None else type(v).__name__
