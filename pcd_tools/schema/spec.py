"""The compiled form of a schema: `Schema`, its `FieldSpec`s and their `Choice`s.

Everything downstream (prompt, engine, decider, results) reads only these frozen
dataclasses, whatever form the schema was declared in. The choice limits live here too.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import BaseModel, TypeAdapter, create_model
from pydantic import Field as PydField

from ..errors import SchemaError
from .nested import unflatten
from .tree import Taxonomy

__all__ = [
    "MAX_CHOICES",
    "MIN_CHOICES",
    "NOT_STATED",
    "Choice",
    "Example",
    "FieldSpec",
    "Generation",
    "Schema",
    "Taxonomy",
    "iter_labels",
    "python_type",
]

# A single-choice field (`Literal`, `Enum`, a JSON `enum`) takes any number of values: its
# token trie scores them exactly, and certified pruning reads a large one in a fraction of
# its positions. 255 bounds what costs a question (or a candidate listed by value) per
# value: a multi-label field's labels and a scored int range (a wider one is generated);
# OpenAI's Decisions API keeps its own 2-255 contract (`serve.decisions_request`).
MAX_CHOICES = 255
# One allowed value is a field like any other: scored in the pass, with probability 1 by
# definition (PCD's probabilities are relative to the allowed values). See the README.
MIN_CHOICES = 1
NOT_STATED = "not stated in the text"


@dataclass(frozen=True)
class Choice:
    """One allowed answer of a field.

    Args:
        value: The native Python value the field takes (str, int, bool, Enum member or None).
        literal: Its JSON text as it appears in the answer, e.g. `"P0_CRITICAL"` or `true`.
        label: The JSON value used in responses (`str`/`int`/`bool`/`None`).
        description: Optional description shown to the model next to the value.
    """

    value: Any
    literal: str
    label: Any
    description: str | None = None


@dataclass(frozen=True)
class Generation:
    """How a generated field's value is written: its kind, constraints and token limit.

    A generated field is not scored: its value is decoded under a grammar that enforces
    these constraints (`pcd_tools.engine.decode.generate`), continuing the answer's JSON.

    Args:
        type: `"string"`, `"number"`, `"integer"`, `"string_list"` (a `list[str]`),
            `"date"` or `"datetime"` (ISO 8601 strings).
        min_length: A string's fewest characters, or a list's fewest items.
        max_length: A string's most characters, or a list's most items.
        pattern: A regular expression the whole string matches (a list: each item).
        ge: A number's or integer's lowest value (inclusive).
        le: A number's or integer's highest value (inclusive).
        item_min_length: A list item's fewest characters.
        item_max_length: A list item's most characters.
        max_new_tokens: The most tokens its value may take
            (`json_schema_extra={"max_new_tokens": n}`); None for the request's limit.
    """

    type: Literal["string", "number", "integer", "string_list", "date", "datetime"]
    min_length: int | None = None
    max_length: int | None = None
    pattern: str | None = None
    ge: int | float | None = None
    le: int | float | None = None
    item_min_length: int | None = None
    item_max_length: int | None = None
    max_new_tokens: int | None = None

    def json_schema(self, optional: bool = False) -> dict[str, Any]:
        """The JSON-schema fragment of the value (`anyOf` with null when optional)."""
        length = {"minLength": self.min_length, "maxLength": self.max_length}
        items = {"minItems": self.min_length, "maxItems": self.max_length}
        frag: dict[str, Any]
        if self.type == "string":
            frag = {"type": "string", **length, "pattern": self.pattern}
        elif self.type in ("number", "integer"):
            frag = {"type": self.type, "minimum": self.ge, "maximum": self.le}
        elif self.type == "string_list":
            item = {
                "type": "string",
                "minLength": self.item_min_length,
                "maxLength": self.item_max_length,
                "pattern": self.pattern,
            }
            frag = {"type": "array", "items": _set_keys(item), **items}
        else:
            frag = {"type": "string", "format": "date" if self.type == "date" else "date-time"}
        frag = _set_keys(frag)
        return {"anyOf": [frag, {"type": "null"}]} if optional else frag


def _set_keys(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def python_type(gen: Generation, optional: bool = False) -> Any:
    """The Pydantic annotation a generated value validates against (its constraints
    included), e.g. `Annotated[str, Field(max_length=200)]`."""
    import datetime

    bounds = _set_keys({"min_length": gen.min_length, "max_length": gen.max_length})
    tp: Any
    if gen.type == "string":
        tp = Annotated[str, PydField(pattern=gen.pattern, **bounds)]
    elif gen.type in ("number", "integer"):
        base = float if gen.type == "number" else int
        tp = Annotated[base, PydField(**_set_keys({"ge": gen.ge, "le": gen.le}))]
    elif gen.type == "string_list":
        item_bounds = {"min_length": gen.item_min_length, "max_length": gen.item_max_length}
        item = Annotated[str, PydField(pattern=gen.pattern, **_set_keys(item_bounds))]
        tp = Annotated[list[item], PydField(**bounds)]
    else:
        tp = datetime.date if gen.type == "date" else datetime.datetime
    return tp | None if optional else tp


@dataclass(frozen=True)
class FieldSpec:
    """A compiled field.

    Args:
        name: The field name (a Python identifier), also the JSON key.
        kind: `"enum"`, `"boolean"`, `"multilabel"` (each choice is a label; the answer
            is a list of them, see `reading`) or `"generated"` (decoded under a grammar,
            not scored; no choices).
        description: The field's description (a prompt), possibly empty.
        choices: Candidates in declaration order; ties go to the first (empty for a
            generated field).
        optional: Whether a `null` ("not stated") candidate was added (a generated
            field: whether its grammar also allows `null`).
        ordered: Whether the candidates are integers in increasing order (an int range),
            so the result also has an `expected` value.
        threshold: For a multi-label field, the probability a label needs to be chosen
            (read `"each"`: its own P(yes); read `"ranked"`: its share of the ranking).
        reading: For a multi-label field, how its labels are scored: `"each"` (a yes/no
            question per label, at most 255) or `"ranked"` (one question over every label,
            as a single-choice field of any size: which label comes first in the list; the
            answer is the top labels whose share clears `threshold`,
            `pcd_tools.schema.multilabel`). `"each"` for other fields.
        min_labels: For a multi-label field, the fewest labels in an answer.
        max_labels: For a multi-label field, the most labels in an answer (None: all).
        depends_on: Fields answered before this one, whose answers its pass sees written
            in the JSON (`json_schema_extra={"depends_on": [...]}`).
        choices_by: `(parent, allowed)`: per parent choice (in order), the indices of
            this field's choices allowed with it (`json_schema_extra={"choices_by": ...}`).
        branch: For a field of a discriminated union's branch: `(discriminator field,
            index of the branch's value)`; the field is named `path[<value>].name`.
        generation: For a generated field, how its value is written.
        tree: For a taxonomy (`json_schema_extra={"taxonomy": ...}`, as `Labels` builds
            it), the tree its candidates are the leaves of; each candidate is written as
            its path (`pcd_tools.schema.labels`).
        pruning: How the field is scored (`json_schema_extra={"pruning": ...}`): `"auto"`
            (by pruned search when its candidate trie is large and the request allows
            it), `"on"` or `"off"` (always whole); see `pcd_tools.engine.passes.prune`. Not part
            of the schema's fingerprint: it changes how the field is scored, not the
            prompt.
    """

    name: str
    kind: Literal["enum", "boolean", "multilabel", "generated"]
    description: str
    choices: tuple[Choice, ...]
    optional: bool = False
    ordered: bool = False
    threshold: float = 0.5
    reading: Literal["each", "ranked"] = "each"
    min_labels: int = 0
    max_labels: int | None = None
    depends_on: tuple[str, ...] = ()
    choices_by: tuple[str, tuple[tuple[int, ...], ...]] | None = None
    branch: tuple[str, int] | None = None
    generation: Generation | None = None
    pruning: Literal["auto", "on", "off"] = "auto"
    tree: Taxonomy | None = None

    @property
    def generated(self) -> bool:
        """Whether the field is generated (decoded under a grammar) rather than scored."""
        return self.generation is not None

    @property
    def key(self) -> str:
        """The JSON key the model sees: the name without a union branch's `[<value>]`."""
        return re.sub(r"\[[^\]]*\]", "", self.name) if self.branch else self.name

    @property
    def labels(self) -> list[Any]:
        """The JSON values of the candidates, in order."""
        return [c.label for c in self.choices]

    @property
    def cardinality(self) -> int:
        """Number of candidates."""
        return len(self.choices)


@dataclass(frozen=True)
class Written:
    """A generated field's value in an example: its JSON text, as the answer shows it.

    Args:
        text: The value's JSON (`"a short reason"`, `12.5`, `["a", "b"]`, ...).
    """

    text: str


# A field's answer in an example: a choice index, a multi-label field's chosen labels, or
# a generated field's written value.
Answer = int | tuple[int, ...] | Written


@dataclass(frozen=True)
class Example:
    """A few-shot example, checked against its schema (`pcd_tools.schema.examples`).

    Args:
        input: The example's text, shown as an earlier user turn.
        answers: `(field name, answer)` in schema order: a choice index, for a
            multi-label field the indices of the labels that apply, for a generated field
            its `Written` value. The fields of a union branch the example did not take
            are absent.
    """

    input: str
    answers: tuple[tuple[str, Answer], ...]

    def answer(self, name: str) -> Answer | None:
        """The answer of field `name`, or None when the example does not answer it."""
        for n, a in self.answers:
            if n == name:
                return a
        return None


@dataclass(frozen=True)
class Schema:
    """A compiled PCD schema: instructions plus fields, with the Pydantic model to build.

    Args:
        name: Model or schema name, used in messages.
        instructions: Task instructions (the model docstring), possibly empty.
        fields: Compiled fields in declaration order.
        model: The Pydantic model whose instances results are validated into.
        examples: Few-shot examples, rendered as earlier turns in the cached schema part
            of the prompt; part of the schema's identity (`fingerprint`).
        whole: For a part of a schema (`Schema.part`), the schema it is a part of: the
            prompt is the whole's (its instructions, every field, its examples), so each
            field of the part is answered as the whole answers it. None for a schema
            that is its own prompt.
    """

    name: str
    instructions: str
    fields: tuple[FieldSpec, ...]
    model: type[BaseModel] = field(compare=False)
    examples: tuple[Example, ...] = ()
    whole: Schema | None = field(default=None, repr=False)

    def field(self, name: str) -> FieldSpec:
        """Returns the field called `name`.

        Raises:
            KeyError: naming the fields that exist.
        """
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(
            f"{self.name} has no field {name!r}; fields: {[f.name for f in self.fields]}"
        )

    @property
    def field_names(self) -> list[str]:
        """Field names in declaration order."""
        return [f.name for f in self.fields]

    @property
    def hybrid(self) -> bool:
        """Whether some field is generated (the schema is answered in segments)."""
        return any(f.generated for f in self.fields)

    def to_spec(self) -> dict[str, Any]:
        """The canonical, JSON-serialisable description of this schema."""
        return {
            "name": self.name,
            "instructions": self.instructions,
            "fields": [
                {
                    "name": f.name,
                    "kind": f.kind,
                    "description": f.description,
                    "optional": f.optional,
                    "choices": [[c.literal, c.description] for c in f.choices],
                    # only when set, so that the fingerprints of earlier schemas stay the same
                    **({"ordered": True} if f.ordered else {}),
                    **({"reading": f.reading} if f.reading != "each" else {}),
                    **({"depends_on": list(f.depends_on)} if f.depends_on else {}),
                    **(
                        {"choices_by": [f.choices_by[0], [list(a) for a in f.choices_by[1]]]}
                        if f.choices_by
                        else {}
                    ),
                    **({"branch": list(f.branch)} if f.branch else {}),
                    **({"tree": f.tree.to_spec()} if f.tree else {}),
                    **({"generation": _set_keys(dict(vars(f.generation)))} if f.generation else {}),
                }
                for f in self.fields
            ],
            # only when set, so that the fingerprints of schemas without examples stay
            **(
                {"examples": [self._example_spec(e) for e in self.examples]}
                if self.examples
                else {}
            ),
            **({"part_of": self.whole.fingerprint()} if self.whole is not None else {}),
        }

    def _example_spec(self, example: Example) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, a in example.answers:
            choices = self.field(name).choices
            if isinstance(a, Written):
                out[name] = json.loads(a.text)
            else:
                out[name] = (
                    [choices[i].label for i in a] if isinstance(a, tuple) else choices[a].label
                )
        return {"input": example.input, "output": out}

    def fingerprint(self) -> str:
        """A stable SHA-256 of everything that reaches the prompt (16 hex digits)."""
        blob = json.dumps(self.to_spec(), sort_keys=True, ensure_ascii=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def subset(
        self, names: Sequence[str], *, choices: Mapping[str, Sequence[Any]] | None = None
    ) -> Schema:
        """A schema with only `names`, optionally narrowing each field to some labels.

        Examples keep their answers for the kept fields (a multi-label field's kept
        labels); an example whose answer of a narrowed field is not kept is left out, as
        it would show an answer the subset does not allow.
        """
        fields = []
        for n in names:
            f = self.field(n)
            keep = choices.get(n) if choices else None
            if keep is not None and f.generated:
                raise SchemaError(
                    f"{_where(self.name, n)}: a generated field has no choices to narrow to "
                    f"{list(keep)!r}; accepted: narrowing scored fields only.",
                    model=self.name,
                    field=n,
                )
            if keep is not None:
                wanted = list(keep)
                kept = tuple(c for c in f.choices if c.label in wanted)
                if len(kept) < 1 or len(kept) < len(set(map(_literal_text, wanted))):
                    raise SchemaError(
                        f"{_where(self.name, n)}: cannot narrow to {wanted!r}; accepted: a "
                        f"subset of {f.labels}.",
                        model=self.name,
                        field=n,
                    )
                f = replace(f, choices=kept, optional=f.optional and None in wanted)
            fields.append(f)
        fields = _untie(fields, set(choices or ()))
        model = _narrowed_model(f"{self.model.__name__}Subset", self.instructions, fields)
        examples = tuple(
            e for e in (_project(self, fields, ex) for ex in self.examples) if e is not None
        )
        return Schema(self.name, self.instructions, tuple(fields), model, examples)

    @property
    def shown(self) -> Schema:
        """The schema whose prompt this one is asked under: its `whole`, or itself."""
        return self.whole if self.whole is not None else self

    def needs(self, names: Iterable[str]) -> list[str]:
        """`names` and every field their answers depend on, in declaration order.

        A field's answer depends on the parents it `depends_on` (whose answers its pass
        sees written), its `choices_by` parent, its union's discriminator, the fields
        whose answers feed back into its own (a `choices_by` child, whose joint table
        picks the parent's answer, and the fields of a discriminator's branches, which
        pick the branch), and, once some field is generated, every field written before
        it: all fields of the runs before its own, and for a generated field the earlier
        fields of its run too. Each added field brings its own needs.

        Raises:
            KeyError: for a name that is not a field (naming the fields that exist).
        """
        start: dict[str, int] = {}  # where each field's run (scored / generated) starts
        for i, f in enumerate(self.fields):
            same = i > 0 and f.generated == self.fields[i - 1].generated
            start[f.name] = start[self.fields[i - 1].name] if same else i
        todo = list(names)
        keep: set[str] = set()
        while todo:
            name = todo.pop()
            if name in keep:
                continue
            f = self.field(name)
            keep.add(name)
            todo.extend(f.depends_on)
            todo.extend(tie[0] for tie in (f.choices_by, f.branch) if tie is not None)
            i = self.field_names.index(name)
            todo.extend(g.name for g in self.fields[: i if f.generated else start[name]])
            for g in self.fields:  # a child or a branch field picks this field's answer
                if any(tie is not None and tie[0] == name for tie in (g.choices_by, g.branch)):
                    todo.append(g.name)
        return [f.name for f in self.fields if f.name in keep]

    def part(self, names: Iterable[str]) -> Schema:
        """The fields `names`, with what they need (`needs`), asked under this schema's
        whole prompt: each kept field gets the distribution and answer `decide` gives it
        for this schema, and the fields left out cost nothing (no candidate is scored, no
        value generated). A part of a part is a part of the same whole.

        Its `model` holds only the kept fields (flat, like `subset`'s); its `examples`
        are the whole's, answering the kept fields. When every field is needed, the
        whole schema itself is returned.

        Raises:
            KeyError: for a name that is not a field (naming the fields that exist).
        """
        whole = self.shown
        wanted = list(names)
        for n in wanted:
            self.field(n)
        keep = whole.needs(wanted)
        if len(keep) == len(whole.fields):
            return whole
        fields = tuple(whole.field(n) for n in keep)
        model = _narrowed_model(f"{whole.model.__name__}Part", whole.instructions, fields)
        examples = tuple(
            e for e in (_project(whole, fields, ex) for ex in whole.examples) if e is not None
        )
        return Schema(whole.name, whole.instructions, fields, model, examples, whole=whole)

    def build(self, values: Mapping[str, Any]) -> BaseModel:
        """Validates native field values into an instance of the schema's model.

        Dotted names (`customer.tier`) are nested back into their models, unless the model
        itself has the dotted field (a narrowed subset is flat).
        """
        data = dict(values)
        for f in self.fields:  # a union keeps the fields of the branch it answered
            if f.branch is not None and f.name in data:
                kind, index = f.branch
                taken = data.get(kind) == self.field(kind).choices[index].value
                value = data.pop(f.name)
                if taken and f.name not in self.model.model_fields:
                    data[f.key] = value
                elif taken:
                    data[f.name] = value
        if any("." in k and k not in self.model.model_fields for k in data):
            data = unflatten(data)
        return self.model.model_validate(data)


@lru_cache(maxsize=256)
def value_adapter(gen: Generation, optional: bool = False) -> TypeAdapter[Any]:
    """The (cached) Pydantic validator of a generated field's value."""
    return TypeAdapter(python_type(gen, optional))


def _untie(fields: list[FieldSpec], narrowed: set[str]) -> list[FieldSpec]:
    """A subset's fields without ties to fields left out or narrowed (whose choice
    indices the ties refer to): those answers are fixed elsewhere (a cascade's stage)."""
    kept = {f.name for f in fields}
    out = []
    for f in fields:
        deps = tuple(p for p in f.depends_on if p in kept)
        by = f.choices_by
        if by is not None and (by[0] not in kept or by[0] in narrowed or f.name in narrowed):
            by = None
            deps = tuple(p for p in deps if p != f.choices_by[0])  # type: ignore[index]
        branch = f.branch if f.branch is not None and f.branch[0] in kept - narrowed else None
        if branch is None and f.branch is not None:
            deps = tuple(p for p in deps if p != f.branch[0])
        out.append(replace(f, depends_on=deps, choices_by=by, branch=branch))
    return out


def _project(schema: Schema, fields: Sequence[FieldSpec], example: Example) -> Example | None:
    """An example's answers re-indexed onto a subset's fields; None if one is not kept."""
    answers: list[tuple[str, Answer]] = []
    for f in fields:
        a = example.answer(f.name)
        if a is None:
            continue
        old = schema.field(f.name).choices
        kept = [c.label for c in f.choices]
        if isinstance(a, Written):  # a generated field is never narrowed
            answers.append((f.name, a))
        elif isinstance(a, tuple):
            answers.append(
                (f.name, tuple(kept.index(old[i].label) for i in a if old[i].label in kept))
            )
        elif old[a].label in kept:
            answers.append((f.name, kept.index(old[a].label)))
        else:
            return None
    return Example(example.input, tuple(answers))


def _narrowed_model(name: str, doc: str, fields: Sequence[FieldSpec]) -> type[BaseModel]:
    """A Pydantic model accepting exactly the given fields' candidate values.

    A union branch's field is None when its branch was not taken (`Schema.build` leaves
    it out)."""
    defs: dict[str, Any] = {}
    for f in fields:
        tp: Any
        if f.generation is not None:
            tp = python_type(f.generation, f.optional)
        else:
            values = tuple(c.value for c in f.choices)
            tp = Literal[values] if values else bool
            if f.kind == "multilabel":
                tp = list[tp]
        desc = f.description or None
        if f.branch is not None:
            defs[f.name] = (tp | None, PydField(default=None, description=desc))
        else:
            defs[f.name] = (tp, PydField(description=desc))
    return create_model(name, __doc__=doc or None, **defs)


def _where(model: str, name: str) -> str:
    return f"{model}.{name}"


def _literal_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def iter_labels(spec: FieldSpec) -> Iterable[Any]:
    """The JSON labels of a field's candidates."""
    return (c.label for c in spec.choices)
