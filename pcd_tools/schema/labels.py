"""Large label sets and taxonomies: `Labels`, and a tree of labels as one field.

A single-choice field takes any number of values (`Literal[tuple(values)]`, an `Enum`, a
JSON schema `enum`): the token trie scores them exactly and certified pruning reads a
large one in a fraction of its positions. `Labels` builds that annotation for lists kept
in files (`Labels.from_file`: CSV or JSON with a value, an optional description and an
optional parent), with the descriptions attached.

With parents, the labels are a **taxonomy**: the answer is a leaf, and the model writes
its path from the top level down (`"Manufacturing > Food Manufacturing > Bakeries"`), so
the field's trie branches level by level. The pruned search then bounds a whole subtree
by its top node's probability, which is certified pruning across levels, and the result
carries each level's probability (`FieldResult.path`): the conditional probabilities
along the path multiply to the leaf's.

A taxonomy travels in the field's `json_schema_extra` as plain JSON::

    {"taxonomy": {"parents": [[child, parent], ...], "separator": " > ",
                  "top": [top-level labels, in order], "decide": "path" | "leaf",
                  "descriptions": [[node, text], ...]}}

so a Pydantic model that uses one still has a JSON schema.
"""

from __future__ import annotations

import csv
import enum
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from ..errors import (
    DuplicateChoiceError,
    InvalidChoiceError,
    SchemaError,
    TooFewChoicesError,
    UnknownParentError,
)
from .spec import Choice, Taxonomy, _where

__all__ = ["Labels", "Taxonomy", "TaxonomyCycleError", "taxonomy_choices"]

SEPARATOR = " > "


class TaxonomyCycleError(SchemaError):
    """A taxonomy's parents form a cycle (a label is its own ancestor)."""


def _node_key(v: Any) -> str:
    return json.dumps(v.value if isinstance(v, enum.Enum) else v)


def _root_chain(
    start: str, parent: Mapping[str, str], names: Mapping[str, Any], where: str, **err: Any
) -> list[str]:
    """`start` and its ancestors up to the top (node keys), nearest first.

    Raises:
        TaxonomyCycleError: when the walk comes back to a node, naming the cycle.
    """
    chain, seen = [start], {start}
    while chain[-1] in parent:
        up = parent[chain[-1]]
        if up in seen:
            loop = [names.get(k, k) for k in (*chain[chain.index(up) :], up)]
            raise TaxonomyCycleError(
                f"{where}: the parents form a cycle: {' -> '.join(repr(x) for x in loop)}; "
                "accepted: a tree (no label is its own ancestor).",
                **err,
            )
        seen.add(up)
        chain.append(up)
    return chain


def taxonomy_choices(
    model: str, name: str, choices: list[Choice], raw: Any
) -> tuple[list[Choice], Taxonomy]:
    """A field's leaf choices rewritten to be written as their paths, and the tree.

    Args:
        choices: The field's leaves (a `null` candidate, if any, is left as it is).
        raw: `json_schema_extra["taxonomy"]`: `{"parents": [[child, parent], ...]}`, with
            optional `"separator"` and `"descriptions"` (`[[node, text], ...]`).

    Raises:
        SchemaError: for a malformed `taxonomy` entry, a label that is both a leaf and a
            parent, or an internal node listed twice with different parents.
        UnknownParentError: when a leaf has no path to the top (a parent never declared
            is a top-level node, so this is a leaf missing from `parents`' reach).
        TaxonomyCycleError: when the parents form a cycle.
    """
    where = _where(model, name)
    if not isinstance(raw, Mapping) or not isinstance(raw.get("parents"), (list, tuple)):
        raise SchemaError(
            f"{where}: json_schema_extra['taxonomy'] is {raw!r}; accepted: "
            '{"parents": [[child, parent], ...], "separator": " > "} (as Labels builds it).',
            model=model,
            field=name,
        )
    decide = raw.get("decide", "path")
    if decide not in ("path", "leaf"):
        raise SchemaError(
            f"{where}: taxonomy decide={decide!r}; accepted: 'path' (level by level, the "
            "default) or 'leaf' (the most probable leaf of the whole tree).",
            model=model,
            field=name,
        )
    sep = raw.get("separator", SEPARATOR)
    if not isinstance(sep, str) or not sep.strip():
        raise SchemaError(
            f"{where}: taxonomy separator {sep!r}; accepted: a non-blank string such as ' > '.",
            model=model,
            field=name,
        )
    parent: dict[str, Any] = {}
    node_of: dict[str, Any] = {}
    for pair in raw["parents"]:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise SchemaError(
                f"{where}: taxonomy parents entry {pair!r}; accepted: [child, parent] pairs.",
                model=model,
                field=name,
            )
        child, up = pair
        key = _node_key(child)
        if key in parent and parent[key] != _node_key(up):
            raise SchemaError(
                f"{where}: taxonomy label {child!r} has two parents ({node_of[parent[key]]!r} "
                f"and {up!r}); accepted: one parent per label (a tree).",
                model=model,
                field=name,
            )
        parent[key] = _node_key(up)
        node_of[key] = child
        node_of.setdefault(_node_key(up), up)
    leaves = {_node_key(c.value) for c in choices if c.value is not None}
    inner = set(parent.values())
    both = leaves & inner
    if both:
        shown = sorted(node_of[k] for k in both)[:5]
        raise SchemaError(
            f"{where}: {len(both)} taxonomy label(s) are both an answer and a parent (e.g. "
            f"{', '.join(repr(s) for s in shown)}); accepted: answers are the tree's leaves.",
            model=model,
            field=name,
        )
    descs: list[tuple[Any, str]] = []
    for pair in raw.get("descriptions", ()) or ():
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not isinstance(pair[1], str):
            raise SchemaError(
                f"{where}: taxonomy descriptions entry {pair!r}; accepted: [node, text] pairs.",
                model=model,
                field=name,
            )
        descs.append((pair[0], pair[1]))
    out: list[Choice] = []
    paths: list[tuple[Any, ...]] = []
    top: dict[str, Any] = {}
    for c in choices:
        if c.value is None:
            out.append(c)
            paths.append(())
            continue
        chain = _root_chain(_node_key(c.value), parent, node_of, where, model=model, field=name)
        if len(chain) == 1:
            raise UnknownParentError(
                f"{where}: the answer {c.label!r} has no parent in the taxonomy; accepted: "
                "every answer (leaf) listed with its parent in 'parents'.",
                model=model,
                field=name,
            )
        nodes = (*(node_of[k] for k in reversed(chain[1:])), c.label)
        top.setdefault(chain[-1], node_of[chain[-1]])
        text = sep.join(str(n.value if isinstance(n, enum.Enum) else n) for n in nodes)
        paths.append(nodes)
        out.append(Choice(c.value, json.dumps(text, ensure_ascii=False), c.label, c.description))
    seen_text: dict[str, Any] = {}
    for c in out:
        if c.literal in seen_text:
            raise DuplicateChoiceError(
                f"{where}: the taxonomy answers {seen_text[c.literal]!r} and {c.label!r} are "
                f"written the same ({c.literal}); accepted: distinct paths.",
                model=model,
                field=name,
            )
        seen_text[c.literal] = c.label
    order = raw.get("top")
    if order is not None:  # the top level in the label set's own order (as Labels gives it)
        keys = [_node_key(v) for v in order] if isinstance(order, (list, tuple)) else None
        if keys is None or set(keys) != set(top):
            raise SchemaError(
                f"{where}: taxonomy 'top' is {order!r}; accepted: a list of exactly the "
                f"top-level labels ({sorted(map(str, top.values()))[:5]}...).",
                model=model,
                field=name,
            )
        top = {k: top[k] for k in keys}
    return out, Taxonomy(sep, tuple(paths), tuple(top.values()), tuple(descs), decide)


@dataclass(frozen=True)
class Labels:
    """A set of labels for one field: values, optional descriptions, optional parents.

    Build it from a file (`from_file`) or in code (`Labels(values, ...)`), then use
    `labels.type` as the field's annotation::

        REGIONS = Labels.from_file("regions.csv")

        class Address(BaseModel):
            region: REGIONS.type = Field(description="The address's region")

    Args:
        values: The labels (str or int), in order; with parents, every node of the tree
            (the answers are its leaves, in this order).
        descriptions: Label -> description (shown to the model where the label is listed).
        parents: Label -> its parent label; empty for a flat set.
        separator: What joins the levels of a taxonomy's written path.
        decide: How a taxonomy is answered: `"path"` (level by level, the default) or
            `"leaf"` (the most probable leaf of the whole tree).
    """

    values: tuple[Any, ...]
    descriptions: Mapping[Any, str] = field(default_factory=dict)
    parents: Mapping[Any, Any] = field(default_factory=dict)
    separator: str = SEPARATOR
    decide: str = "path"

    def __post_init__(self) -> None:
        vals = tuple(self.values)
        object.__setattr__(self, "values", vals)
        if not vals:
            raise TooFewChoicesError("Labels: no values given; accepted: at least one label.")
        seen: set[str] = set()
        for v in vals:
            if isinstance(v, bool) or not isinstance(v, (str, int)):
                raise InvalidChoiceError(
                    f"Labels: value {v!r} of type {type(v).__name__}; accepted: str or int."
                )
            if isinstance(v, str) and not v.strip():
                raise InvalidChoiceError(f"Labels: empty value {v!r}; accepted: non-empty text.")
            k = _node_key(v)
            if k in seen:
                raise DuplicateChoiceError(
                    f"Labels: value {v!r} is listed twice; accepted: distinct values."
                )
            seen.add(k)
        for child, up in self.parents.items():
            if _node_key(child) not in seen:
                raise UnknownParentError(
                    f"Labels: parents names {child!r}, which is not a value; accepted: "
                    "parents of listed values."
                )
            if up is not None and _node_key(up) not in seen:
                raise UnknownParentError(
                    f"Labels: the parent {up!r} of {child!r} is not a value; accepted: "
                    "parents that are listed values too."
                )
        if self.parents:
            self._check_tree()

    def _check_tree(self) -> None:
        parent = {_node_key(c): _node_key(p) for c, p in self.parents.items() if p is not None}
        names = {_node_key(v): v for v in self.values}
        for start in parent:
            _root_chain(start, parent, names, "Labels")

    @property
    def is_tree(self) -> bool:
        """Whether the labels have parents (a taxonomy)."""
        return any(p is not None for p in self.parents.values())

    @property
    def leaves(self) -> tuple[Any, ...]:
        """The answers: every value for a flat set; a tree's labels without children."""
        if not self.is_tree:
            return self.values
        inner = {_node_key(p) for p in self.parents.values() if p is not None}
        return tuple(v for v in self.values if _node_key(v) not in inner)

    def __len__(self) -> int:
        return len(self.leaves)

    @property
    def type(self) -> Any:
        """The field annotation: `Literal[leaves]` carrying the descriptions (and, for a
        tree, the taxonomy) in its `json_schema_extra`."""
        leaves = self.leaves
        extra: dict[str, Any] = {}
        descs = {v: d for v, d in self.descriptions.items() if d}
        leaf_keys = {_node_key(v) for v in leaves}
        leaf_set = set(leaves)
        leaf_descs = {v: d for v, d in descs.items() if _node_key(v) in leaf_keys}
        if leaf_descs:
            extra["choice_descriptions"] = leaf_descs
        if self.is_tree:
            extra["taxonomy"] = {
                "parents": [[c, p] for c, p in self.parents.items() if p is not None],
                "separator": self.separator,
                "decide": self.decide,
                "top": [
                    v for v in self.values if self.parents.get(v) is None and v not in leaf_set
                ],
                **(
                    {
                        "descriptions": [
                            [v, d] for v, d in descs.items() if _node_key(v) not in leaf_keys
                        ]
                    }
                    if len(leaf_descs) < len(descs)
                    else {}
                ),
            }
        from pydantic import Field

        lit: Any = Literal[leaves]
        return Annotated[lit, Field(json_schema_extra=extra)] if extra else lit

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike[str],
        *,
        value: str = "value",
        description: str = "description",
        parent: str = "parent",
        separator: str = SEPARATOR,
        decide: str = "path",
    ) -> Labels:
        """Reads labels from a CSV file (a header row naming the columns) or a JSON file
        (a list of objects, or of plain values).

        Args:
            path: A `.csv` or `.json` file.
            value: The column (key) holding each label; required.
            description: The column of descriptions; optional, may be empty per row.
            parent: The column of parent labels; optional, empty for a top-level label.
                With parents the labels are a taxonomy and the answers are its leaves.
            separator: What joins a taxonomy's levels in the written path.
            decide: How a taxonomy is answered (see `Labels`).

        Raises:
            InvalidChoiceError: when the file cannot be read as labels (no such column,
                an unknown extension, an empty or non-text value).
            DuplicateChoiceError / UnknownParentError / TaxonomyCycleError: as `Labels`.
        """
        p = Path(path)
        if not p.is_file():
            raise InvalidChoiceError(f"Labels.from_file: {str(p)!r} is not a file.")
        suffix = p.suffix.lower()
        rows: list[Mapping[str, Any]]
        if suffix == ".csv":
            with p.open(newline="", encoding="utf-8-sig") as fh:
                reader = csv.DictReader(fh)
                if reader.fieldnames is None or value not in reader.fieldnames:
                    raise InvalidChoiceError(
                        f"Labels.from_file: {p.name} has no {value!r} column (columns: "
                        f"{reader.fieldnames}); accepted: a header row with {value!r} and "
                        f"optional {description!r} and {parent!r}."
                    )
                rows = list(reader)
        elif suffix == ".json":
            try:
                data = json.loads(p.read_text(encoding="utf-8"))
            except ValueError as e:
                raise InvalidChoiceError(f"Labels.from_file: {p.name} is not JSON: {e}") from e
            if not isinstance(data, list):
                raise InvalidChoiceError(
                    f"Labels.from_file: {p.name} holds a {type(data).__name__}; accepted: a "
                    f"list of objects with {value!r} (and optional {description!r}, {parent!r}) "
                    "or a list of values."
                )
            rows = [r if isinstance(r, Mapping) else {value: r} for r in data]
        else:
            raise InvalidChoiceError(
                f"Labels.from_file: {p.name} has extension {suffix!r}; accepted: .csv or .json."
            )
        return cls._from_rows(rows, value, description, parent, separator, p.name, decide)

    @classmethod
    def _from_rows(
        cls,
        rows: Iterable[Mapping[str, Any]],
        value: str,
        description: str,
        parent: str,
        separator: str,
        source: str,
        decide: str = "path",
    ) -> Labels:
        values: list[Any] = []
        descs: dict[Any, str] = {}
        parents: dict[Any, Any] = {}
        for i, row in enumerate(rows, start=1):
            if value not in row:
                raise InvalidChoiceError(
                    f"Labels.from_file: {source} item {i} has no {value!r}; accepted: every "
                    f"item with a {value!r}."
                )
            v = row[value]
            if isinstance(v, str):
                v = v.strip()
            values.append(v)
            d = row.get(description)
            if isinstance(d, str) and d.strip():
                descs[v] = d.strip()
            up = row.get(parent)
            if isinstance(up, str):
                up = up.strip() or None
            if up is not None:
                parents[v] = up
        # a CSV's parents are text: match them to int values written the same
        by_text = {str(v): v for v in values}
        parents = {c: by_text.get(str(u), u) for c, u in parents.items()}
        return cls(tuple(values), descs, parents, separator, decide)
