"""JSON schema -> `Schema`: what OpenAI-style clients send, compiled like a Pydantic model.

`client.chat.completions.parse(response_format=Model)` and LangChain's
`with_structured_output(Model)` send `Model.model_json_schema()` (OpenAI's strict form adds
`additionalProperties: false` and makes every property `required`; LangChain's function
form inlines the `$ref`s). The schema is walked here and rebuilt as a Pydantic model
(`json_schema_values.build_model`), which is compiled like any model:

| JSON schema                                          | annotation built                   |
|------------------------------------------------------|------------------------------------|
| `enum` / `const` of str or int, `oneOf` of `const`s  | `Literal[...]` (enum)              |
| `boolean`, `enum: [true, false]`                     | `bool`                             |
| `integer` with `minimum`/`maximum` (`exclusive*`)    | `int` with `ge`/`le` (a range)     |
| `anyOf: [X, {"type": "null"}]`, `type: [X, "null"]`  | `X | None` (adds "not stated")     |
| `object` with `properties`, inline or a `$ref`       | a nested model                     |
| `oneOf`/`anyOf` of objects with a `discriminator`,   | `Annotated[Union[...],             |
| or a property that is a different `const` in each    | Field(discriminator=...)]`         |
| `array` of enum `items`, `minItems`/`maxItems`       | `list[Literal[...]]` (multi-label) |
| `string` with a `choices_by` key                     | `str` (the values it names)        |
| `string` (`minLength`, `maxLength`, `pattern`)       | `str`, generated                   |
| `string` with `format` `date` / `date-time`          | `date` / `datetime`, generated     |
| `number` (`minimum`, `maximum`)                      | `float`, generated                 |
| `integer` without both bounds or over 255 values     | `int` within its bounds, generated |
| `array` of `string` items (their lengths, `pattern`) | `list[str]`, generated             |

Generated fields are decoded under a grammar on the same KV cache, in declaration order
with the scored ones (`pcd_tools.schema.generated`).

A field's description is the first `description` found going inward (the property, its
`$ref`, the non-null `anyOf` member, an array's `items`); a `const` member's description
is its choice's. The keys in `PCD_KEYS` are carried over into `json_schema_extra`. The top
object's `title` and `description` are the schema's name and instructions; `default`,
`examples`, `required`, `additionalProperties: false`, `uniqueItems`, `$schema` and
unknown annotation keys are accepted and otherwise ignored. Anything else raises
`UnsupportedSchemaKeywordError`, a malformed schema `InvalidJsonSchemaError`; both carry
the JSON pointer (`path`) of the problem.
"""

from __future__ import annotations

import json
import threading
import typing
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import replace
from typing import Annotated, Any, Literal
from urllib.parse import unquote

from pydantic import BaseModel
from pydantic import Field as PydField

from ..errors import InvalidArgumentError, InvalidFieldNameError, SchemaTooLargeError
from .json_schema_values import (
    ACCEPTED,
    FREE,
    PCD_KEYS,
    TEXT,
    TYPES,
    UNSUPPORTED,
    At,
    FieldMeta,
    Node,
    ParsedObject,
    ParsedUnion,
    build_model,
    describe,
    enum_type,
    int_range,
    is_int,
    is_null,
    kind_of,
    number_type,
    objectish,
    text_type,
    values_type,
)
from .models import _from_model
from .nested import MAX_DEPTH
from .spec import Schema

__all__ = ["PCD_KEYS", "compile_json_schema", "is_json_schema", "json_schema_model"]

# Keys beside a `$ref` that keep it a plain reference (its object is parsed once).
_ANNOTATIONS = {"title", "description", "default", "examples", "$comment", "deprecated", *PCD_KEYS}
_MAX_LEVELS = 64  # values inside values (`$ref`, `anyOf`, `items`, objects) in one schema
_CACHE_SIZE = 128  # compiled schemas kept, by their JSON text (property order matters)
_CACHE: OrderedDict[str, tuple[Schema, int]] = OrderedDict()
_LOCK = threading.Lock()


def is_json_schema(obj: Any) -> bool:
    """Whether `obj` looks like a JSON schema rather than the dict form of field specs:
    `{"type": "object", "properties": {...}}`, or a `$ref` top beside `$defs`."""
    if not isinstance(obj, Mapping):
        return False
    if obj.get("type") == "object" and isinstance(obj.get("properties"), Mapping):
        return True
    defs = (obj.get("$defs"), obj.get("definitions"))
    return isinstance(obj.get("$ref"), str) and any(isinstance(d, Mapping) for d in defs)


def compile_json_schema(
    schema: Mapping[str, Any],
    *,
    name: str | None = None,
    max_depth: int = MAX_DEPTH,
    max_fields: int | None = None,
) -> Schema:
    """Compiles a JSON schema with an object at the top into a `Schema`.

    Args:
        schema: The JSON schema: `Model.model_json_schema()`, OpenAI's strict form of it,
            a `response_format`'s `json_schema.schema` or a tool's `parameters`.
        name: The schema's name; defaults to the top object's `title`, then `"JsonSchema"`.
            The top's `description` is the schema's instructions.
        max_depth: Levels of nested objects (and union branches) accepted below the top,
            0 to 4.
        max_fields: The most fields accepted (a multi-label field counts once, a union its
            kind plus each branch's fields); None for no limit.

    Returns:
        The compiled `Schema`; its `model` is the Pydantic model built from the JSON
        schema. Equal arguments give the same `Schema` (an LRU cache of 128).

    Raises:
        UnsupportedSchemaKeywordError: for a keyword or type PCD does not score, with the
            `keyword` and its `path`.
        InvalidJsonSchemaError: for a malformed schema, with the `path` of the problem.
        NestingTooDeepError: for a recursive `$ref` or objects deeper than `max_depth`.
        TooManyChoicesError: its `LabelSetTooLargeError` for an `enum` whose token trie
            would not fit in memory (an `enum` of any length is accepted, and a multi-label
            `array` of more than 255 labels is read ranked; an integer range over 255
            values is generated).
        SchemaTooLargeError: for more fields than `max_fields`.
        SchemaError: (a subclass) for what a Pydantic model would be refused for.
        InvalidArgumentError: for a `name`, `max_depth` or `max_fields` out of range.
    """
    if name is not None and not isinstance(name, str):
        raise InvalidArgumentError(f"name={name!r}; accepted: None or a str.")
    if not is_int(max_depth) or not 0 <= max_depth <= MAX_DEPTH:
        raise InvalidArgumentError(f"max_depth={max_depth!r}; accepted: an int from 0 to 4.")
    if max_fields is not None and (not is_int(max_fields) or max_fields < 1):
        raise InvalidArgumentError(f"max_fields={max_fields!r}; accepted: None or an int >= 1.")
    try:
        key: str | None = json.dumps([schema, name, max_depth], ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):  # not plain JSON: compiled every time
        key = None
    hit = None
    with _LOCK:
        if key is not None and key in _CACHE:
            hit = _CACHE[key]
            _CACHE.move_to_end(key)
    if hit is None:
        title = schema.get("title") if isinstance(schema, Mapping) else None
        shown = name or (title if isinstance(title, str) and title else "JsonSchema")
        top = _Parser(schema, shown, max_depth).top()
        _check_size(shown, top.count, max_fields)  # before any model is built
        hit = replace(_from_model(build_model(top)), name=shown), top.count
        with _LOCK:
            if key is not None:
                _CACHE[key] = hit
            while len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
    _check_size(hit[0].name, hit[1], max_fields)
    return hit[0]


def json_schema_model(
    schema: Mapping[str, Any],
    *,
    name: str | None = None,
    max_depth: int = MAX_DEPTH,
    max_fields: int | None = None,
) -> type[BaseModel]:
    """The Pydantic model built from a JSON schema, to validate or build answers with.

    It is `compile_json_schema(...).model` (same arguments, same errors): nested models,
    `Literal`s, `bool`, bounded `int`s, `list[Literal[...]]` and discriminated unions, with
    their descriptions and PCD keys; extra keys are forbidden.
    """
    compiled = compile_json_schema(schema, name=name, max_depth=max_depth, max_fields=max_fields)
    return compiled.model


def _check_size(name: str, count: int, max_fields: int | None) -> None:
    if max_fields is not None and count > max_fields:
        raise SchemaTooLargeError(
            f"{name}: the schema has {count} fields; accepted: at most {max_fields} fields (a "
            "multi-label field counts once, a union its kind plus each branch's fields). Split "
            "it over several requests.",
            count=count,
            limit=max_fields,
            model=name,
        )


class _Parser:
    """Walks a JSON schema into `ParsedObject`s, checking each keyword on the way."""

    def __init__(self, root: Any, model: str, max_depth: int):
        self.root, self.model, self.max_depth = root, model, max_depth
        self.objs: dict[str, ParsedObject] = {}  # by `$ref`: used twice, parsed once
        self.chain: list[str] = ["#"]  # the `$ref`s being parsed: meeting one is recursion
        self.names: list[str] = []  # the objects being parsed (its length is the depth)
        self.level = 0

    def top(self) -> ParsedObject:
        at = At(self.model)
        at.need(isinstance(self.root, Mapping), f"the schema is {kind_of(self.root)}")
        for k in ("$defs", "definitions"):
            (at / k).need(isinstance(self.root.get(k, {}), Mapping), "not an object")
        meta = FieldMeta()
        node, at, refs, key = self._deref(self.root, at, meta)
        if not objectish(node):
            kw = next((k for k in ("anyOf", "oneOf", "enum", "const") if k in node), "type")
            top = 'accepted: an object at the top (`"type": "object"` with `properties`)'
            raise at.no(kw, f"the top is not an object (it holds {describe(node)})", top)
        self.chain.extend(refs)
        obj = self._object(node, at, key, self.model)
        obj.doc = obj.doc or meta.description or ""
        return obj

    def _deref(
        self, node: Node, at: At, meta: FieldMeta | None = None
    ) -> tuple[Node, At, list[str], str | None]:
        """Follows `$ref`s and one-member `allOf`s (outer keys win, as OpenAI merges them):
        the node reached, where it is, the refs followed, and the last if plain."""
        refs: list[str] = []
        key: str | None = None
        for _ in range(_MAX_LEVELS):
            if meta is not None:
                self._absorb(node, at, meta)
            if "$ref" in node:
                ref = node["$ref"]
                target, path = self._lookup(ref, at)
                if ref in self.chain or ref in refs:
                    chain = [*self.names, ref.rsplit("/", 1)[-1]]
                    raise at.deep(chain, f"`$ref` {ref!r} refers to itself", self.max_depth)
                refs.append(ref)
                rest = {k: v for k, v in node.items() if k != "$ref"}
                key = ref if set(rest) <= _ANNOTATIONS else None
                node, at = (target if key else {**target, **rest}), replace(at, path=path)
            elif "allOf" in node:
                members = node["allOf"]
                at.need(isinstance(members, list) and members, "`allOf` is not a list")
                if len(members) > 1:
                    raise at.no("allOf", f"`allOf` of {len(members)} schemas")
                (at / "allOf" / 0).need(isinstance(members[0], Mapping), "not an object")
                rest = {k: v for k, v in node.items() if k != "allOf"}
                node, at, key = {**members[0], **rest}, at / "allOf" / 0, None
            else:
                return node, at, refs, key
        raise at.deep(self.names, f"more than {_MAX_LEVELS} `$ref` hops", self.max_depth)

    def _lookup(self, ref: Any, at: At) -> tuple[Node, str]:
        at.need(isinstance(ref, str), f"`$ref` is {kind_of(ref)}")
        if not ref.startswith("#"):
            raise at.no("$ref", f"`$ref` {ref!r} points outside the schema")
        node: Any = self.root if ref[1:2] in ("", "/") else None
        for part in ref[2:].split("/") if ref[1:2] == "/" else ():
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                node = node.get(part) if isinstance(node, Mapping) else None
        what = f"`$ref` {ref!r} points to no schema in this document; {ACCEPTED['$ref']}"
        at.need(isinstance(node, Mapping), what)
        return node, ref[1:]

    def _absorb(self, node: Node, at: At, meta: FieldMeta) -> None:
        desc = node.get("description")
        at.need(desc is None or isinstance(desc, str), "`description` is not a str")
        meta.description = meta.description or desc or None
        for k in PCD_KEYS:
            if k in node:
                meta.extra.setdefault(k, node[k])

    def _value(self, node: Node, at: At, meta: FieldMeta) -> Any:
        """The annotation of a value (a `ParsedObject`/`ParsedUnion` for objects)."""
        self.level += 1
        refs: list[str] = []
        try:
            if self.level > _MAX_LEVELS:
                why = f"values nest more than {_MAX_LEVELS} levels"
                raise at.deep(self.names, why, self.max_depth)
            node, at, refs, key = self._deref(node, at, meta)
            self.chain.extend(refs)
            return self._classify(node, at, meta, key)
        finally:
            self.level -= 1
            del self.chain[len(self.chain) - len(refs) :]

    def _classify(self, node: Node, at: At, meta: FieldMeta, key: str | None) -> Any:
        t = node.get("type")
        types = [] if t is None else [t] if isinstance(t, str) else t
        ok = isinstance(types, list) and all(x in TYPES for x in types)
        at.need(ok, f"`type` {t!r}; accepted: one of {list(TYPES)}, or a list")
        nullable = "null" in types or node.get("nullable") is True
        rest = [t for t in types if t != "null"]
        plain = rest == ["string"] and not any(
            k in node for k in ("enum", "const", "anyOf", "oneOf")
        )
        for kw in UNSUPPORTED:
            if kw in node and not (kw == "format" and rest and "string" not in rest):
                if kw in TEXT and plain:
                    continue  # a generated string's constraints (`text_type`)
                why = f": `{kw}` constrains free text, and {FREE}" if kw in TEXT else ""
                raise at.no(kw, f"`{kw}` is not supported{why}")
        if "anyOf" in node or "oneOf" in node:
            return self._union(node, at, meta, nullable)
        if "enum" in node or "const" in node:
            return enum_type(node, at, rest, nullable)
        if not types:
            rest = ["object"] if objectish(node) else ["array"] if "items" in node else []
        if len(rest) != 1:
            what = f"several types {rest}" if rest else "only null" if types else "no `type`"
            raise at.no("type", f"a field with {what}")
        t = rest[0]
        if nullable and t in ("object", "array"):
            raise at.no("type", f"a nullable {t} is not scoreable", ACCEPTED[t])
        if t == "object":
            return self._object(node, at, key, at.fld.rsplit(".", 1)[-1])
        if t == "array":
            return self._array(node, at, meta)
        if t == "integer":
            int_range(node, at, meta)  # a scored range, or a generated integer
        if t == "string" and "choices_by" in meta.extra:
            t = "str"  # an enum of the values `choices_by` names
        elif t == "string":
            return text_type(node, at, meta, nullable)  # generated text or a date
        elif t == "number":
            return number_type(node, at, meta, nullable)  # a generated float
        tp: Any = {"boolean": bool, "integer": int, "str": str}[t]
        return tp | None if nullable else tp

    def _union(self, node: Node, at: At, meta: FieldMeta, nullable: bool) -> Any:
        kw = "anyOf" if "anyOf" in node else "oneOf"
        members = node[kw]
        at.need(isinstance(members, list) and members, f"`{kw}` is not a non-empty list")
        kept: list[tuple[Node, At, Node]] = []  # (member, where, the schema it points to)
        for i, m in enumerate(members):
            (at / kw / i).need(isinstance(m, Mapping), f"a schema is {kind_of(m)}")
            r = self._deref(m, at / kw / i)[0]
            if is_null(r):
                nullable = True
            else:
                kept.append((m, at / kw / i, r))
        if len(kept) == 1:
            tp = self._value(kept[0][0], kept[0][1], meta)
            if nullable and isinstance(tp, (ParsedObject, ParsedUnion)):
                raise at.no(kw, "a nullable object is not scoreable", ACCEPTED["object"])
            return tp | None if nullable else tp
        if kept and all(("enum" in r or "const" in r) and not objectish(r) for *_, r in kept):
            vals: list[Any] = []
            descs: dict[str, str] = {}
            for _, where, r in kept:
                got = [r["const"]] if "const" in r else r["enum"]
                where.need(isinstance(got, list), "`enum` is not a list")
                vals.extend(got)
                if len(got) == 1 and isinstance(r.get("description"), str):
                    descs[str(got[0])] = r["description"]
            if descs:  # the members' descriptions are their choices'
                given = meta.extra.get("choice_descriptions")
                meta.extra["choice_descriptions"] = {**descs, **(given or {})}
            return values_type(vals, at, [], nullable, kw)
        if len(kept) > 1 and all(objectish(r) for *_, r in kept):
            if nullable:
                why = "a nullable union of objects is not scoreable"
                raise at.no(kw, why, "accepted: a required discriminated union")
            return self._objects(node, at, kw, kept)
        kinds = ", ".join(sorted({describe(r) for *_, r in kept})) or "null"
        raise at.no(kw, f"`{kw}` of {kinds}", ACCEPTED["union"])

    def _objects(self, node: Node, at: At, kw: str, kept: list[tuple[Node, At, Node]]) -> Any:
        disc = node.get("discriminator")
        tags = [self._tags(r, where) for _, where, r in kept]
        if disc is not None:  # its `mapping` may name refs LangChain inlined: not needed
            tag: Any = disc.get("propertyName") if isinstance(disc, Mapping) else None
            (at / "discriminator").need(isinstance(tag, str), "no str `propertyName`")
        else:  # Pydantic's `Literal` tag: a property that is a different `const` in each branch
            common = [p for p in tags[0] if all(p in t for t in tags)]
            common = [p for p in common if len({json.dumps(t[p]) for t in tags}) == len(tags)]
            if not common:
                raise at.no(kw, f"`{kw}` of objects without a discriminator", ACCEPTED["union"])
            tag = common[0]
        seen: set[str] = set()
        for (_, where, _), t in zip(kept, tags):
            if tag not in t:
                raise where.no("discriminator", f"a branch without `{tag}` as one `const`")
            where.need(json.dumps(t[tag]) not in seen, f"two branches have {tag}={t[tag]!r}")
            seen.add(json.dumps(t[tag]))
        return ParsedUnion(tag, [self._value(m, where, FieldMeta()) for m, where, _ in kept])

    def _tags(self, node: Node, at: At) -> dict[str, Any]:
        """The properties of an object that are one `const` (or a one-value `enum`)."""
        props = node.get("properties")
        out: dict[str, Any] = {}
        for p, sub in props.items() if isinstance(props, Mapping) else ():
            r = self._deref(sub, at.prop(p))[0] if isinstance(sub, Mapping) else {}
            vals = [r["const"]] if "const" in r else r.get("enum")
            if isinstance(vals, list) and len(vals) == 1 and isinstance(vals[0], (str, int)):
                out[p] = vals[0]
        return out

    def _array(self, node: Node, at: At, meta: FieldMeta) -> Any:
        items = node.get("items")
        if not isinstance(items, Mapping):
            raise at.no("items", f"an array with `items` {items!r}")
        r = self._deref(items, at / "items")[0]
        imeta = FieldMeta()
        scalar = any(k in r for k in ("enum", "const", "anyOf", "oneOf"))
        text = not scalar and r.get("type") == "string" and "format" not in r
        tp = self._value(items, at / "items", imeta) if scalar or text else None
        if text:  # a generated list of strings; each item's constraints on its `str`
            tp = Annotated[str, PydField(**imeta.bounds)] if imeta.bounds else str
        elif typing.get_origin(tp) is not Literal:
            raise (at / "items").no("items", f"an array of {describe(r)}")
        meta.description = meta.description or imeta.description
        if "choice_descriptions" in imeta.extra:
            meta.extra.setdefault("choice_descriptions", imeta.extra["choice_descriptions"])
        for kw, bound in (("minItems", "min_length"), ("maxItems", "max_length")):
            v = node.get(kw)
            at.need(v is None or (is_int(v) and v >= 0), f"`{kw}` is not an int >= 0")
            if v is not None:
                meta.bounds[bound] = v
        at.need(node.get("uniqueItems") in (None, True, False), "`uniqueItems` is not a bool")
        return list[tp]  # type: ignore[valid-type]

    def _object(self, node: Node, at: At, key: str | None, name: str) -> ParsedObject:
        depth = len(self.names)
        why = f"objects nest deeper than {self.max_depth} levels"
        if key is not None and key in self.objs:
            obj = self.objs[key]
            if depth + obj.height > self.max_depth:
                raise at.deep([*self.names, *obj.deepest], why, self.max_depth)
            return obj
        title = node.get("title")
        title = title if depth and isinstance(title, str) and title else None
        name = title or (key.rsplit("/", 1)[-1] if depth and key else name)
        if depth > self.max_depth:
            raise at.deep([*self.names, name], why, self.max_depth)
        extra = node.get("additionalProperties", False)
        if extra is not False:
            shown = "true" if extra is True else "a schema" if isinstance(extra, Mapping) else extra
            what = f"`additionalProperties: {shown}` makes an object map (free keys)"
            raise at.no("additionalProperties", what)
        props = node.get("properties")
        if props is None:
            what = "an object without `properties` (free keys)"
            raise at.no("type", what, "accepted: an object with fixed `properties`")
        at.need(isinstance(props, Mapping), f"`properties` is {kind_of(props)}")
        required = node.get("required", [])
        ok = isinstance(required, list) and all(r in props for r in required)
        at.need(ok, f"`required` {required!r} is not a list of its property names")
        desc = node.get("description")
        obj = ParsedObject(name, desc if isinstance(desc, str) else "")
        self.names.append(name)
        for pname, sub in props.items():
            self._check_name(pname, at.prop(str(pname)))
            at.prop(pname).need(isinstance(sub, Mapping), f"a schema is {kind_of(sub)}")
            meta = FieldMeta()
            obj.props.append((pname, self._value(sub, at.prop(pname), meta), meta))
        self.names.pop()
        obj.measure()
        if key is not None:
            self.objs[key] = obj
        return obj

    def _check_name(self, name: Any, at: At) -> None:
        ok = isinstance(name, str) and name.isidentifier()
        if ok and not name.startswith(("_", "model_dump", "model_validate")):
            ok = not (name.startswith("model_") and hasattr(BaseModel, name))
            if ok:
                return
        raise InvalidFieldNameError(
            f"{at.where}: property name {name!r} is not a field name PCD can use; accepted: "
            "identifiers like 'priority' or 'requires_escalation' (letters, digits, "
            "underscores), not starting with '_' nor naming a Pydantic `model_` method.",
            model=self.model,
            field=at.fld,
        )
